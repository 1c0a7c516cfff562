"""Gateway benchmark: the latency the gateway adds over calling InferenceService.Generate directly.

Both paths hit the same `lodestar inference serve --backend scripted` subprocess (the engine answers
instantly with a 3-token reply), so the difference is the gateway: HTTP parsing, JSON decoding of the
body, dialect normalization, continuation lookup, its own gRPC hop to inference, rendering, and the
durable capture of the CallRecord (SQLite WAL commit) before the response ends. The gateway runs as a
`lodestar gateway serve` subprocess; the clients run in this process, with the request pre-encoded.

The request is Claude-Code-sized: Anthropic Messages with 24 tools (long descriptions and schemas), a
long system prompt and a short conversation, ~80 KB of JSON. The direct baseline sends the equivalent
canonical GenerateRequest (the gateway's own normalization of that body, built once up front).

Figures, side by side in one run, direct and gateway calls interleaved so drift hits both equally:
- non-streaming latency p50/p99 (gateway: POST /v1/messages; direct: Generate with stream=false),
- streaming time to first byte p50/p99 (gateway: first SSE bytes; direct: first delta message),
- calls/s at concurrency 32 (non-streaming).
Usage: `.venv/bin/python bench/gateway.py [--calls 400] [--write-docs] [--capture-synchronous normal]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SECTION = "## Gateway"
WORDS = (
    "file",
    "path",
    "command",
    "output",
    "the",
    "tool",
    "use",
    "when",
    "you",
    "must",
    "never",
    "always",
    "read",
    "write",
    "edit",
    "search",
    "pattern",
    "directory",
    "project",
    "user",
    "code",
    "function",
    "result",
    "error",
    "test",
    "run",
    "shell",
    "background",
    "process",
    "task",
    "agent",
)


def filler(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13 + i // 5) % len(WORDS)] for i in range(words))


CLAUDE_CODE_TOOLS = (
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "LS",
    "ExitPlanMode",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
    "KillShell",
    "SlashCommand",
    "Skill",
    "AskUserQuestion",
    "EnterPlanMode",
    "ListMcpResources",
    "ReadMcpResource",
    "Monitor",
    "Agent",
)
"""The tools a Claude Code request offers, by name."""


def claude_code_tools() -> list[dict[str, Any]]:
    """Tool definitions shaped like Claude Code's: a long description and five described parameters each."""
    tools = []
    for index, name in enumerate(CLAUDE_CODE_TOOLS):
        properties = {
            f"param_{k}": {"type": "string" if k % 3 else "integer", "description": filler(40, index * 10 + k)}
            for k in range(5)
        }
        tools.append(
            {
                "name": name,
                "description": filler(260, index),
                "input_schema": {
                    "type": "object",
                    "properties": properties,
                    "required": ["param_0"],
                    "additionalProperties": False,
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
            }
        )
    return tools


def claude_code_body(stream: bool) -> dict[str, Any]:
    """An Anthropic Messages request shaped like Claude Code's (~80 KB)."""
    tools = claude_code_tools()
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=0;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": filler(2200, 99), "cache_control": {"type": "ephemeral"}},
    ]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>" + filler(300, 5) + "</system-reminder>"},
                {"type": "text", "text": "Fix the failing test in tests/test_app.py"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look at the test."},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"param_0": "tests/test_app.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": filler(500, 7),
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    return {
        "model": "claude-tiny",
        "max_tokens": 32000,
        "system": system,
        "messages": messages,
        "tools": tools,
        "thinking": {"type": "adaptive"},
        "metadata": {"user_id": "bench"},
        "stream": stream,
    }


def direct_request(body: dict[str, Any], stream: bool):
    from lodestar.v1 import inference_pb2
    from lodestar_gateway.dialects import AnthropicMessages
    from lodestar_gateway.dialects.base import Route

    parsed = AnthropicMessages().parse(body, Route())
    return inference_pb2.GenerateRequest(
        model=parsed.model, messages=parsed.messages, tools=parsed.tools, sampling=parsed.sampling, stream=stream
    )


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "lodestar_app.cli.main", *command],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


async def wait_serving(address: str, timeout: float = 120.0) -> None:
    import grpc.aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        while True:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} did not become SERVING")
            await asyncio.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def measure(inference: str, gateways: dict[str, tuple[str, str]], calls: int) -> dict[str, Any]:
    """`gateways`: capture mode -> (GatewayService address, HTTP base URL)."""
    import aiohttp

    from lodestar.grpc.client import connect
    from lodestar.v1 import gateway_pb2, gateway_pb2_grpc, inference_pb2_grpc

    plain_body = claude_code_body(stream=False)
    raw_plain = json.dumps(plain_body).encode()
    raw_stream = json.dumps(claude_code_body(stream=True)).encode()
    direct_plain, direct_stream = direct_request(plain_body, False), direct_request(plain_body, True)
    stub = inference_pb2_grpc.InferenceServiceStub(connect(inference))
    stubs = {mode: gateway_pb2_grpc.GatewayServiceStub(connect(address)) for mode, (address, _) in gateways.items()}

    async def new_key(mode: str) -> str:
        request = gateway_pb2.OpenSessionRequest(labels={"bench": "gateway"})
        return (await stubs[mode].OpenSession(request)).session.session_key

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:

        async def via_gateway(mode: str, raw: bytes, ttfb: bool, key: str) -> float:
            headers = {"Content-Type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
            started = time.perf_counter()
            async with http.post(f"{gateways[mode][1]}/v1/messages", data=raw, headers=headers) as response:
                if ttfb:
                    await response.content.readany()
                    elapsed = time.perf_counter() - started
                    await response.read()
                    return elapsed
                await response.read()
                assert response.status == 200, await response.text()
                return time.perf_counter() - started

        async def via_direct(request: Any, ttfb: bool) -> float:
            started = time.perf_counter()
            elapsed = 0.0
            async for _ in stub.Generate(request, timeout=60):
                elapsed = elapsed or time.perf_counter() - started
            return elapsed if ttfb else time.perf_counter() - started

        keys = {mode: await new_key(mode) for mode in gateways}
        for _ in range(20):  # warm-up: connections, caches
            await via_direct(direct_plain, False)
            for mode in gateways:
                await via_gateway(mode, raw_plain, False, keys[mode])
        series: dict[str, list[float]] = {"direct": [], "direct_ttfb": [], "gateway_ttfb": []}
        series.update({mode: [] for mode in gateways})
        for _ in range(calls):
            series["direct"].append(await via_direct(direct_plain, False))
            for mode in gateways:
                series[mode].append(await via_gateway(mode, raw_plain, False, keys[mode]))
            series["direct_ttfb"].append(await via_direct(direct_stream, True))
            series["gateway_ttfb"].append(await via_gateway("normal", raw_stream, True, keys["normal"]))

        async def throughput(call: Any, total: int, concurrency: int = 32) -> float:
            queue = iter(range(total))

            async def worker(slot: int) -> None:
                for _ in queue:
                    await call(slot)

            started = time.perf_counter()
            await asyncio.gather(*(worker(slot) for slot in range(concurrency)))
            return total / (time.perf_counter() - started)

        total = max(320, calls)
        rates = {"direct": await throughput(lambda slot: via_direct(direct_plain, False), total)}
        for mode in gateways:
            slot_keys = [await new_key(mode) for _ in range(32)]  # one session per concurrent caller

            async def call(slot: int, mode: str = mode, slot_keys: list[str] = slot_keys) -> float:
                return await via_gateway(mode, raw_plain, False, slot_keys[slot])

            rates[mode] = await throughput(call, total)
    return {"series": series, "rates": rates, "body_bytes": len(raw_plain), "tools": len(plain_body["tools"])}


def breakdown(log: Path) -> dict[str, float]:
    """Median per-call timings the gateway logged itself (its "call" lines, non-streaming, after warm-up)."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if '"call"' in line]
    rows = [row for row in rows if not row.get("stream") and "capture_ms" in row]
    rows = [row for row in rows if row["session_id"] == rows[0]["session_id"]][20:]  # the sequential phase
    keys = ("parse_ms", "prepare_ms", "inference_ms", "capture_ms", "duration_ms")
    return {key: statistics.median(row[key] for row in rows) for key in keys} if rows else {}


def table(result: dict[str, Any]) -> str:
    s, rates = result["series"], result["rates"]

    def row(name: str, direct: float, *gateway: float) -> str:
        cells = "".join(f" {g:.2f} | {g - direct:+.2f} |" for g in gateway)
        return f"| {name} | {direct:.2f} |{cells}"

    lines = [
        "| measure | direct Generate | gateway, capture `normal` (default) | added | gateway, capture `full` | added |",
        "|---|---:|---:|---:|---:|---:|",
        row("non-streaming latency p50 (ms)", pct(s["direct"], 0.5), pct(s["normal"], 0.5), pct(s["full"], 0.5)),
        row("non-streaming latency p99 (ms)", pct(s["direct"], 0.99), pct(s["normal"], 0.99), pct(s["full"], 0.99)),
        row("streaming time to first byte p50 (ms)", pct(s["direct_ttfb"], 0.5), pct(s["gateway_ttfb"], 0.5)),
        row("streaming time to first byte p99 (ms)", pct(s["direct_ttfb"], 0.99), pct(s["gateway_ttfb"], 0.99)),
    ]
    pairs = [
        statistics.median(g - d for d, g in zip(s["direct"], s[mode], strict=True)) * 1e3 for mode in ("normal", "full")
    ]
    lines.append(f"| added latency, median of interleaved pairs (ms) | | | {pairs[0]:+.2f} | | {pairs[1]:+.2f} |")
    change = {mode: (rates[mode] / rates["direct"] - 1) * 100 for mode in ("normal", "full")}
    lines.append(
        f"| calls/s at concurrency 32 | {rates['direct']:.0f} | {rates['normal']:.0f} | {change['normal']:+.0f}% "
        f"| {rates['full']:.0f} | {change['full']:+.0f}% |"
    )
    timings = result.get("breakdown") or {}
    if timings:
        lines += [
            "",
            "Where the gateway's own time goes (medians from its per-call log line, capture `normal`): "
            + ", ".join(f"{key.removesuffix('_ms')} {value:.2f} ms" for key, value in timings.items())
            + " (`duration` is the handler end to end, `inference` the Generate call it makes).",
        ]
    return "\n".join(lines)


HISTORY = """History of this number (same 2-core shared VM):
- 2026-11-29: +3.5 ms (first version). Memoizing the continuation lookup's digests by exact serialization
  (`services/gateway/lodestar_gateway/digest_cache.py`) cut the prepare step from 0.52 to 0.26 ms: +3.0 ms. Splicing the
  prompt ids' packed bytes from inference's reply straight into the stored record (hand-written protobuf wire
  parsing, ~0.2 ms of capture) measured +2.6 to +2.9 ms, inside the +-0.4 ms run-to-run noise, with lower
  calls/s at concurrency 32; removed again as not worth its complexity.
- 2026-12-01 (issue 11: unknown fields counted, one sampling helper, indexed chain lookup, error classes):
  +2.55 ms (load average 6.4-8.9 on 2 cores during the run, with the first version of the chain index). The
  prepare step stays 0.27 ms for this one-call chain; what changed is long sessions (before: 0.5 ms -> 4.8 ms
  per call after 13K calls in one session): the final chain index costs 0.01 ms per lookup at 2,000 calls /
  4,000 messages (the old scan: 0.41 ms; docs/gateway.md). A cProfile of one call in-process (fake
  inference, same body, under the same load) puts the handler's own CPU at parse 0.8 ms, the tools context
  digest 0.3 ms (serializing the 24 tools to key its memo), the GenerateRequest 0.15 ms, and the hand-off to
  the capture writer thread. uvloop for the gateway process was tried: one run at load average 8-21 gave
  +3.3 ms, nothing measurable on this machine, so it was not added. Not done: sending inference only the new
  messages of a chain (inference would have to keep the chain's canonical prompt), the largest remaining item
  (the 80 KB re-send and its protobuf encode/decode on both sides)."""


def write_docs(text: str, result: dict[str, Any]) -> None:
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    section = (
        f"{SECTION}\n\n`bench/gateway.py` ({time.strftime('%Y-%m-%d')}, {platform.machine()}, load average "
        f"{load} at the end, {len(result['series']['direct'])} interleaved calls per figure): an Anthropic "
        "Messages request shaped "
        f"like Claude Code's ({result['tools']} tools, {result['body_bytes'] / 1024:.0f} KB body) against the "
        "scripted engine answering at once (3 tokens): direct `InferenceService.Generate` vs the same call "
        "through `POST /v1/messages` of a `lodestar gateway serve` process, which also commits the CallRecord "
        "to SQLite before answering (`normal`: survives a gateway crash; `full`: also fsynced).\n\n"
        f"{text}\n\n{notes(result)}\n\n{HISTORY}\n\n"
    )
    from bench.docs_section import replace_section

    replace_section(SECTION, section)


def notes(result: dict[str, Any]) -> str:
    """What the table says about the 1 ms target, from this run's numbers."""
    s, timings = result["series"], result.get("breakdown") or {}
    added = statistics.median(g - d for d, g in zip(s["direct"], s["normal"], strict=True)) * 1e3
    handler = timings.get("duration_ms", 0.0) - timings.get("inference_ms", 0.0)
    verdict = "met" if added < 1.0 else "missed"
    return (
        f"Target (p50 overhead under 1 ms): **{verdict}** — {added:.1f} ms with the default capture mode. "
        f"Inside the gateway's handler {handler:.1f} ms: parsing the 96 KB body and normalizing it "
        f"({timings.get('parse_ms', 0):.2f} ms: orjson decode, 24 tool schemas re-encoded as canonical JSON), "
        f"preparing the call ({timings.get('prepare_ms', 0):.2f} ms: the continuation lookup's message and "
        f"tools digests, memoized by exact serialization, and the GenerateRequest), and the durable capture "
        f"after the final ({timings.get('capture_ms', 0):.2f} ms: the result half, with its ~22K prompt ids "
        "re-encoded into the CallRecord, the hop to the writer thread and the SQLite commit; the "
        "200 KB request half is written while inference runs, off the critical path). The "
        "rest is outside the handler: aiohttp receiving the 96 KB body and sending the reply, and the extra "
        "gRPC hop (the gateway re-sends the 80 KB request to inference and decodes the final with its prompt "
        "ids). `full` durability adds one fsync per commit (concurrent calls share it through group commit). "
        "Time to first byte pays parsing, preparation and the hop, not the capture (it happens after the last "
        "token). Throughput at concurrency 32 is bounded by the scripted engine rendering the 24-tool chat "
        "template for every call, on the same 2 shared cores as the gateway and the clients; all figures are "
        "from a noisy shared VM."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="interleaved calls per latency figure")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: build the tiny model)")
    parser.add_argument("--write-docs", action="store_true", help="replace the Gateway section of docs/benchmarks.md")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the services' logs here")
    args = parser.parse_args()
    from lodestar_app.local import free_port

    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        work = Path(tmp)
        logs = args.log_dir or work
        logs.mkdir(parents=True, exist_ok=True)
        model = args.model
        if model is None:
            from lodestar_inference.tiny_model import TinyModelSpec, build

            model = build(work / "model", TinyModelSpec())
        script = work / "script.json"
        script.write_text(json.dumps({"replies": [], "default": {"text": "OK."}}))
        inference = f"127.0.0.1:{free_port()}"
        command = ["inference", "serve", "--backend", "scripted", "--model", str(model), "--script", str(script)]
        processes = [start([*command, "--port", inference.split(":")[1]], logs / "inference.log")]
        gateways: dict[str, tuple[str, str]] = {}
        for mode in ("normal", "full"):
            grpc_port, http_port = free_port(), free_port()
            gateways[mode] = (f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}")
            command = ["gateway", "serve", "--port", str(grpc_port), "--http-port", str(http_port)]
            command += ["--inference", inference, "--data-dir", str(work / f"gateway-{mode}")]
            command += ["--capture-synchronous", mode]
            processes.append(start(command, logs / f"gateway-{mode}.log"))
        try:

            async def run() -> dict[str, Any]:
                for address in (inference, *(grpc for grpc, _ in gateways.values())):
                    await wait_serving(address)
                return await measure(inference, gateways, args.calls)

            result = asyncio.run(run())
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)
        result["breakdown"] = breakdown(logs / "gateway-normal.log")
    text = table(result)
    print(text)
    print(notes(result))
    if args.write_docs:
        write_docs(text, result)


if __name__ == "__main__":
    main()
