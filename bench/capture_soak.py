"""Capture soak: one gateway node under sustained load for `--duration-s`; its capture store's database and WAL
sizes, its RSS and the latency it adds, sampled as it runs.

The node (`GatewayNode`, in a child process of this script, so its RSS is its own) proxies to a
`lodestar inference serve --backend scripted` process. `--sessions-at-once` clients each run agent-shaped
sessions back to back: OpenSession, `--calls-per-session` non-streaming Anthropic Messages calls whose
bodies grow like a Claude Code session's (the 24-tool, ~80 KB request of bench/gateway.py, plus one tool
call and its ~3 KB result per turn), CloseSession. The child acknowledges a session when it is closed
(`Retention.reported(acknowledged=True)`, what the node lifecycle does once rollout holds a result), so
retention prunes it `--retention-s` later. A probe meanwhile times interleaved pairs of a direct
`InferenceService.Generate` and the same call through the gateway ("added latency"). At the end it checks
that nothing was lost: the last sessions closed still hold every call, and old ones are gone.

`--node-repo DIR` runs the node from another checkout (the old policy: `git worktree add /tmp/old c160404`),
`--compare DIR` runs this checkout, then DIR, one after the other against the same inference process.
`--rollout-store SECONDS` instead looks at the rollout service's SQLite store: its WAL under back-to-back
3 MB results, with an outside read-only reader holding one read transaction over the middle third.
Usage: `.venv/bin/python bench/capture_soak.py --duration-s 180 [--compare /tmp/old] [--log FILE]`,
`.venv/bin/python bench/capture_soak.py --rollout-store 12`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def node_main(config: dict[str, Any]) -> None:
    """The child: a gateway node from `config["repo"]` that acknowledges each session when it is closed."""
    sys.path.insert(0, config["repo"])
    from lodestar_gateway import capture
    from lodestar_gateway.server import GatewayNode
    from lodestar_gateway.settings import GatewaySettings

    async def run() -> None:
        settings = GatewaySettings(
            port=config["grpc_port"], http_port=config["http_port"], inference=config["inference"],
            data_dir=Path(config["data_dir"]), capture_retention_s=config["retention_s"],
            capture_sweep_s=config["sweep_s"],
        )  # fmt: skip
        node = GatewayNode(settings)
        close = node.sessions.close

        async def close_and_acknowledge(session_id: str) -> Any:
            entry = await close(session_id)
            await node.retention.reported(entry.session_id, acknowledged=True)
            return entry

        node.sessions.close = close_and_acknowledge  # type: ignore[method-assign]
        await node.start()
        await asyncio.to_thread(Path(config["data_dir"], "capture_module").write_text, capture.__file__)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await node.stop(5.0)
        checkpoints = [vars(c) for c in getattr(node.store, "checkpoints", [])]  # the last 64 (none: old policy)
        await asyncio.to_thread(Path(config["data_dir"], "checkpoints.json").write_text, json.dumps(checkpoints))

    asyncio.run(run())


def session_bodies(calls: int) -> list[bytes]:
    """The request bodies of one session's calls, encoded once: each extends the previous by a tool call and
    its result."""
    from bench.gateway import claude_code_body, filler

    body = claude_code_body(stream=False)
    out = []
    for turn in range(calls):
        out.append(json.dumps(body).encode())
        tool_id = f"toolu_{turn + 2:02d}"
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Bash",
                                               "input": {"param_0": f"pytest -x tests/test_{turn}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                          "content": filler(450, turn + 11)}]},
        ]  # fmt: skip
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_node(config: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    """The node's child process (its output goes to `log`)."""
    with log.open("wb") as out:
        command = [sys.executable, __file__, "--node", json.dumps(config)]
        return subprocess.Popen(command, cwd=config["repo"], stdout=out, stderr=subprocess.STDOUT)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def file_bytes(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def soak(args: argparse.Namespace, inference: str, repo: Path, work: Path) -> dict[str, Any]:
    """One side: start a node from `repo`, load it for args.duration_s, sample, check, stop it."""
    import aiohttp

    from bench.gateway import direct_request, wait_serving
    from lodestar.grpc.client import connect
    from lodestar.v1 import gateway_pb2, gateway_pb2_grpc, inference_pb2_grpc

    grpc_port, http_port = free_port(), free_port()
    data_dir = work / f"node-{repo.name}"
    config = {"repo": str(repo), "grpc_port": grpc_port, "http_port": http_port, "inference": inference,
              "data_dir": str(data_dir), "retention_s": args.retention_s, "sweep_s": args.sweep_s}  # fmt: skip
    child = start_node(config, work / f"node-{repo.name}.log")
    database = data_dir / "capture.sqlite"
    wal = data_dir / "capture.sqlite-wal"
    await wait_serving(f"127.0.0.1:{grpc_port}")
    module = (data_dir / "capture_module").read_text()
    base = f"http://127.0.0.1:{http_port}"
    gateway = gateway_pb2_grpc.GatewayServiceStub(connect(f"127.0.0.1:{grpc_port}"))
    direct = inference_pb2_grpc.InferenceServiceStub(connect(inference))
    bodies = session_bodies(args.calls_per_session)
    probe_direct = direct_request(json.loads(bodies[0]), False)
    started = time.monotonic()
    until = started + args.duration_s
    closed: list[tuple[float, str, int]] = []
    load_latency: list[float] = []
    added: list[float] = []
    samples: list[dict[str, Any]] = []

    async def open_key() -> tuple[str, str]:
        reply = await gateway.OpenSession(gateway_pb2.OpenSessionRequest(labels={"bench": "capture_soak"}))
        return reply.session.session_id, reply.session.session_key

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.sessions_at_once + 4)) as http:

        async def call(key: str, body: bytes) -> float:
            headers = {"Content-Type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
            begun = time.perf_counter()
            async with http.post(f"{base}/v1/messages", data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, await response.text()
            return time.perf_counter() - begun

        async def client() -> None:
            while time.monotonic() < until:
                session_id, key = await open_key()
                for body in bodies:
                    load_latency.append(await call(key, body))
                await gateway.CloseSession(gateway_pb2.CloseSessionRequest(session_id=session_id))
                closed.append((time.monotonic(), session_id, len(bodies)))

        async def probe() -> None:
            session_id, key = await open_key()
            while time.monotonic() < until:
                begun = time.perf_counter()
                async for _ in direct.Generate(probe_direct, timeout=60):
                    pass
                direct_s = time.perf_counter() - begun
                added.append(await call(key, bodies[0]) - direct_s)
                if len(added) % 1000 == 0:  # stay under the session's call quota
                    await gateway.CloseSession(gateway_pb2.CloseSessionRequest(session_id=session_id))
                    session_id, key = await open_key()
                await asyncio.sleep(args.probe_interval_s)

        async def sampler() -> None:
            while time.monotonic() < until + 0.5:
                samples.append({
                    "t": round(time.monotonic() - started, 1), "db": file_bytes(database), "wal": file_bytes(wal),
                    "rss": rss_bytes(child.pid), "calls": len(load_latency), "sessions": len(closed),
                    "load": os.getloadavg()[0],
                })  # fmt: skip
                await asyncio.sleep(args.sample_s)

        await asyncio.gather(*(client() for _ in range(args.sessions_at_once)), probe(), sampler())
        lost = await check_kept(gateway, closed, args.retention_s + 2 * args.sweep_s + 5)
    child.send_signal(signal.SIGTERM)
    await asyncio.to_thread(child.wait, 60)
    checkpoints = json.loads((data_dir / "checkpoints.json").read_text())
    summary = summarize(samples, load_latency, added, args) | rewinds(checkpoints)
    return {"repo": str(repo), "capture_module": module, "samples": samples, "lost": lost, "summary": summary}


def rewinds(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """The WAL checkpoints the node recorded: the writer's stall per rewind (median, largest), how many skipped."""
    if not checkpoints:
        return {}
    stalls = sorted(c["writer_s"] * 1e3 for c in checkpoints)
    return {
        "rewind_ms_p50": statistics.median(stalls),
        "rewind_ms_max": stalls[-1],
        "rewinds_skipped": sum(not c["restarted"] for c in checkpoints),
        "rewinds_seen": len(stalls),
    }


async def check_kept(gateway: Any, closed: list[tuple[float, str, int]], gone_after_s: float) -> dict[str, int]:
    """The last sessions closed hold every call; sessions closed long enough ago are gone (pruned)."""
    import grpc

    from lodestar.v1 import gateway_pb2

    now = time.monotonic()
    incomplete = still_there = 0
    for _, session_id, calls in closed[-10:]:
        reply = await gateway.GetSession(gateway_pb2.GetSessionRequest(session_id=session_id), timeout=60)
        incomplete += len(reply.calls) != calls
    old = [session_id for at, session_id, _ in closed if now - at > gone_after_s][-50:]
    for session_id in old:
        try:
            await gateway.GetSession(gateway_pb2.GetSessionRequest(session_id=session_id), timeout=60)
            still_there += 1
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
    return {"recent_checked": min(10, len(closed)), "recent_incomplete": incomplete,
            "old_checked": len(old), "old_still_there": still_there}  # fmt: skip


def summarize(samples: list[dict[str, Any]], latency: list[float], added: list[float], args: Any) -> dict[str, Any]:
    mib = 1024 * 1024
    warm = [s for s in samples if s["t"] >= args.duration_s / 4]  # after the first quarter
    total = [(s["db"] + s["wal"]) / mib for s in warm]
    return {
        "calls_per_s": samples[-1]["calls"] / samples[-1]["t"],
        "sessions": samples[-1]["sessions"],
        "db_wal_mib_at_quarter": total[0],
        "db_wal_mib_max_after": max(total),
        "db_wal_mib_end": total[-1],
        "wal_mib_max": max(s["wal"] for s in samples) / mib,
        "wal_mib_end": samples[-1]["wal"] / mib,
        "db_mib_end": samples[-1]["db"] / mib,
        "rss_mib_quarter": warm[0]["rss"] / mib,
        "rss_mib_end": samples[-1]["rss"] / mib,
        "call_p50_ms": statistics.median(latency or [math.nan]) * 1e3,
        "call_p99_ms": sorted(latency or [math.nan])[int(0.99 * len(latency))] * 1e3,
        "added_p50_ms": statistics.median(added) * 1e3,
        "added_p99_ms": sorted(added)[int(0.99 * len(added))] * 1e3,
        "probes": len(added),
        "load_median": statistics.median(s["load"] for s in samples),
    }


ROWS = [
    ("calls/s (all clients)", "calls_per_s", "{:.0f}"),
    ("sessions completed", "sessions", "{}"),
    ("database + WAL after the first quarter (MiB)", "db_wal_mib_at_quarter", "{:.0f}"),
    ("database + WAL, most after that (MiB)", "db_wal_mib_max_after", "{:.0f}"),
    ("database + WAL at the end (MiB)", "db_wal_mib_end", "{:.0f}"),
    ("WAL, most (MiB)", "wal_mib_max", "{:.0f}"),
    ("WAL at the end (MiB)", "wal_mib_end", "{:.0f}"),
    ("node RSS after the first quarter / at the end (MiB)", ("rss_mib_quarter", "rss_mib_end"), "{:.0f} / {:.0f}"),
    ("call latency p50 / p99 (ms)", ("call_p50_ms", "call_p99_ms"), "{:.1f} / {:.1f}"),
    ("added latency p50 / p99, probe pairs (ms)", ("added_p50_ms", "added_p99_ms"), "{:.2f} / {:.2f}"),
    ("load average (1 min), median", "load_median", "{:.1f}"),
    ("writer thread in a rewind, p50 / max of the last 64 (ms)", ("rewind_ms_p50", "rewind_ms_max"), "{:.1f} / {:.1f}"),
    ("rewinds left to the next checkpoint, of the last 64", "rewinds_skipped", "{}"),
]


def table(results: list[dict[str, Any]]) -> str:
    header = "| measure | " + " | ".join(Path(r["repo"]).name for r in results) + " |"
    lines = [header, "|---|" + "---:|" * len(results)]
    for name, keys, fmt in ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        cells = [fmt.format(*(r["summary"][k] for k in keys)) if keys[0] in r["summary"] else "-" for r in results]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    kept = [r["lost"] for r in results]
    cells = [f"{k['recent_incomplete']}/{k['recent_checked']}, {k['old_still_there']}/{k['old_checked']}" for k in kept]
    lines.append("| recent sessions incomplete / old sessions not pruned | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rollout_store_look(seconds: float, result_bytes: int = 3 * 1024 * 1024) -> list[dict[str, float]]:
    """The rollout service's SQLite store (lodestar_rollout/store.py, its own settings) written continuously
    with session results of `result_bytes`, while an outside read-only reader (as `lodestar export` opens it)
    holds one read transaction over the middle third; its WAL size sampled once per 20 results."""
    import sqlite3

    from lodestar_rollout.store import SqliteStore

    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-store-") as tmp:
        path = Path(tmp) / "rollout.sqlite"
        store = SqliteStore(path)
        wal = path.with_name(path.name + "-wal")
        blob, started, count = os.urandom(result_bytes), time.monotonic(), 0
        reader: sqlite3.Connection | None = None
        while (elapsed := time.monotonic() - started) < seconds:
            if reader is None and seconds / 3 <= elapsed < 2 * seconds / 3:
                reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
                reader.execute("BEGIN")
                reader.execute("SELECT COUNT(*) FROM results").fetchone()
            elif reader is not None and elapsed >= 2 * seconds / 3:
                reader.execute("COMMIT")
                reader.close()
                reader = None
                samples.append({"t": round(elapsed, 2), "wal": file_bytes(wal), "db": file_bytes(path), "event": 1})
            store._transaction([("INSERT INTO results (session_id, attempt, node_id, counted, result) "
                                 "VALUES (?, 0, 'n', 1, ?)", (f"s{count}", blob))])  # fmt: skip
            count += 1
            if count % 20 == 0:
                samples.append({"t": round(elapsed, 2), "wal": file_bytes(wal), "db": file_bytes(path),
                                "reader": float(reader is not None)})  # fmt: skip
        store.close()
    return samples


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--node":
        node_main(json.loads(sys.argv[2]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--rollout-store":
        sys.path.insert(0, str(REPO))
        for sample in rollout_store_look(float(sys.argv[2])):
            print(json.dumps(sample))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=240.0, help="load time per side")
    parser.add_argument("--sessions-at-once", type=int, default=12, help="clients, each running sessions")
    parser.add_argument("--calls-per-session", type=int, default=19)
    parser.add_argument("--retention-s", type=float, default=20.0, help="capture_retention_s of the node")
    parser.add_argument("--sweep-s", type=float, default=5.0, help="capture_sweep_s of the node")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--probe-interval-s", type=float, default=0.1)
    parser.add_argument("--node-repo", type=Path, default=REPO, help="checkout the node runs from")
    parser.add_argument("--compare", type=Path, default=None, help="then a second side from this checkout")
    parser.add_argument("--log", type=Path, default=None, help="write every sample and result (JSON lines) here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.gateway import start, wait_serving

    with tempfile.TemporaryDirectory(prefix="bench-capture-soak-") as tmp:
        work = Path(tmp)
        from lodestar_inference.tiny_model import TinyModelSpec, build

        model = build(work / "model", TinyModelSpec())
        script = work / "script.json"
        script.write_text(json.dumps({"replies": [], "default": {"text": "OK."}}))
        inference = f"127.0.0.1:{free_port()}"
        command = ["inference", "serve", "--backend", "scripted", "--model", str(model), "--script", str(script)]
        server = start([*command, "--port", inference.split(":")[1]], work / "inference.log")
        results = []
        try:
            asyncio.run(wait_serving(inference))
            for repo in [args.node_repo] + ([args.compare] if args.compare else []):
                results.append(asyncio.run(soak(args, inference, repo.resolve(), work)))
                print(json.dumps(results[-1]["summary"]), flush=True)
        finally:
            server.terminate()
            server.wait(30)
    if args.log:
        with args.log.open("w") as out:
            out.write(json.dumps({"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
            for result in results:
                out.write(json.dumps(result) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
