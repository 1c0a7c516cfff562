"""The `command` and `python` verifiers against an agent that goes for their answer and reward channels, on a
real host runtime in the real bubblewrap sandbox, with real bash and Python. Each agent below was rewarded
1.0 by the verifiers of c160404 (the command got the metadata and the reward file in its environment, the
python verifier's reward was its runner's last stdout line); each now scores what its work deserves, and a
failure its code causes is scored with the lowest reward and its reason, never an infrastructure failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.runtimes import HostBackend, HostRuntime
from lodestar_gateway.node.verifiers import VerifierError, make_verifier
from tests.gateway.node.swe_helpers import runtime_input

FUNCTIONS = "tests.gateway.node.verifier_functions"
EXPECTED = """python3 -c 'import json, os; print(json.loads(os.environ["LODESTAR_TASK_METADATA"])["expected"])'"""
CHECK = f'test "$(cat out.txt)" = "$({EXPECTED})"'
"""Reward 1 when the workspace's out.txt holds the task's metadata `expected` (tests/e2e/node_stack.py's)."""
SPLIT = {"command": "python3 solution.py > out.txt", "score": CHECK}
"""The agent's program writes out.txt; a trusted step checks it."""

READS_ANSWER = """import os, json
meta = os.environ.get("LODESTAR_TASK_METADATA")
print(json.loads(meta)["expected"] if meta else "no answer")
"""
WRITES_REWARD = """import glob, os
targets = [os.environ.get("LODESTAR_REWARD_FILE", "")] + glob.glob(os.environ["TMPDIR"] + "/.lodestar-*/reward")
for target in filter(None, targets):
    open(target, "w").write("1")
print("no answer")
"""
LEAVES_A_DAEMON = """import glob, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # waits for the score step's directory, then writes its reward and answer
        deadline = time.time() + 20
        while time.time() < deadline:
            for found in glob.glob(os.environ["TMPDIR"] + "/.lodestar-score-*/"):
                try:  # whole or not at all (a truncating write could be read empty between its two halves)
                    open(found + "forged", "w").write("1")
                    os.replace(found + "forged", found + "reward")
                except OSError:
                    pass
            time.sleep(0.02)
    os._exit(0)
print("no answer")
"""
SHADOWS_JSON = """import os
target = os.environ.get("LODESTAR_REWARD_FILE")
if target:
    open(target, "w").write("1")
def loads(text):
    return {"expected": open("out.txt").read().strip()}
"""
USER_SITE_PTH = 'import os; t = os.environ.get("LODESTAR_REWARD_FILE"); t and open(t, "w").write("1")\n'
PRINTS_AND_EXITS = """import os
print('{"reward": 1.0}', flush=True)
os._exit(0)
"""
READS_THE_RUNNERS_FILES = """import json, os, stat
parent, found = os.getppid(), []
try:
    for arg in open(f"/proc/{parent}/cmdline").read().split("\\0"):
        if arg.endswith(".json"):
            found.append(json.load(open(arg))["task"]["metadata"]["expected"])
except OSError as error:
    found.append(type(error).__name__)
try:
    for name in os.listdir(f"/proc/{parent}/fd"):  # the runner's files (the node's result channel)
        if stat.S_ISREG(os.stat(f"/proc/{parent}/fd/{name}").st_mode):
            with open(f"/proc/{parent}/fd/{name}", "a") as channel:
                channel.write('{"reward": 1.0}\\n')
except OSError as error:
    found.append(type(error).__name__)
print(found[0] if found else "no answer")
"""


@pytest.fixture
async def sandboxed(tmp_path: Path) -> AsyncIterator[Any]:
    """Makes sandboxed host runtimes with the given workspace files (cleaned up after the test)."""
    backend = HostBackend(tmp_path / "sessions", Launcher(sandbox=Sandbox(hidden=[tmp_path / "sessions"])))
    made: list[HostRuntime] = []

    async def create(files: dict[str, str], backend: HostBackend = backend) -> HostRuntime:
        runtime = await backend.create(f"s{len(made)}-a1", files)
        made.append(runtime)
        return runtime

    yield create
    for runtime in made:
        await runtime.cleanup()


async def _score(runtime: HostRuntime, kind: str, **config: Any) -> tuple[float, dict[str, Any]]:
    task = rollout_pb2.Task(task_id="t1", prompt="p")
    task.metadata.update({"expected": "hi"})
    spec = rollout_pb2.VerifierSpec(kind=kind)
    spec.config.update(config)
    verdict = await make_verifier(spec).score(runtime_input(runtime, task))
    return verdict.reward, verdict.details


async def test_an_honest_program_is_rewarded(sandboxed: Any) -> None:
    runtime = await sandboxed({"solution.py": "print('hi')\n"})
    assert (await _score(runtime, "command", **SPLIT))[0] == 1.0


@pytest.mark.parametrize("agent", [READS_ANSWER, WRITES_REWARD], ids=["reads-answer", "writes-reward"])
async def test_the_agents_code_gets_neither_the_answer_nor_the_reward_file(sandboxed: Any, agent: str) -> None:
    runtime = await sandboxed({"solution.py": agent})
    reward, details = await _score(runtime, "command", **SPLIT)
    assert reward == 0.0, details
    assert (runtime.real.workdir / "out.txt").read_text() == "no answer\n"


@pytest.mark.slow
async def test_a_daemon_of_the_command_step_is_gone_before_the_score_step(sandboxed: Any, tmp_path: Path) -> None:
    runtime = await sandboxed({"solution.py": LEAVES_A_DAEMON})
    assert (await _score(runtime, "command", **SPLIT))[0] == 0.0
    # The control: without the sandbox's PID namespace (nor a mount namespace), the daemon outlives its step.
    bare = HostBackend(tmp_path / "bare", Launcher(isolate_network=False, mount_namespaces=False))
    unsandboxed = await sandboxed({"solution.py": LEAVES_A_DAEMON}, bare)
    assert (await _score(unsandboxed, "command", **SPLIT))[0] == 1.0


@pytest.mark.parametrize("where", ["workspace json.py", "user site .pth"])
async def test_the_score_step_runs_nothing_the_agent_planted(sandboxed: Any, where: str) -> None:
    runtime = await sandboxed({"out.txt": "wrong\n"})
    if where == "workspace json.py":
        (runtime.real.workdir / "json.py").write_text(SHADOWS_JSON)
    else:
        for minor in range(8, 15):
            site = runtime.real.home / ".local" / "lib" / f"python3.{minor}" / "site-packages"
            site.mkdir(parents=True)
            (site / "evil.pth").write_text(USER_SITE_PTH)
    reward, details = await _score(runtime, "command", score=CHECK)
    assert reward == 0.0, details


async def test_a_printed_reward_line_and_an_exit_are_not_a_reward(sandboxed: Any) -> None:
    runtime = await sandboxed({"solution.py": PRINTS_AND_EXITS})
    reward, details = await _score(runtime, "python", function=f"{FUNCTIONS}:imports_solution")
    assert reward == 0.0
    assert "without a result" in details["agent_failure"], details
    assert '{"reward": 1.0}' in details["stdout_tail"], "it did print the line"


async def test_the_agents_program_can_reach_neither_the_input_nor_the_result_channel(sandboxed: Any) -> None:
    runtime = await sandboxed({"solution.py": READS_THE_RUNNERS_FILES})
    reward, details = await _score(runtime, "python", function=f"{FUNCTIONS}:runs_solution")
    assert reward == 0.0, details
    assert list(runtime.real.tmpdir.glob(".lodestar-verifier-*/*")) == [], "input and result were unlinked"


@pytest.mark.parametrize(
    ("agent", "config", "reason"),
    [
        ("raise RuntimeError('broken')\n", {}, "RuntimeError: broken in the agent's code"),
        pytest.param(
            "while True:\n    pass\n", {"timeout_s": 3}, "in 3 s: the agent's code hangs", marks=pytest.mark.slow
        ),
        ("import os\nos._exit(3)\n", {}, "(exit 3) without a result"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", {}, "without a result"),
    ],
    ids=["raises", "hangs", "exits", "killed"],
)
async def test_a_python_verifier_broken_by_the_agents_code_scores_zero(
    sandboxed: Any, agent: str, config: dict[str, Any], reason: str
) -> None:
    runtime = await sandboxed({"solution.py": agent})
    reward, details = await _score(runtime, "python", function=f"{FUNCTIONS}:imports_solution", **config)
    assert reward == 0.0
    assert reason in details["agent_failure"], details


@pytest.mark.slow
async def test_a_python_verifier_that_hangs_on_its_own_is_an_infrastructure_failure(sandboxed: Any) -> None:
    runtime = await sandboxed({})
    with pytest.raises(VerifierError, match="timed out after 3 s"):
        await _score(runtime, "python", function=f"{FUNCTIONS}:hang", timeout_s=3)


async def test_a_score_step_killed_in_the_sandbox_is_an_infrastructure_failure(sandboxed: Any) -> None:
    runtime = await sandboxed({})
    with pytest.raises(VerifierError, match="killed by signal 9"):
        await _score(runtime, "command", command="true", score="kill -9 $$")


async def test_a_python_verifier_reads_the_files_kept_beside_its_module(sandboxed: Any) -> None:
    """The allow-list root shows the verifier's run its module's directory (examples/smollm2-capitals'
    verifier reads capitals.py beside it), and nothing of it to the agent's run."""
    runtime = await sandboxed({})
    reward, details = await _score(runtime, "python", function=f"{FUNCTIONS}:reads_data_beside_it")
    assert reward == 1.0, details
