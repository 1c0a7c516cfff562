"""What the host runtime's session sandbox costs per process start: a `true` run through the launcher, each way.

- `none`: the launcher with no isolation at all (a plain process group);
- `namespaces`: `host_sandbox = namespaces` (unshare: mount + network namespaces, netns_child.py);
- `bwrap`: the default sandbox (sandbox.py: the allow-list root, every namespace, seccomp, rlimits; on a
  root node an outer bubblewrap builds the root and the session runs as an unprivileged uid), then
  netns_child.py for the gateway relay;
- `bwrap OLD` (with `--old CHECKOUT`, e.g. a worktree of c160404): the sandbox.py of that checkout (its
  `Sandbox.argv`: the read-only host with hidden paths) driven by this launcher, so both sandboxes are timed
  in one sitting.

Each way runs `--runs` times in turn (interleaved, so a noisy host spreads over all three); the table gives
the median and p90 wall time of one run (launch to exit, with the gateway relay set up). No CPU column: the
processes inside a PID namespace are reaped by bwrap, not by us, so `os.times()` would miss them.

    .venv/bin/python bench/sandbox_start.py [--runs 30] [--old /tmp/c160404]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lodestar_gateway.node.harnesses import Invocation, Launcher
from lodestar_gateway.node.harnesses.base import clean_env
from lodestar_gateway.node.harnesses.sandbox import Prepared, Sandbox
from lodestar_gateway.node.runtimes import HostBackend


async def _gateway() -> tuple[asyncio.Server, int]:
    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _one(launcher: Launcher, root: Path, name: str, gateway: str) -> float:
    runtime = await HostBackend(root, launcher).create(name, {})
    invocation = Invocation("true", ["true"], clean_env(runtime.visible), runtime.visible.workdir)
    started = time.perf_counter()
    result = await runtime.run_harness(runtime.translate(invocation), gateway, 30)
    wall = time.perf_counter() - started
    await runtime.cleanup()
    if result.returncode != 0:
        raise SystemExit(f"{name}: exit {result.returncode}: {result.stderr}")
    return wall


class _OldSandbox(Sandbox):
    """Another checkout's sandbox.py (before `prepare`: its `argv` is the whole bwrap command line)."""

    def __init__(self, checkout: Path) -> None:
        super().__init__()
        spec = importlib.util.spec_from_file_location(
            "old_sandbox", checkout / "services" / "gateway" / "node" / "harnesses" / "sandbox.py"
        )
        if spec is None or spec.loader is None:
            raise SystemExit(f"no sandbox.py in {checkout}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        self.old = module.Sandbox()

    async def available(self) -> tuple[bool, str]:
        return await self.old.available()  # type: ignore[no-any-return]

    def prepare(self, *, binds: Sequence[tuple[Path, Path]], chdir: Path, reads: Sequence[Path] = ()) -> Prepared:
        return Prepared(self.old.argv(binds=binds, chdir=chdir), [])


async def main(runs: int, old: Path | None) -> None:
    server, port = await _gateway()
    gateway = f"http://127.0.0.1:{port}"
    ways = {
        "none": Launcher(isolate_network=False, mount_namespaces=False),
        "namespaces": Launcher(),
        "bwrap": Launcher(sandbox=Sandbox()),
    }
    if old is not None:
        ways[f"bwrap {old.name}"] = Launcher(sandbox=_OldSandbox(old))
    samples: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as scratch:
        for name, launcher in ways.items():  # warm-up: probes, page cache
            await _one(launcher, Path(scratch), f"warm-{name}", gateway)
        for index in range(runs):
            for name, launcher in ways.items():
                samples[name].append(await _one(launcher, Path(scratch), f"{name}-{index}", gateway))
    server.close()
    table = Table(title=f"one sandboxed `true` per run, {runs} runs each (interleaved)")
    for column in ("way", "wall median ms", "wall p90 ms", "median vs none", "median vs namespaces"):
        table.add_column(column, justify="right")
    medians = {name: statistics.median(walls) for name, walls in samples.items()}
    for name, walls in samples.items():
        ordered = sorted(walls)
        table.add_row(
            name,
            f"{medians[name] * 1e3:.1f}",
            f"{ordered[max(0, int(len(ordered) * 0.9) - 1)] * 1e3:.1f}",
            f"{medians[name] / medians['none']:.2f}x",
            f"{medians[name] / medians['namespaces']:.2f}x",
        )
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--old", type=Path, help="another checkout whose sandbox.py to time side by side")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.old))
