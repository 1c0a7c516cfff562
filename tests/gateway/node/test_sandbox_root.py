"""The host runtime's allow-list sandbox against the findings of the security review (issue 38), in real
sessions (a real host runtime, bubblewrap, agents from snoop_agent.py). The host is planted with what a
node's machine holds: a task set with gold patches and test lists, a control-plane token, a TLS key, a
`lodestar up` data dir with its store, a Unix socket under /var/lib, a secret file inside an installation
sessions see (listed hidden), and /etc/shadow. One session walks every file it can see; another tries each
finding one by one (one test per finding reads its result)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Invocation, Launcher
from lodestar_gateway.node.harnesses.base import REPO_ROOT, clean_env
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.runtimes import HostBackend
from tests.gateway.node.snoop_agent import PROBE, WALK

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
DENIED = (errno.EPERM, errno.ENOSYS)


@dataclass
class Planted:
    top: Path
    data_dir: Path
    sessions: Path
    hidden_file: Path
    socket: Path
    markers: list[str]


def _gold_patch_line() -> str:
    """A line of a real gold patch of the checkout's examples (an answer an agent must not find)."""
    task = json.loads((REPO_ROOT / "examples" / "swe-mini" / "tasks.jsonl").read_text().splitlines()[0])
    patch: str = task["metadata"]["gold_patch"]
    return next(line for line in patch.splitlines() if line.startswith("+ "))


@pytest.fixture(scope="module")
def planted() -> Iterator[Planted]:
    nonce = secrets.token_hex(12)
    top = Path(f"/var/lib/lodestar-sandbox-test-{os.getpid()}")
    top.mkdir(mode=0o755)
    data_dir = top / "up-data"  # `lodestar up --data-dir` elsewhere than the working directory
    (data_dir / "tls").mkdir(parents=True)
    (data_dir / "tls" / "tls.key").write_text(f"-----BEGIN PRIVATE KEY-----\nkey-{nonce}\n")
    (top / "token").write_text(f"token-{nonce}\n")
    with sqlite3.connect(data_dir / "rollout.sqlite") as store:
        store.execute("CREATE TABLE tasks (metadata TEXT)")
        store.execute("INSERT INTO tasks VALUES (?)", (json.dumps({"gold_patch": f"store-{nonce}"}),))
    (top / "dataset").mkdir()
    (top / "dataset" / "tasks.jsonl").write_text(
        json.dumps({"metadata": {"gold_patch": f"patch-{nonce}", "FAIL_TO_PASS": [f"test-{nonce}"]}}) + "\n"
    )
    hidden_file = Path(sys.prefix) / f".lodestar-hidden-{os.getpid()}"  # inside an installation sessions see
    hidden_file.write_text(f"hidden-{nonce}\n")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(top / "agent.sock"))
    listener.listen(8)
    os.chmod(top / "agent.sock", 0o777)
    try:
        yield Planted(top, data_dir, top / "sessions", hidden_file, top / "agent.sock",
                      [nonce, _gold_patch_line()])  # fmt: skip
    finally:
        listener.close()
        hidden_file.unlink(missing_ok=True)
        shutil.rmtree(top, ignore_errors=True)


async def _run(
    planted: Planted, name: str, code: str, targets: dict[str, Any], spec: rollout_pb2.RuntimeSpec | None = None
) -> tuple[dict[str, Any], Path]:
    """Run `code` as the harness of a real session; (its JSON output, the session's real workdir)."""
    sandbox = Sandbox(hidden=[planted.data_dir, planted.sessions, planted.hidden_file, Path.cwd() / ".lodestar"])
    runtime = await HostBackend(planted.sessions, Launcher(sandbox=sandbox)).create(name, {}, spec)
    argv = [sys.executable, "-c", code, json.dumps(targets)]
    invocation = Invocation("snoop", argv, clean_env(runtime.visible), runtime.visible.workdir)
    # Nothing listens at the "gateway": the agents make no call.
    result = await runtime.run_harness(runtime.translate(invocation), "http://127.0.0.1:40009", 120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.sandboxed
    return json.loads(result.stdout.strip().splitlines()[-1]), runtime.real.workdir


@pytest.fixture(scope="module")
def probe(planted: Planted) -> dict[str, Any]:
    targets = {"hidden_file": str(planted.hidden_file), "socket": str(planted.socket)}
    found, workdir = asyncio.run(_run(planted, "probe-a1", PROBE, targets))
    found["workdir"] = str(workdir)
    return found


@pytest.mark.slow
async def test_a_session_walking_every_visible_file_finds_no_answer_key_token_store_or_socket(
    planted: Planted,
) -> None:
    found, _ = await _run(planted, "walk-a1", WALK, {"markers": planted.markers})
    assert found["files"] > 10000, f"the walk saw the installations (a real walk): {found['files']} files"
    assert found["hits"] == [], found["hits"]
    assert found["sockets"] == [], found["sockets"]


def test_etc_shadow_and_host_keys_are_not_in_the_root(probe: dict[str, Any]) -> None:
    assert probe["shadow"] is not True
    assert probe["ssh_host_keys"] is not True


@pytest.mark.skipif(not Path("/etc/ssl/openssl.cnf").is_file(), reason="the host has no /etc/ssl/openssl.cnf")
def test_the_system_files_programs_read_are_readable(probe: dict[str, Any]) -> None:
    """/etc/ssl is a directory the session may enter (bubblewrap made it 0700: every node.js harness exited 13)."""
    assert probe["openssl_cnf"] is True, probe["openssl_cnf"]


def test_a_secret_file_in_the_hidden_list_is_hidden(probe: dict[str, Any]) -> None:
    assert probe["hidden_file"] is not True


def test_a_unix_socket_of_the_host_cannot_be_reached(probe: dict[str, Any]) -> None:
    assert probe["socket"] is not True


def test_no_nested_user_namespace(probe: dict[str, Any]) -> None:
    assert probe["nested_userns"] is not True


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe's syscall numbers are x86_64's")
def test_the_seccomp_filter_denies_kernel_interfaces(probe: dict[str, Any]) -> None:
    for name, error in probe["syscalls"].items():
        assert error in DENIED, f"{name}: {os.strerror(error) if error else 'succeeded'}"


@pytest.mark.skipif(os.geteuid() != 0, reason="a setuid file gives root only on a root node")
def test_a_setuid_file_made_in_a_session_gives_no_other_user_root(probe: dict[str, Any]) -> None:
    copy = Path(probe["workdir"]) / "suid-id"
    assert copy.stat().st_uid != 0, "the session is not root outside"
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(copy)], capture_output=True, text=True
    )
    assert "euid=0" not in run.stdout, run.stdout
    assert not run.stdout.startswith("uid=0"), run.stdout
    assert os.stat(Path(probe["workdir"]).parents[1]).st_mode & 0o777 == 0o700, "the sessions dir is private"


def test_pid_1_shows_no_path_of_the_node(probe: dict[str, Any], planted: Planted) -> None:
    options = probe["pid1_cmdline"].split("\0--\0")[0]  # bwrap's own, before the program's argv
    for path in (planted.data_dir, planted.sessions, planted.hidden_file, planted.top):
        assert str(path) not in options, options


def test_the_session_has_a_cgroup_namespace_of_its_own(probe: dict[str, Any]) -> None:
    lines = probe["cgroup"].splitlines()
    assert lines
    assert all(line.endswith(":/") for line in lines), probe["cgroup"]


async def test_the_runtime_specs_limits_apply(planted: Planted) -> None:
    spec = rollout_pb2.RuntimeSpec(pids_limit=24, memory_bytes=4 << 30, disk_bytes=1 << 30)
    targets = {"hidden_file": str(planted.hidden_file), "socket": str(planted.socket), "spawn": 40}
    found, _ = await _run(planted, "limits-a1", PROBE, targets, spec)
    limits = {line[:26].strip(): line[26:].split()[:2] for line in found["limits"].splitlines()[1:]}
    assert limits["Max processes"] == ["24", "24"]
    assert 10 < found["spawned"] < 24, found["spawned"]  # the session's own processes count, not the node's
    assert limits["Max address space"] == [str(4 << 30)] * 2
    assert limits["Max file size"] == [str(1 << 30)] * 2
    assert limits["Max core file size"] == ["0", "0"]


async def test_a_command_harness_program_is_visible_but_not_the_files_beside_it(tmp_path: Path) -> None:
    program = tmp_path / "agent" / "agent.py"  # below /tmp, which is an empty tmpfs in the sandbox
    program.parent.mkdir()
    (program.parent / "tasks.jsonl").write_text(json.dumps({"metadata": {"gold_patch": "the answer"}}) + "\n")
    program.write_text(
        "import os, sys\n"
        f"print(os.path.exists({str(program.parent / 'tasks.jsonl')!r}), os.listdir(os.path.dirname(sys.argv[0])))\n"
    )
    harness = Command(["{python}", str(program), "{prompt}"])
    runtime = await HostBackend(tmp_path / "sessions", Launcher(sandbox=Sandbox())).create("command-a1", {})
    endpoint = GatewayEndpoint("http://127.0.0.1:40009", "key", "model")
    invocation = runtime.translate(harness.prepare(runtime.real, endpoint, "the prompt"))
    result = await runtime.run_harness(invocation, endpoint.base_url, 60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False ['agent.py']"
