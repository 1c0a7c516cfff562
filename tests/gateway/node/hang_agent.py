"""A test harness that makes `CALLS` model calls (official openai SDK), then starts a background `sleep`
in its process group, appends "<own pid> <sleep pid>" to $PIDFILE and hangs (when $RELEASE names a file: until
that file exists, then it exits 0)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from openai import OpenAI


def main() -> None:
    calls = int(os.environ.get("CALLS", "1"))
    client = OpenAI(max_retries=0)
    for _ in range(calls):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": sys.argv[1]}])
    sleeper = subprocess.Popen(["sleep", "300"])
    with open(os.environ["PIDFILE"], "a") as out:
        out.write(f"{os.getpid()} {sleeper.pid}\n")
    print("hanging", flush=True)
    release = os.environ.get("RELEASE")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if release and os.path.exists(release):
            sleeper.kill()
            return
        time.sleep(0.1)


if __name__ == "__main__":
    main()
