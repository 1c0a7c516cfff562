"""The evil agent of the sandbox tests (`test_sandbox.py` on the host runtime, `test_docker_sandbox.py` on the
docker runtime): a script, run as a session's harness, that tries to get out. It takes a JSON object of
targets (another session's file, a node secret, a host file to write, the node's pid, a port it must not
reach, the gateway's port) and prints a JSON object: for each attack, whether it worked.

Plus the two servers the tests put next to it: a "gateway" it may reach and another service it must not.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

EVIL = r"""
import json, os, signal, socket, sys
from pathlib import Path
targets = json.loads(sys.argv[1])
found = {}

def attempt(name, action):
    try:
        found[name] = bool(action())
    except Exception as error:
        found[name] = False
        found[name + "_error"] = type(error).__name__

def read(path):
    return Path(path).read_text() != ""

def write(path):
    Path(path).write_text("owned")
    return True

def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True

def signal_node():
    os.kill(targets["node_pid"], 0)
    return True

def capabilities():
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16) != 0

attempt("read_other_session", lambda: read(targets["other_session_file"]))
attempt("read_node_secret", lambda: read(targets["node_secret"]))
attempt("write_host_file", lambda: write(targets["host_file"]))
attempt("signal_node", signal_node)
attempt("see_node_pid", lambda: Path(f"/proc/{targets['node_pid']}").exists())
attempt("reach_other_port", lambda: connect(targets["other_port"]))
attempt("reach_gateway", lambda: connect(targets["gateway_port"]))
attempt("uid_0", lambda: os.getuid() == 0)
attempt("capabilities", capabilities)
attempt("write_node_install", lambda: write(targets.get("node_install", "/nonexistent") + "/owned.txt"))
attempt("write_own_workspace", lambda: write("own.txt"))
found["processes_visible"] = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
print(json.dumps(found))
"""

ESCAPES = ("read_other_session", "read_node_secret", "write_host_file", "signal_node", "see_node_pid",
           "reach_other_port", "uid_0", "capabilities", "write_node_install")  # fmt: skip
"""Every attack of EVIL that must fail in a sandbox."""


@pytest.fixture
async def gateway_port() -> AsyncIterator[int]:
    """An HTTP server standing in for the gateway (the one service a session reaches)."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="gateway")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


@pytest.fixture
def other_port() -> Iterator[int]:
    """A service of the node's host that no session may reach (rollout, etcd, inference...)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()
