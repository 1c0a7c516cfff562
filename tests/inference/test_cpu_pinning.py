"""`keep_off_worker_cores` on a real process tree: a child named as vLLM names its workers, bound to one core,
and another child standing in for the engine core; run in a subprocess, so that pytest itself stays unpinned.
(tests/inference/test_vllm_engine.py checks the same against a real vLLM engine.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = """
import ctypes, json, os, subprocess, sys, threading, time
from services.inference.engines.cpu_pinning import WORKER_PREFIX, _cpus, keep_off_worker_cores

bind_worker = sys.argv[1] == "bound"
worker_code = (
    "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, (sys.argv[1] + '-0').encode(), 0, 0, 0); "
    "print('ready', flush=True); time.sleep(60)"
)
worker = subprocess.Popen([sys.executable, "-c", worker_code, WORKER_PREFIX], stdout=subprocess.PIPE, text=True)
other = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
for child in (worker, other):
    child.stdout.readline()
if bind_worker:
    os.sched_setaffinity(worker.pid, {min(os.sched_getaffinity(0))})
before = threading.Event()
later = threading.Thread(target=before.wait)  # a thread that exists before the pinning
later.start()
result = keep_off_worker_cores()
started_after = {}
thread = threading.Thread(target=lambda: started_after.update(cpus=sorted(os.sched_getaffinity(0))))
thread.start(); thread.join(); before.set(); later.join()
print(json.dumps({
    "result": None if result is None else [sorted(result[0]), sorted(result[1])],
    "self": sorted(_cpus(os.getpid())), "other": sorted(_cpus(other.pid)), "worker": sorted(_cpus(worker.pid)),
    "new_thread": started_after["cpus"],
}))
for child in (worker, other):
    child.kill()
"""


def _run(mode: str) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-c", SCENARIO, mode],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, sched_setaffinity)")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 cores this process may run on")
def test_front_end_moves_to_the_cores_the_worker_leaves_free() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, free = allowed[:1], allowed[1:]
    got = _run("bound")
    assert got["result"] == [free, first]
    assert got["self"] == got["other"] == got["new_thread"] == free
    assert got["worker"] == first  # the worker itself is left where vLLM bound it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, sched_setaffinity)")
def test_nothing_is_pinned_when_the_worker_is_not_bound() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    got = _run("unbound")
    assert got["result"] is None
    assert got["self"] == got["other"] == got["worker"] == allowed
