"""Child process of the `python` verifier (standard library only; the node's interpreter runs it).

Usage: python -I python_runner.py MODULE:FUNCTION INPUT_JSON PYTHONPATH. Puts the PYTHONPATH entries (the
verifier's configured directories, `os.pathsep`-separated) first on sys.path (under -I nothing else is added:
not the working directory, not this script's directory), imports the function, calls it with
(Path(workspace), task dict, final answer) and prints {"reward": x} as the last stdout line. Exit 1 with a
traceback on stderr when it raises or returns something that is not a real number.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path


def main(args: list[str]) -> int:
    target, input_path, pythonpath = args
    sys.path[:0] = [entry for entry in pythonpath.split(os.pathsep) if entry]
    module_name, _, function_name = target.partition(":")
    document = json.loads(Path(input_path).read_text(encoding="utf-8"))
    function = getattr(importlib.import_module(module_name), function_name)
    value = function(Path(document["workspace"]), document["task"], document["final_answer"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        print(f"{target} returned {value!r}, not a finite number", file=sys.stderr)
        return 1
    print(json.dumps({"reward": float(value)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
