"""The `docker` runtime: a fresh container per session attempt, from the task's image (else the run's).

INIT: the session's private root `<sessions_dir>/<name>/{home,tmp,work}` is staged on the node (task files
in `work`; a tmpfs of `disk_bytes` when the run sets one) and a container is started from the image with
that root bind-mounted on the fixed root (`/tmp/lodestar-session`), running as an unprivileged user (uid
65532 on a root node, the node's own uid otherwise; never root, every capability dropped), the node's
harness install mounted
read-only at its own paths (`node_install`) with the run's options.mounts when the node allows them
(`allowed_mounts`: a mount outside the node's --docker-mounts-allowed fails the session), `--network
none`, the RuntimeSpec's CPU, memory and pids limits, labels naming the node, its sessions directory and
the session, and `sleep infinity` under `--init` as its only process. The session then waits in READY
with its container running.

RUN: the node gives the session's private root (task files, repository, harness config) to the session's
user (before any session process could plant a link in it), then `docker exec`s the translated harness,
as that user. The container has no network but loopback: the node binds
a listener on the gateway's loopback address and port *inside* the container's network namespace
(`nsenter --net` + `harnesses/netns_child.py`) and relays each connection to the real gateway
(`GatewayRelay`), so the harness sees its usual base URL and nothing else is reachable. When the harness
exits or its time is up, the container is killed (every process in it, background tools included) and the
cgroup counters tell whether a limit was hit.

POST: each verifier process `docker exec`s in the same container, restarted for it and killed after it
(same files, no process of the harness or of an earlier verifier step left: the command verifier's score
step must not share the container with what its command step started), as the same user; the directories
the node makes for them are given to that user.
Cleanup (every exit path): `docker rm -f`, then the private root. A node killed with SIGKILL loses its
containers at once (a reaper child with PR_SET_PDEATHSIG removes every container labelled with the node's
sessions directory), and a node that starts removes any such container left behind.

What a container is made of (its `docker run` argv, options, PATH, limit counters) is in `docker_spec.py`;
every docker command goes through `docker_cli.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodestar.docker_refs import check_image
from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import HarnessResult, Invocation, RunDirs
from lodestar_gateway.node.harnesses.base import clean_env
from lodestar_gateway.node.harnesses.netns import (
    CHILD_SCRIPT,
    DEFAULT_RELAY_CONNECTIONS,
    GatewayRelay,
    gateway_address,
    receive_setup,
)
from lodestar_gateway.node.runtimes.base import DEFAULT_FIXED_ROOT, remove_dir, stage_dirs, translate_paths
from lodestar_gateway.node.runtimes.docker_cli import DockerCli
from lodestar_gateway.node.runtimes.docker_spec import (
    LABEL,
    NODE_BIN,
    allowed_mounts,
    cgroup_counters,
    container_path,
    disk_full,
    node_binary,
    node_install,
    options_of,
    run_argv,
    session_user,
)
from lodestar_gateway.node.safe_files import give_tree

_log = get_logger("gateway.node.runtimes.docker")
KILL_GRACE_S = 5.0
POLL_S = 0.02
MAX_OUTPUT_BYTES = 8 * 1024 * 1024


@dataclass
class DockerRuntime:
    """One session attempt's container (see the module docstring)."""

    root: Path
    real: RunDirs
    visible: RunDirs
    container: str
    image: str
    spec: rollout_pb2.RuntimeSpec
    mounted: list[Path]
    image_path: str
    on_limit: str
    cli: DockerCli
    pid: int
    """Host pid of the container's init while it runs (0 when stopped)."""
    owner: tuple[int, int] | None = None
    """The session's (uid, gid) when the node must give it the session's files (a root node)."""
    relay_connections: int = DEFAULT_RELAY_CONNECTIONS
    """Connections the harness may hold open to the gateway at once through its relay."""
    kind: str = "docker"
    fixed_paths: bool = True
    limit_failure: str | None = None
    limits_hit: list[str] = field(default_factory=list)
    _removed: bool = False
    _handed_over: bool = False

    def translate(self, invocation: Invocation) -> Invocation:
        translated = translate_paths(invocation, self.root, self.visible.home.parent)
        env = {**translated.env, "PATH": container_path(translated.env.get("PATH", ""), self.mounted, self.image_path)}
        argv = list(translated.argv)
        node = shutil.which("node")
        if argv and node and argv[0] in (node, os.path.realpath(node)):
            argv[0] = str(NODE_BIN / "node")
        return Invocation(translated.harness, argv, env, translated.cwd, translated.config_files)

    async def run_harness(self, invocation: Invocation, gateway_url: str, timeout_s: float) -> HarnessResult:
        await self._hand_over()
        await self._ensure_running()
        relay = await self._relay(gateway_url)
        try:
            result = await self._exec(invocation, timeout_s, stop_after=True)
        finally:
            await relay.close()
        _log.info(
            "harness run finished",
            harness=invocation.harness,
            container=self.container,
            returncode=result.returncode,
            timed_out=result.timed_out,
            duration_s=round(result.duration_s, 3),
            relayed_connections=relay.connections,
            limits_hit=self.limits_hit or None,
        )
        return result

    async def run_process(
        self, argv: list[str], env: Mapping[str, str], timeout_s: float, *, binds: Sequence[tuple[Path, Path]] = ()
    ) -> HarnessResult:
        if binds:  # a running container takes no new mount: verifiers use the session's TMPDIR here
            raise FailedPreconditionError("the docker runtime cannot bind more directories into a verifier run")
        prepared = Invocation("verifier", argv, clean_env(self.visible, extra=env), self.visible.workdir)
        await self._hand_over()
        await self._ensure_running()
        return await self._exec(self.translate(prepared), timeout_s, stop_after=True)

    def details(self) -> dict[str, Any]:
        limits = {
            "cpus": self.spec.cpus,
            "memory_bytes": self.spec.memory_bytes,
            "pids_limit": self.spec.pids_limit,
            "disk_bytes": self.spec.disk_bytes,
        }
        return {
            "kind": self.kind,
            "fixed_paths": True,
            "image": self.image,
            "container": self.container,
            "limits": limits,
            "limits_hit": list(self.limits_hit),
        }

    async def cleanup(self) -> None:
        if not self._removed:
            try:
                await self.cli.remove([self.container])
                self._removed = True
            except FailedPreconditionError as error:  # the reaper / the next start removes it
                _log.error("could not remove a session container", container=self.container, error=error.message)
        await asyncio.to_thread(remove_dir, self.root)

    # Internals -----------------------------------------------------------------------------------------

    async def _hand_over(self) -> None:
        """Before the session's first process: give home, tmp and work (task files, repository, harness
        config, all written by the node) to the session's user. Nothing of the session has run yet, so no
        link in them is the agent's; the private root itself stays the node's."""
        if self.owner is None or self._handed_over:
            return
        for tree in (self.real.home, self.real.tmpdir, self.real.workdir):
            await asyncio.to_thread(give_tree, tree, self.owner)
        self._handed_over = True

    async def _ensure_running(self) -> None:
        if self.pid:
            return
        await self.cli("start", self.container)
        self.pid = await _running_pid(self.cli, self.container)

    async def _relay(self, gateway_url: str) -> GatewayRelay:
        """A listener on the gateway's address and port inside the container's network namespace, relayed
        to the gateway from the node's."""
        host, port, addresses = gateway_address(gateway_url)
        channel, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [
            "nsenter",
            f"--net=/proc/{self.pid}/ns/net",
            "--",
            sys.executable,
            "-I",
            str(CHILD_SCRIPT),
            str(child_end.fileno()),
            "--listen",
            ",".join(addresses),
            str(port),
            "--",
            "true",
        ]
        try:
            with child_end:
                helper = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=(child_end.fileno(),),
                )
            try:
                listeners = await receive_setup(channel, timeout_s=15)
            except OSError as error:
                _, err = await asyncio.wait_for(helper.communicate(), timeout=5)
                detail = err.decode(errors="replace").strip()[-300:]
                message = f"gateway relay into {self.container}: {error} {detail}".strip()
                raise FailedPreconditionError(message) from error
            await asyncio.wait_for(helper.communicate(), timeout=5)
        except OSError as error:
            raise FailedPreconditionError(f"gateway relay into {self.container}: {error}") from error
        finally:
            channel.close()
        relay = GatewayRelay(listeners, host, port, max_connections=self.relay_connections)
        await relay.start()
        return relay

    async def _exec(self, invocation: Invocation, timeout_s: float, *, stop_after: bool) -> HarnessResult:
        """`docker exec` the invocation (its env passed by name, so values never show in a process list; a
        DOCKER_* name is refused, and the client's own settings stay the node's: `DockerCli.client_env`);
        at the deadline, on cancellation, and with `stop_after` always, the container is killed."""
        started = time.monotonic()
        names = self.cli.env_args(invocation.env)
        argv = self.cli.argv("exec", "--workdir", str(invocation.cwd), *names, self.container, *invocation.argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.cli.client_env(invocation.env),
                start_new_session=True,
            )
        except OSError as error:
            raise FailedPreconditionError(f"{invocation.harness}: cannot run docker exec: {error.strerror}") from error
        readers = [asyncio.create_task(_read(proc.stdout)), asyncio.create_task(_read(proc.stderr))]
        timed_out = False
        try:
            timed_out = not await _exited(proc, started + timeout_s)
        finally:
            if timed_out or stop_after or proc.returncode is None:
                await self._stop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=KILL_GRACE_S)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            done, pending = await asyncio.wait(readers, timeout=KILL_GRACE_S)
            for task in pending:
                task.cancel()
        out, err = (task.result() if task in done and not task.cancelled() else b"" for task in readers)
        returncode = -9 if timed_out else (proc.returncode if proc.returncode is not None else -9)
        if returncode in (126, 127) and b"OCI runtime exec failed" in err:
            raise FailedPreconditionError(f"{invocation.harness}: cannot start in the container: {err.decode()[-400:]}")
        return HarnessResult(
            harness=invocation.harness,
            returncode=returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            isolated=True,
            mounted=True,
        )

    async def _stop(self) -> None:
        """Kill every process of the container (it stays, stopped, with its files); note the limits hit."""
        if not self.pid:
            return
        counters = cgroup_counters(self.pid)
        hits = [name for name, key in (("memory", "oom_kill"), ("pids", "pids_max")) if counters[key]]
        if self.spec.disk_bytes and disk_full(self.root):
            hits.append("disk")
        self.limits_hit = sorted({*self.limits_hit, *hits})
        if self.limits_hit and self.on_limit == "infra":
            self.limit_failure = f"the session hit its {', '.join(self.limits_hit)} limit(s) (on_limit: infra)"
        self.pid = 0
        await self.cli("kill", self.container, timeout_s=30, check=False)


class DockerBackend:
    """Creates docker runtimes; one per node (see the module docstring)."""

    kind = "docker"

    def __init__(
        self,
        sessions_dir: Path,
        *,
        node_id: str,
        fixed_root: Path = DEFAULT_FIXED_ROOT,
        bin_dir: Path | None = None,
        cli: DockerCli | None = None,
        reaper: bool = True,
        mounts_allowed: Sequence[Path] = (),
        user: tuple[int, int] | None = None,
        relay_connections: int = DEFAULT_RELAY_CONNECTIONS,
    ) -> None:
        """`mounts_allowed`: host paths a run's options.mounts may name (none: every mount is refused);
        `user`: the (uid, gid) of session processes (default `session_user()`; never 0);
        `relay_connections`: connections a harness may hold open to the gateway at once."""
        self.relay_connections = relay_connections
        self.user = user or session_user()
        if self.user[0] == 0:
            raise InvalidArgumentError("docker runtime: sessions never run as root (uid 0)")
        self.sessions_dir = sessions_dir
        self.mounts_allowed = tuple(mounts_allowed)
        self._owner = os.path.realpath(sessions_dir)
        self.node_id = node_id
        self.fixed_root = fixed_root
        self.bin_dir = bin_dir
        self.cli = cli or DockerCli()
        self._reaper_enabled = reaper
        self._reaper: asyncio.subprocess.Process | None = None
        self._reaper_lock = asyncio.Lock()

    @property
    def owner_label(self) -> str:
        """The label every container of this node's sessions directory carries (`key=value`)."""
        return f"{LABEL}.sessions-dir={self._owner}"

    async def create(
        self,
        name: str,
        files: Mapping[str, str],
        spec: rollout_pb2.RuntimeSpec | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> DockerRuntime:
        spec = spec or rollout_pb2.RuntimeSpec(kind="docker")
        if not spec.image:
            raise InvalidArgumentError("docker runtime: no image (set the run's runtime.image or the task's image)")
        check_image(spec.image)
        extra, on_limit = options_of(spec)
        mounts = allowed_mounts(extra, self.mounts_allowed)
        root = self.sessions_dir / name
        await self._start_reaper()
        real = await asyncio.to_thread(stage_dirs, root, files, tmpfs_bytes=spec.disk_bytes)
        mounted = node_install(self.bin_dir, mounts)
        container = f"{LABEL}-{name}-{secrets.token_hex(3)}"
        argv = run_argv(
            container,
            spec,
            root=root,
            fixed_root=self.fixed_root,
            mounted=mounted,
            node=node_binary(),
            labels={"sessions-dir": self._owner, "node": self.node_id, **(labels or {})},
            user=self.user,
            root_mask=await asyncio.to_thread(self._root_mask),
        )
        started = time.monotonic()
        try:
            await self.cli(*argv, timeout_s=120)
            pid = await _running_pid(self.cli, container)
            image_path = await self._image_path(container)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.cli.remove([container])
            await asyncio.to_thread(remove_dir, root)
            raise
        _log.info(
            "session container started",
            container=container,
            image=spec.image,
            seconds=round(time.monotonic() - started, 3),
        )
        visible = RunDirs(self.fixed_root / "home", self.fixed_root / "tmp", self.fixed_root / "work")
        owner = self.user if self.user != (os.getuid(), os.getgid()) else None
        return DockerRuntime(
            root,
            real,
            visible,
            container,
            spec.image,
            spec,
            mounted,
            image_path,
            on_limit,
            self.cli,
            pid,
            owner,
            relay_connections=self.relay_connections,
        )

    async def remove_leftovers(self) -> int:
        """Remove the containers an earlier process on this sessions directory left behind."""
        if shutil.which(self.cli.binary) is None:
            return 0
        try:
            leftovers = await self.cli.labelled(self.owner_label)
            await self.cli.remove(leftovers)
        except FailedPreconditionError as error:
            _log.warning("could not look for leftover session containers", error=error.message)
            return 0
        if leftovers:
            _log.warning("removed session containers left by an earlier process", count=len(leftovers))
        return len(leftovers)

    async def close(self) -> None:
        """Stop the reaper (its signal handler removes any container still labelled for this node)."""
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.returncode is None:
            reaper.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reaper.wait(), timeout=30)

    def _root_mask(self) -> Path:
        """The empty directory mounted over a container's /root (`run_argv`); docker makes the mount points of
        the node install below it."""
        mask = self.sessions_dir.parent / f".{self.sessions_dir.name}-root-mask"
        mask.mkdir(mode=0o711, parents=True, exist_ok=True)
        mask.chmod(0o711)
        return mask

    async def _image_path(self, container: str) -> str:
        out = await self.cli("inspect", "--format", "{{json .Config.Env}}", container)
        env = json.loads(out or "[]") or []
        return next((item[5:] for item in env if item.startswith("PATH=")), "")

    async def _start_reaper(self) -> None:
        """One child process that removes every container of this node when the node dies (SIGKILL
        included: PR_SET_PDEATHSIG via setpriv delivers it a SIGTERM)."""
        async with self._reaper_lock:  # concurrent INITs start one reaper
            if self._reaper_enabled and (self._reaper is None or self._reaper.returncode is not None):
                await self._spawn_reaper()

    async def _spawn_reaper(self) -> None:
        if shutil.which("setpriv") is None:
            _log.warning("no setpriv: containers of a killed node are removed only when a node starts again")
            self._reaper_enabled = False
            return
        script = (
            'docker="$0"; label="$1"; reap() { "$docker" ps -aq --filter "label=$label" | '
            'xargs -r "$docker" rm -f -v >/dev/null 2>&1; kill $! 2>/dev/null; exit 0; }; '
            "trap reap TERM INT HUP; while :; do sleep 3600 & wait $!; done"
        )
        self._reaper = await asyncio.create_subprocess_exec(
            "setpriv",
            "--pdeathsig",
            "TERM",
            "--",
            "sh",
            "-c",
            script,
            self.cli.binary,
            self.owner_label,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.cli.client_env(),
            start_new_session=True,
        )


async def _running_pid(cli: DockerCli, container: str) -> int:
    """The host pid of a running container's init; FailedPreconditionError (with its log) when it is not
    running (e.g. the image has no `sleep`)."""
    out = (await cli("inspect", "--format", "{{.State.Running}} {{.State.Pid}}", container)).split()
    if len(out) == 2 and out[0] == "true" and out[1].isdigit() and int(out[1]) > 0:
        return int(out[1])
    logs = await cli("logs", "--tail", "20", container, check=False)
    raise FailedPreconditionError(f"container {container} is not running: {logs.strip()[-400:]}")


async def _exited(proc: asyncio.subprocess.Process, deadline: float) -> bool:
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def _read(stream: asyncio.StreamReader | None) -> bytes:
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(64 * 1024):
        room = MAX_OUTPUT_BYTES - len(kept)
        if room > 0:
            kept += chunk[:room]
    return bytes(kept)
