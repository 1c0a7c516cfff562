"""A 2-step GRPO training run through each real harness (Claude Code, Codex, Qwen Code, Pi, Gemini CLI,
opencode, Continue CLI, Cline; mini-swe-agent, aider, Open Interpreter and the OpenHands SDK agent from their venvs),
driven by `lodestar train CONFIG` against the transformers backend with the tiny model.

One stack for the module (the session's etcd; inference on the transformers backend, a rollout service on
a SQLite store, one gateway node as processes); each test writes a config whose `[train] attach` names that
stack's addresses file, so `lodestar train` starts only a trainer, creates a run of 2 tasks x 2 samples
for its harness and trains 2 steps of one group each. The tiny model writes noise, so the verifier's reward
is noise too (`0.<random>`, two samples practically never tie), and harnesses that continue after a reply
cut at max_tokens (Claude Code does) run until their agent timeout (90 s here), which ends the session
TIMED_OUT, a scored outcome. These tests are about the pipeline through
the real binary — calls captured token-faithfully, steps taken, weights pushed to inference and served, no
session an infrastructure failure — not about learning (the quickstart test is). Each harness's calls go
through its own vendor dialect (Anthropic Messages, OpenAI Responses, OpenAI Chat, Google).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from lodestar.v1 import inference_pb2, inference_pb2_grpc, rollout_pb2
from lodestar_app.local import free_port
from lodestar_gateway.node.harnesses import make_harness
from lodestar_inference.tiny_model import TinyModelSpec, build
from tests.e2e.node_stack import Service
from tests.e2e.train_cli import run_train

pytestmark = [pytest.mark.slow, pytest.mark.harness, pytest.mark.training_e2e]
HARNESSES = [
    ("pi", "pi"),
    ("codex", "codex"),
    ("qwen_code", "qwen_code"),
    ("gemini_cli", "gemini_cli"),
    ("claude_code", "claude_code"),
    ("opencode", "opencode"),
    ("continue_cli", "continue_cli"),
    ("cline", "cline"),
    ("mini_swe_agent", "mini_swe_agent"),
    ("aider", "aider"),
    ("open_interpreter", "open_interpreter"),
    ("openhands", "openhands"),
]
OPTIONAL = {"openhands": "make harnesses-openhands"}
"""Harnesses that `make harnesses` does not install: skipped, not failed, when missing."""
NOISE_REWARD = 'echo "0.$RANDOM" > "$LODESTAR_REWARD_FILE"'
TRAIN_TIMEOUT_S = 1200
MAX_LOGPROB_GAP = 1e-4
"""Mean |trainer - inference| logprob at step 1 (fp32 CPU; Gemini CLI's top_p 0.95 / top_k 64 made it 3.8 nats
before runs enforced their sampling policy)."""
KNOWN_INFRA_FLAKE = "the namespace helper exited before set-up"
"""A gateway-node flake seen under load when several sessions start at once (the helper dies before it
reports; rollout retries the session). Tolerated here, counted in the report; any other is a failure."""


class TrainingStack:
    def __init__(self, root: Path, etcd: str) -> None:
        self.root = root
        self.model = build(root / "model", TinyModelSpec())
        cli = [sys.executable, "-m", "lodestar_app.cli.main"]
        prefix = f"/e2e/{uuid.uuid4().hex}/"
        ports = {name: free_port() for name in ("inference", "rollout", "gateway")}
        self.inference = Service(
            "inference",
            [*cli, "inference", "serve", "--port", str(ports["inference"]), "--backend", "transformers",
             "--model", str(self.model), "--max-new-tokens", "32", "--log-json"],
            ports["inference"], root / "inference.log",
        )  # fmt: skip
        self.rollout = Service(
            "rollout",
            [*cli, "rollout", "serve", "--port", str(ports["rollout"]), "--etcd", etcd, "--etcd-prefix", prefix,
             "--store", str(root / "rollout.sqlite"), "--log-json"],
            ports["rollout"], root / "rollout.log",
        )  # fmt: skip
        self.node = Service(
            "node",
            [*cli, "gateway", "serve", "--port", str(ports["gateway"]), "--http-port", "0",
             "--inference", self.inference.address, "--rollout", self.rollout.address, "--etcd", etcd,
             "--etcd-prefix", prefix, "--node-id", "node-0", "--data-dir", str(root / "node-0"),
             "--slots", "4", "--ready-buffer", "2", "--poll-interval-s", "0.2", "--log-json"],
            ports["gateway"], root / "node-0.log",
        )  # fmt: skip
        self.addresses = root / "addresses.json"

    def start(self) -> None:
        for service in (self.inference, self.rollout):
            service.start()
        for service in (self.inference, self.rollout):
            service.wait_serving(timeout=120)
        self.node.start()
        self.node.wait_serving(timeout=120)
        addresses = {"inference": self.inference.address, "rollout": self.rollout.address, "model": str(self.model)}
        self.addresses.write_text(json.dumps(addresses))

    def stop(self) -> None:
        for service in (self.node, self.rollout, self.inference):
            service.stop()

    def fresh_inference(self) -> None:
        """Restart inference (same port) when it serves trained weights: a new trainer starts from the base
        model at version 0, and inference refuses a policy version older than the one it serves."""
        if self.served_version() == 0:
            return
        self.inference.stop()
        self.inference.start()
        self.inference.wait_serving(timeout=120)

    def served_version(self) -> int:
        with grpc.insecure_channel(self.inference.address) as channel:
            info = inference_pb2_grpc.InferenceServiceStub(channel).GetModelInfo(
                inference_pb2.GetModelInfoRequest(), timeout=10
            )
        return int(info.policy_version.version)

    def get_run(self, run_id: str) -> rollout_pb2.Run:
        from lodestar.v1 import rollout_pb2_grpc

        with grpc.insecure_channel(self.rollout.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            return stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id), timeout=10).run

    def infra_failed_attempts(self, run_id: str) -> list[str]:
        """The error of every INFRA_FAILED attempt of the run's sessions (from the rollout store)."""
        with contextlib.closing(sqlite3.connect(self.root / "rollout.sqlite", timeout=10)) as db:
            rows = db.execute(
                "SELECT error FROM attempts WHERE session_id LIKE ? AND outcome = 'infra_failed'", (f"{run_id}-%",)
            ).fetchall()
        return [str(row[0]) for row in rows]

    def results(self, run_id: str) -> list[rollout_pb2.SessionResult]:
        """Every result the node reported for the run's sessions (from the rollout store)."""
        with contextlib.closing(sqlite3.connect(self.root / "rollout.sqlite", timeout=10)) as db:
            blobs = db.execute("SELECT result FROM results WHERE session_id LIKE ?", (f"{run_id}-%",)).fetchall()
        return [rollout_pb2.SessionResult.FromString(blob) for (blob,) in blobs]

    def harness_output(self, run_id: str) -> str:
        """What the harness printed in every INFRA_FAILED attempt of the run (the results the node reported)."""
        results = self.results(run_id)
        return "\n".join(
            f"--- {r.session_id} attempt {r.attempt}: {r.error}\nstdout: {r.stdout_tail[-2000:]}\n"
            f"stderr: {r.stderr_tail[-2000:]}"
            for r in results
            if r.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED
        )

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.tail(3000)}" for s in (self.inference, self.rollout, self.node))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[TrainingStack]:
    started = TrainingStack(tmp_path_factory.mktemp("harness-training"), etcd_endpoint)
    try:
        started.start()
        yield started
    finally:
        started.stop()


def _config(stack: TrainingStack, kind: str, directory: Path, **harness: object) -> Path:
    tasks = [{"taskId": f"{kind}-{i}", "prompt": "Write hi into out.txt with the shell tool."} for i in range(2)]
    spec: dict[str, object] = {
        "name": f"train-{kind}",
        "tasks": tasks,
        "groupSize": 2,
        "harness": {"kind": kind, "model": "lodestar-tiny", **harness},
        "verifier": {"kind": "command", "config": {"score": NOISE_REWARD, "timeout_s": 30}},
        "earlyStopFraction": 1.0,
        "maxAttempts": 3,
        "maxStaleness": 4,
        "sessionTimeout": "150s",
        "agentTimeout": "90s",
    }
    (directory / "run.yaml").write_text(yaml.safe_dump(spec))
    config = directory / "train.toml"
    config.write_text(
        f"""[train]
spec = "run.yaml"
steps = 2
run_dir = "{directory / "runs"}"
attach = "{stack.addresses}"
timeout_s = {TRAIN_TIMEOUT_S - 60}

[trainer.compute]
seed = 0

[trainer.optimizer]
lr = 0.001

[trainer.batch]
groups_per_step = 1
builder = "tree"

[redteam]
enabled = false  # the noise verifier pays every hack by design: these runs test the pipeline, not it
"""
    )
    return config


def _steps(directory: Path, output: str) -> tuple[str, list[dict[str, float]]]:
    """The run id and the metrics of its two steps."""
    [run_dir] = [p for p in (directory / "runs").iterdir() if p.is_dir()]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2], output
    return run_dir.name, steps


def assert_trained_on_the_sampled_distribution(first: dict[str, float], harness: str, output: str) -> None:
    """At step 1, before any update, the trainer's logprob of every sampled token equals the captured one
    (fp32 on CPU): trainer and inference computed the same distribution, the run's sampling policy."""
    assert first["logprob_diff_mean"] <= MAX_LOGPROB_GAP, (first, output)
    assert first[f"logprob_diff_mean/{harness}"] <= MAX_LOGPROB_GAP, first


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 90)
@pytest.mark.parametrize(("kind", "binary"), HARNESSES)
def test_two_training_steps_through_the_real_harness(stack: TrainingStack, tmp_path: Path, kind: str, binary: str):
    if not make_harness(binary).is_installed():
        if kind in OPTIONAL:
            pytest.skip(f"{make_harness(binary).binary} is not installed (run `{OPTIONAL[kind]}`)")
        pytest.fail(f"{make_harness(binary).binary} is not installed: run `make harnesses`", pytrace=False)
    stack.fresh_inference()
    config = _config(stack, kind, tmp_path)

    returncode, output = run_train(config, tmp_path, TRAIN_TIMEOUT_S)

    assert returncode == 0, f"{output}\n{stack.logs()}"
    run_id, steps = _steps(tmp_path, output)
    assert_trained_on_the_sampled_distribution(steps[0], kind, output)
    versions = [s["policy_version"] for s in steps]
    assert versions[1] == versions[0] + 1, "each step pushed a new policy version"
    assert stack.served_version() == versions[-1], "inference serves the last pushed weights"
    run = stack.get_run(run_id)
    assert run.spec.harness.kind == kind
    assert run.sessions_failed == 0, run
    failed = stack.infra_failed_attempts(run_id)
    unexplained = [error for error in failed if KNOWN_INFRA_FLAKE not in error]
    assert not unexplained, (
        f"sessions failed as infrastructure: {unexplained}\n{stack.harness_output(run_id)}\n{stack.logs()}"
    )
    assert run.sessions_succeeded >= 4, "both groups of two scored"


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 90)
def test_a_harness_asking_for_its_own_temperature_trains_under_the_runs_policy(stack: TrainingStack, tmp_path: Path):
    """The command agent asks for temperature 0.7; the run's policy says 0.8. Every call samples at 0.8 (the
    0.7 is recorded as asked), and the trainer recomputes at 0.8: at step 1 it reproduces the captured logprobs."""
    stack.fresh_inference()
    agent = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples/agent/agent.py")]
    config = _config(
        stack, "command", tmp_path, command=[*agent, "--max-turns", "2", "--temperature", "0.7", "{prompt}"]
    )
    spec = yaml.safe_load((tmp_path / "run.yaml").read_text())
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**spec, "sampling": {"temperature": 0.8}}))

    returncode, output = run_train(config, tmp_path, TRAIN_TIMEOUT_S)

    assert returncode == 0, f"{output}\n{stack.logs()}"
    run_id, steps = _steps(tmp_path, output)
    assert_trained_on_the_sampled_distribution(steps[0], "command", output)
    run = stack.get_run(run_id)
    assert run.spec.sampling.temperature == pytest.approx(0.8)
    calls = [call for result in stack.results(run_id) for call in result.calls]
    assert calls, "the sessions made model calls"
    assert {round(call.sampling.temperature, 4) for call in calls} == {0.8}
    assert {round(call.requested_sampling.temperature, 4) for call in calls} == {0.7}
