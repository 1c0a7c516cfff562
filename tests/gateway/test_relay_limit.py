"""The relay that forwards the gateway's port into a run's network namespace holds at most
`relay_max_connections` connections of a run at once (lodestar_gateway/node/harnesses/netns.py): a harness
that opens more gets the extra ones closed at once, and the gateway never sees them. Real namespaces, a real
relay, a real TCP server standing in for the gateway's port."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Launcher, RunDirs
from lodestar_gateway.node.harnesses.netns import DEFAULT_RELAY_CONNECTIONS

OPENED = DEFAULT_RELAY_CONNECTIONS + 16
FLOOD = (
    "import os, select, socket, time\n"
    "from urllib.parse import urlsplit\n"
    "url = urlsplit(os.environ['LODESTAR_GATEWAY_URL'])\n"
    "held = [socket.create_connection((url.hostname, url.port), timeout=5) for _ in range(int(os.environ['N']))]\n"
    "time.sleep(0.5)\n"
    "readable, _, _ = select.select(held, [], [], 0.5)\n"
    "print('CLOSED', sum(1 for s in readable if s.recv(1) == b''))\n"
)


async def test_a_run_holds_at_most_its_relay_connections(tmp_path: Path) -> None:
    launcher = Launcher(isolate_network=True)
    if not await launcher.isolation.available():
        pytest.skip("unshare --net is not permitted on this machine (no network namespaces)")
    open_now = peak = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        try:
            await reader.read()
        finally:
            open_now -= 1
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    harness = Command([sys.executable, "-c", FLOOD], env={"N": str(OPENED)})
    endpoint = GatewayEndpoint(base_url=url, session_key="sk-test", model="tiny")
    try:
        result = await launcher.run(harness.prepare(RunDirs.under(tmp_path), endpoint, "hi"), url, timeout_s=60)
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert peak <= DEFAULT_RELAY_CONNECTIONS, f"the gateway saw {peak} connections of one run at once"
    assert f"CLOSED {OPENED - DEFAULT_RELAY_CONNECTIONS}" in result.stdout, result.stdout
