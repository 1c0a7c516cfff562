"""The real stack as processes, for end-to-end runs: scripted inference, a rollout service on a SQLite store,
and gateway nodes pulling sessions from it (all `python -m lodestar_app.cli.main ... serve`), on the test
session's etcd. Tests create runs through the `lodestar run` CLI and read groups with StreamGroups.

    with NodeStack.start(tmp, etcd, prefix, script={...}, nodes=2) as stack:
        run_id = stack.create_run(spec_dict)
        stack.wait_run(run_id)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.v1 import gateway_pb2, gateway_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import child_env, free_port
from lodestar_inference.tiny_model import TinyModelSpec, build

REPO = Path(__file__).resolve().parents[2]
AGENT = ["{python}", "{repo}/examples/agent/agent.py", "{prompt}"]
CHECK_OUT_TXT = (
    'expected=$(python3 -c \'import json, os; print(json.loads(os.environ["LODESTAR_TASK_METADATA"])["expected"])\'); '
    'test "$(cat out.txt)" = "$expected"'
)
"""A command verifier's score step: reward 1 when the workspace's out.txt holds the task's metadata `expected`."""


def out_txt_spec(kind: str, expected: list[str], group_size: int) -> dict[str, Any]:
    """A run spec (JSON mapping) in which harness `kind` writes out.txt with its shell tool: one task per entry of
    `expected`, scored by CHECK_OUT_TXT."""
    tasks = [
        {"taskId": f"{kind}-{i}", "prompt": "Write hi into out.txt with the shell tool.", "metadata": {"expected": e}}
        for i, e in enumerate(expected)
    ]
    return {
        "name": kind,
        "tasks": tasks,
        "groupSize": group_size,
        "harness": {"kind": kind, "model": "lodestar-tiny"},
        "verifier": {"kind": "command", "config": {"score": CHECK_OUT_TXT, "timeout_s": 30}},
        "earlyStopFraction": 1.0,
        "maxAttempts": 2,
        "sessionTimeout": "300s",
        "agentTimeout": "240s",
    }


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            env = child_env(self.name)  # as lodestar_app.local starts them
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise AssertionError(f"{self.name} exited {self.process.returncode}:\n{self.tail()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise AssertionError(f"{self.name} not SERVING within {timeout} s:\n{self.tail()}")

    def wait_listening(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.name} not listening within {timeout} s:\n{self.tail()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class NodeStack:
    root: Path
    etcd: str
    prefix: str
    inference: Service
    rollout: Service
    nodes: list[Service] = field(default_factory=list)
    node_settings: dict[str, str] = field(default_factory=dict)
    standby: Service | None = None
    """A second rollout instance on the same store (waits as standby), when started with standby=True."""

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        root: Path,
        etcd: str,
        prefix: str,
        *,
        script: dict[str, Any],
        nodes: int = 2,
        standby: bool = False,
        **node_settings: Any,
    ) -> Iterator[NodeStack]:
        root.mkdir(parents=True, exist_ok=True)
        model = build(root / "model", TinyModelSpec())
        (root / "script.json").write_text(json.dumps(script))
        cli = [sys.executable, "-m", "lodestar_app.cli.main"]
        port = free_port()
        inference = Service(
            "inference",
            [*cli, "inference", "serve", "--port", str(port), "--backend", "scripted", "--model", str(model),
             "--script", str(root / "script.json"), "--max-new-tokens", "512", "--log-json"],
            port, root / "inference.log",
        )  # fmt: skip
        rollout, second = (cls._rollout(cli, root, etcd, prefix, name) for name in ("rollout", "rollout-standby"))
        stack = cls(root, etcd, prefix, inference, rollout, node_settings={k: str(v) for k, v in node_settings.items()})
        try:
            for service in (inference, rollout):
                service.start()
            for service in (inference, rollout):
                service.wait_serving()
            if standby:
                stack.standby = second
                second.start()
                second.wait_listening()
            for _ in range(nodes):
                stack.add_node()
            yield stack
        finally:
            for service in [*stack.nodes, rollout, second, inference]:
                service.stop()

    # Leases: leader TTL 4 s, node lease 5 s. With 2 s / 3 s, etcd keepalives missed on a machine at load 15-20
    # made leadership flap and nodes lose sessions ("ownership key deleted") in otherwise healthy runs.
    @staticmethod
    def _rollout(cli: list[str], root: Path, etcd: str, prefix: str, name: str) -> Service:
        port = free_port()
        return Service(
            name,
            [*cli, "rollout", "serve", "--port", str(port), "--etcd", etcd, "--etcd-prefix", prefix,
             "--store", str(root / "rollout.sqlite"), "--leader-ttl-s", "4", "--log-json"],
            port, root / f"{name}.log",
        )  # fmt: skip

    def fail_over(self) -> float:
        """SIGKILL the rollout leader; returns the seconds until the standby serves (and is `rollout`)."""
        assert self.standby is not None
        self.rollout.stop(signal.SIGKILL)
        killed = time.monotonic()
        self.standby.wait_serving(timeout=30)
        self.rollout, self.standby = self.standby, self.rollout
        return time.monotonic() - killed

    def add_node(self) -> Service:
        node = self._node(len(self.nodes))
        self.nodes.append(node)
        return node

    def restart_node(self, index: int) -> Service:
        """A new process for node `index` (same id and data directory), after the old one is gone."""
        return self._node(index)

    def _node(self, index: int) -> Service:
        port = free_port()
        settings = {
            "slots": "2", "ready-buffer": "1", "poll-interval-s": "0.2", "etcd-lease-ttl-s": "5",
            **self.node_settings,
        }  # fmt: skip
        argv = [
            sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--port", str(port), "--http-port", "0",
            "--inference", self.inference.address, "--rollout", self.rollout_addresses, "--etcd", self.etcd,
            "--etcd-prefix", self.prefix, "--node-id", f"node-{index}", "--data-dir", str(self.root / f"node-{index}"),
            "--log-json",
        ]  # fmt: skip
        for key, value in settings.items():
            argv += [f"--{key}", value]
        node = Service(f"node-{index}", argv, port, self.root / f"node-{index}.log")
        node.start()
        node.wait_serving()
        return node

    @property
    def rollout_addresses(self) -> str:
        return ",".join(s.address for s in (self.rollout, self.standby) if s is not None)

    def set_script(self, script: dict[str, Any]) -> None:
        path = self.root / "script.json"
        path.write_text(json.dumps(script))
        stamp = time.time() + 10
        os.utime(path, (stamp, stamp))

    # Runs ------------------------------------------------------------------------------------------

    def lodestar(self, *argv: str, timeout: float = 60.0) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "lodestar_app.cli.main", *argv], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def create_run(self, spec: dict[str, Any], name: str = "run.yaml") -> str:
        path = self.root / name
        path.write_text(yaml.safe_dump(spec))
        return self.lodestar("run", "create", str(path), "--rollout", self.rollout.address).strip()

    def status(self, run_id: str) -> dict[str, Any]:
        out = self.lodestar("run", "status", run_id, "--json", "--rollout", self.rollout.address)
        status: dict[str, Any] = json.loads(out)
        return status

    def stub(self) -> rollout_pb2_grpc.RolloutServiceStub:
        return rollout_pb2_grpc.RolloutServiceStub(grpc.insecure_channel(self.rollout.address))

    def get_run(self, run_id: str) -> rollout_pb2.Run:
        return self.stub().GetRun(rollout_pb2.GetRunRequest(run_id=run_id), timeout=10).run

    def wait_run(self, run_id: str, timeout: float = 120.0) -> rollout_pb2.Run:
        deadline = time.monotonic() + timeout
        run = rollout_pb2.Run()
        while time.monotonic() < deadline:
            try:
                run = self.get_run(run_id)
            except grpc.RpcError as error:  # a leader change or etcd outage in progress: ask again
                if error.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    raise
            if run.state not in (rollout_pb2.RUN_STATE_RUNNING, rollout_pb2.RUN_STATE_UNSPECIFIED):
                return run
            time.sleep(0.25)
        logs = "\n".join(f"--- {s.name}\n{s.tail(3000)}" for s in [self.rollout, *self.nodes])
        raise AssertionError(f"run {run_id} still running after {timeout} s: {run}\n{logs}")

    def groups(self, run_id: str, timeout: float = 30.0) -> list[rollout_pb2.Group]:
        run = self.get_run(run_id)
        out: list[rollout_pb2.Group] = []
        call = self.stub().StreamGroups(rollout_pb2.StreamGroupsRequest(run_id=run_id), timeout=timeout)
        for reply in call:
            out.append(reply.group)
            if len(out) >= run.groups_complete:
                call.cancel()
                break
        return out

    def node_status(self, node: Service) -> gateway_pb2.GetNodeStatusResponse:
        with grpc.insecure_channel(node.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            return stub.GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=5)

    def store_rows(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Read the rollout store file directly (a second connection to the WAL database)."""
        with contextlib.closing(sqlite3.connect(self.root / "rollout.sqlite", timeout=10)) as db:
            return db.execute(query, args).fetchall()
