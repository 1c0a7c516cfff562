"""Child process of the `python` verifier (standard library only; the node's interpreter runs it).

Usage: python -I python_runner.py MODULE:FUNCTION INPUT_JSON PYTHONPATH RESULT SESSION_ROOT DUMP_AT.

Before anything of the verifier's or the agent's runs, it makes itself non-dumpable (its /proc files and
memory are then closed to every other process of the session, the agent's included: no capability can be
had in the sandbox), opens RESULT (a file the node made and keeps open; the only channel the node reads a
verdict from) and reads INPUT_JSON, and unlinks both: a process the verifier function starts (the agent's
program) can neither read the task's metadata from the input nor reopen the result channel. Then it puts
the PYTHONPATH entries (the verifier's configured directories, `os.pathsep`-separated) first on sys.path
(under -I nothing else is added), imports the function and calls it with (Path(workspace), task dict,
final answer). It writes one JSON line to RESULT when it starts importing ({"started": true}) and one when
the function has returned or raised: {"reward": x}, or {"error": message, "agent": bool} where `agent` says
whether the traceback passes through a file below SESSION_ROOT (the agent's code raised). Nothing is read
from its stdout. At DUMP_AT (a wall-clock time) `faulthandler` writes the stacks of its threads to RESULT,
so the node can tell a hang in the agent's code from one in the verifier's.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

PR_SET_DUMPABLE = 4


def main(args: list[str]) -> int:
    target, input_path, pythonpath, result_path, session_root, dump_at = args
    _undumpable()
    channel = _open_channel(result_path)
    document = json.loads(Path(input_path).read_text(encoding="utf-8"))
    os.unlink(input_path)
    faulthandler.dump_traceback_later(max(0.1, float(dump_at) - time.time()), file=channel)
    _send(channel, {"started": True})
    try:
        value = _call(target, pythonpath, document)
    except BaseException as error:  # SystemExit and KeyboardInterrupt raised by the agent's code too
        _send(channel, _failure(error, session_root))
        return 1
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _send(channel, {"error": f"{target} returned {value!r}, not a finite number", "agent": False})
        return 1
    _send(channel, {"reward": float(value)})
    return 0


def _undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): ptrace, /proc/PID/{mem,fd,environ} of this process need a capability."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _open_channel(result_path: str) -> IO[str]:
    """The node's result file, opened (close-on-exec: no child inherits it) and unlinked."""
    fd = os.open(result_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    os.unlink(result_path)
    return os.fdopen(fd, "w", encoding="utf-8")


def _call(target: str, pythonpath: str, document: dict[str, Any]) -> Any:
    sys.path[:0] = [entry for entry in pythonpath.split(os.pathsep) if entry]
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return function(Path(document["workspace"]), document["task"], document["final_answer"])


def _failure(error: BaseException, session_root: str) -> dict[str, Any]:
    """What the node is told of an exception: its message, its traceback and whether the agent's code
    raised it (a frame, or the file of a syntax error, below the session's root; "<frozen ...>" and other
    relative names are not files)."""
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    files.append(str(getattr(error, "filename", "") or ""))
    root = session_root.rstrip("/") + "/"
    agent = any(os.path.normpath(name).startswith(root) for name in files if name.startswith("/"))
    text = "".join(traceback.format_exception(error))
    return {"error": f"{type(error).__name__}: {error}", "agent": agent, "traceback": text[-3000:]}


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
