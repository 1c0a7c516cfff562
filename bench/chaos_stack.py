"""The chaos run's stack as plain child processes it can SIGKILL, SIGSTOP and restart: three etcd members, two
inference replicas found through etcd, two rollout instances on one SQLite store (a leader and a standby), two
gateway nodes and the trainer (bench/chaos.py).

Every process is `Proc`: its argv, its log file (appended to across restarts, one `# chaos: ...` line per
start) and a timeline of (time, event) entries (start, kill, stop, cont, exit) that the checks read to know
which process was alive when. The trainer restarts through its documented resume path: `--resume` the newest
complete checkpoint directory (`step-NNNNNN`) of its run directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.chaos_task import chaos_spec
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import child_env, find_etcd, free_port
from lodestar_rollout.spec import load_spec_file

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart"
LEASE_TTL_S = 5
"""etcd lease TTL of replicas, nodes' sessions and the rollout leader: a SIGSTOP pause is longer than this."""
CHECKPOINT_EVERY = 3
SERVING = health_pb2.HealthCheckResponse.SERVING
STEP_DIR = re.compile(r"^step-\d{6}$")


@dataclass
class Proc:
    """One child process of the stack, restartable with the same argv."""

    name: str
    kind: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    port: int = 0
    popen: subprocess.Popen[bytes] | None = None
    timeline: list[tuple[float, str]] = field(default_factory=list)
    paused: bool = False

    def start(self, argv: list[str] | None = None) -> None:
        if argv is not None:
            self.argv = argv
        with self.log.open("ab") as out:
            out.write(f"# chaos: start {time.time():.3f} {' '.join(self.argv[-6:])}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env, start_new_session=True
            )
        self.paused = False
        self.timeline.append((time.time(), "start"))

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: signal.Signals, event: str) -> None:
        if self.alive and self.popen is not None:
            os.killpg(self.popen.pid, signum)
            self.timeline.append((time.time(), event))
            self.paused = signum == signal.SIGSTOP

    def signal_stop(self) -> None:
        self.signal(signal.SIGSTOP, "stop")

    def signal_cont(self) -> None:
        if self.paused:
            self.signal(signal.SIGCONT, "cont")

    def kill(self) -> None:
        if self.popen is None:
            return
        if self.alive:
            self.signal_cont()
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.timeline.append((time.time(), "kill"))
        self.popen.wait()

    def terminate(self, grace_s: float = 20.0) -> None:
        """SIGTERM (after SIGCONT), wait, then SIGKILL the whole process group."""
        if self.popen is None:
            return
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGCONT)
                os.killpg(self.popen.pid, signal.SIGTERM)
            self.timeline.append((time.time(), "term"))
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever the service left in its group


def healthy(port: int, timeout: float = 1.0) -> int:
    """The gRPC health status of 127.0.0.1:`port` (health_pb2 enum), -1 when it does not answer."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return -1
        return int(reply.status)


def wait_until(what: str, ready: object, timeout: float, proc: Proc | None = None) -> None:
    """Poll `ready()` until true; raises when `proc` exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        if proc is not None and not proc.alive:
            raise RuntimeError(f"{what} exited (see {proc.log})")
        time.sleep(0.25)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s")


class ChaosStack:
    """The processes of one chaos run under `work` (see the module docstring)."""

    def __init__(self, work: Path, *, slots: int = 4) -> None:
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.model = work / "tiny-model"
        self.store = work / "rollout.sqlite"
        self.run_dir = work / "runs"
        self.slots = slots
        self.procs: dict[str, Proc] = {}
        self.run_id = ""
        ports = [free_port() for _ in range(6)]
        self.etcd_urls = [f"http://127.0.0.1:{ports[i]}" for i in range(3)]
        self._peers = [free_port() for _ in range(3)]
        self.etcd = ",".join(self.etcd_urls)

    def _proc(self, name: str, kind: str, argv: list[str], port: int = 0) -> Proc:
        env = child_env(kind if kind in ("inference", "trainer") else name)
        proc = Proc(name, kind, argv, self.logs / f"{name}.log", env, port)
        self.procs[name] = proc
        return proc

    def of_kind(self, kind: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.kind == kind]

    def start(self, timeout: float = 300.0, *, model: Path | None = None) -> None:
        """Start every process; `model`: a tiny model directory to copy instead of building one."""
        if model is not None:
            shutil.copytree(model, self.model)
        else:
            command = [sys.executable, "-m", "lodestar_app.cli.main", "model", "init-tiny", str(self.model)]
            subprocess.run(command, check=True, capture_output=True, timeout=timeout * 2)
        self._start_etcd(timeout)
        self._start_services(timeout)

    def _start_etcd(self, timeout: float) -> None:
        cluster = ",".join(f"etcd-{i + 1}=http://127.0.0.1:{p}" for i, p in enumerate(self._peers))
        for i, url in enumerate(self.etcd_urls):
            name, peer = f"etcd-{i + 1}", f"http://127.0.0.1:{self._peers[i]}"
            self._proc(name, "etcd", etcd_argv(name, self.work / name, url, peer, cluster)).start()
        for proc, url in zip(self.of_kind("etcd"), self.etcd_urls, strict=True):
            wait_until(proc.name, lambda url=url: etcd_healthy(url), timeout, proc)

    def _start_services(self, timeout: float) -> None:
        ttl = str(LEASE_TTL_S)
        for i in (1, 2):
            port = free_port()
            args = ["--backend", "transformers", "--model", str(self.model), "--replica-id", f"inference-{i}"]
            args += ["--etcd", self.etcd, "--etcd-lease-ttl-s", ttl]
            self._proc(f"inference-{i}", "inference", serve_argv("inference", port, args), port).start()
        for i in (1, 2):
            port = free_port()
            args = ["--etcd", self.etcd, "--store", str(self.store), "--leader-ttl-s", ttl]
            self._proc(f"rollout-{i}", "rollout", serve_argv("rollout", port, args), port).start()
        for proc in self.of_kind("inference"):
            wait_until(proc.name, lambda p=proc: healthy(p.port) == SERVING, timeout, proc)
        wait_until("a rollout leader", lambda: self.leader() is not None, timeout)
        self.run_id = self._create_run()
        self._start_trainer(resume=None)
        for i in (1, 2):
            port = free_port()
            args = ["--http-port", str(free_port()), "--rollout", self.rollout, "--etcd", self.etcd]
            args += ["--inference", self.inference, "--inference-discovery", "etcd"]
            args += ["--data-dir", str(self.work / f"gateway-{i}"), "--slots", str(self.slots), "--ready-buffer", "2"]
            args += ["--node-id", f"gateway-{i}", "--etcd-lease-ttl-s", ttl]
            self._proc(f"gateway-{i}", "gateway", serve_argv("gateway", port, args), port).start()

    @property
    def rollout(self) -> str:
        return ",".join(f"127.0.0.1:{p.port}" for p in self.of_kind("rollout"))

    @property
    def inference(self) -> str:
        return ",".join(f"127.0.0.1:{p.port}" for p in self.of_kind("inference"))

    def leader(self) -> Proc | None:
        """The rollout instance that reports SERVING (the standby reports NOT_SERVING), if any."""
        return next(
            (p for p in self.of_kind("rollout") if p.alive and not p.paused and healthy(p.port) == SERVING), None
        )

    def _create_run(self) -> str:
        spec = chaos_spec(load_spec_file(QUICKSTART / "run.yaml"))
        leader = self.leader()
        assert leader is not None
        with grpc.insecure_channel(f"127.0.0.1:{leader.port}") as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            reply = stub.CreateRun(rollout_pb2.CreateRunRequest(spec=spec), timeout=60.0)
        return str(reply.run.run_id)

    def trainer_config(self) -> Path:
        path = self.work / "trainer.toml"
        text = (QUICKSTART / "quickstart.toml").read_text().split("[trainer]", 1)[1]
        text = re.sub(r"(?m)^stop_after_no_signal_groups = \d+.*$", "stop_after_no_signal_groups = 100000", text)
        text = re.sub(r"(?m)^every = \d+", f"every = {CHECKPOINT_EVERY}", text)
        path.write_text("[trainer]" + text)
        return path

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        found = sorted(p for p in self.checkpoints.glob("step-*") if STEP_DIR.match(p.name) and p.is_dir())
        return found[-1] if found else None

    def _start_trainer(self, resume: Path | None) -> None:
        port = self.procs["trainer"].port if "trainer" in self.procs else free_port()
        args = ["--config", str(self.trainer_config()), "--run", self.run_id, "--model", str(self.model)]
        args += ["--run-dir", str(self.run_dir), "--steps", "0", "--rollout", self.rollout]
        args += ["--inference", self.inference, "--inference-discovery", "etcd", "--etcd", self.etcd]
        args += [] if resume is None else ["--resume", str(resume)]
        argv = serve_argv("trainer", port, args)
        if "trainer" in self.procs:
            self.procs["trainer"].start(argv)
        else:
            self._proc("trainer", "trainer", argv, port).start()

    def restart(self, proc: Proc) -> None:
        """Start `proc` again (the trainer through `--resume` of its newest checkpoint)."""
        if proc.kind == "trainer":
            self._start_trainer(self.latest_checkpoint())
        else:
            proc.start()

    def stop(self) -> None:
        """Stop everything: trainer and nodes first, then rollout and inference, etcd last; the processes of one
        kind at once (each drains in its own time)."""
        order = ["trainer", "gateway", "rollout", "inference", "etcd"]
        for kind in order:
            procs = self.of_kind(kind)
            with ThreadPoolExecutor(max(1, len(procs))) as pool:
                list(pool.map(Proc.terminate, procs))


def serve_argv(command: str, port: int, args: list[str]) -> list[str]:
    """`lodestar COMMAND serve` on `port` with JSON logs (what the checks read), plus `args`."""
    base = [sys.executable, "-m", "lodestar_app.cli.main", command, "serve", "--port", str(port), "--log-json"]
    return [*base, *args]


def etcd_argv(name: str, data_dir: Path, url: str, peer: str, cluster: str) -> list[str]:
    """One etcd member serving `url`, of the cluster `cluster` (name=peer-url,...)."""
    argv = [find_etcd(), "--name", name, "--data-dir", str(data_dir)]
    argv += ["--listen-client-urls", url, "--advertise-client-urls", url]
    argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    argv += ["--initial-cluster", cluster, "--initial-cluster-state", "new"]
    return [*argv, "--initial-cluster-token", "chaos", "--heartbeat-interval", "250", "--election-timeout", "2500"]


def etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as reply:
            return b'"true"' in reply.read()
    except OSError:
        return False
