"""Weight sync: seconds and bytes to make 1 and 3 inference replicas serve a new policy version, per transport
(`weights_transport`: grpc = today's UpdateWeights stream per replica; shared_fs = written once, path sent;
broadcast = gloo broadcast, gRPC control plane), and the trainer's time per step spent waiting on a push.

Replicas are real `lodestar inference serve` processes (transformers backend) on this machine; the trainer
side is the real publisher in this process. One push is timed from the trainer holding its fp32 state to every
replica answering that it serves the version (serialization in the serving dtype, transfer, the replicas'
validation and swap). Models: SmolLM2-135M (.lodestar/models/smollm2, served in fp32) and a random-weight
Qwen2-shaped model of ~0.5B parameters (served in bf16, the dtype a GPU replica serves in, so its payload is
the same 1 GB a GPU push carries).

The step table runs real optimizer steps of SmolLM2-135M (forward + backward + AdamW on one 256-token
sequence) followed by a push to 3 replicas: synchronously over gRPC, and with `async_push` over shared_fs
and broadcast, and reports the seconds each step waited for publishing (the snapshot copy and any wait for
the push before).

    .venv/bin/python bench/weights.py [--repeats 3] [--skip-large] [--write-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.docs_section import replace_section  # noqa: E402
from bench.inference_servers import ServerProcess, serve_inference  # noqa: E402
from lodestar_trainer.model import dedupe_tied, load_model  # noqa: E402
from lodestar_trainer.weights.broadcast import BroadcastPublisher  # noqa: E402
from lodestar_trainer.weights.publish import FanoutPublisher  # noqa: E402
from lodestar_trainer.weights.pushing import BackgroundPush  # noqa: E402
from lodestar_trainer.weights.shared_fs import SharedFsPublisher  # noqa: E402

SMOLLM2 = REPO / ".lodestar" / "models" / "smollm2"
SHARED = Path("/dev/shm/lodestar-bench-weights")
TRANSPORTS = ("grpc", "shared_fs", "broadcast")


def build_large(directory: Path) -> Path:
    """A random Qwen2 model of ~0.5B parameters (30 layers of Qwen2.5-0.5B's shape, SmolLM2's tokenizer)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=49152,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=30,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "lodestar.json"):
        shutil.copy(SMOLLM2 / name, directory / name)
    return directory


@contextlib.contextmanager
def replicas(model: Path, count: int, logs: Path, dtype: str) -> Iterator[list[ServerProcess]]:
    extra = ("--checkpoint-dirs", str(SHARED), "--dtype", dtype, "--max-batch-size", "1")
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_inference("transformers", model, logs, *extra)) for _ in range(count)]


def check_alive(servers: list[ServerProcess]) -> None:
    """A replica that died during a row makes the row's figures a push to fewer replicas: stop, say why."""
    dead = [server for server in servers if server.process.poll() is not None]
    if dead:
        tails = "\n".join(
            f"{server.address} exited {server.process.returncode}:\n{server.log()[-2000:]}" for server in dead
        )
        raise SystemExit(f"{len(dead)} of {len(servers)} replicas died during the benchmark\n{tails}")


def publisher(transport: str, addresses: list[str]) -> Any:
    if transport == "grpc":
        return FanoutPublisher(addresses, timeout_s=600, attempts=1)
    if transport == "shared_fs":
        return SharedFsPublisher(addresses, SHARED, timeout_s=600, attempts=1)
    return BroadcastPublisher(addresses, broadcast_timeout_s=300, timeout_s=600, attempts=1)


def time_pushes(transport: str, addresses: list[str], state: dict[str, torch.Tensor], repeats: int) -> dict[str, Any]:
    """Median seconds of `repeats` pushes after one warm-up, and the payload's size."""
    pub = publisher(transport, addresses)
    try:
        version = pub.served_version() + 1
        pub.publish(state, version)  # warm-up: channels, the replicas' first swap
        seconds, payload = [], 0
        for _ in range(repeats):
            version += 1
            result = pub.publish(state, version)
            seconds.append(result.seconds)
            payload = result.payload_bytes
        by_broadcast = len(getattr(pub, "last_broadcast", addresses))
    finally:
        pub.close()
    moved = payload if transport == "shared_fs" else payload * len(addresses)
    return {"seconds": statistics.median(seconds), "all": seconds, "payload": payload, "moved": moved,
            "by_broadcast": by_broadcast}  # fmt: skip


def step_waits(addresses: list[str], model_dir: Path, steps: int) -> dict[str, dict[str, float]]:
    """Real SmolLM2 steps, each followed by a push to `addresses`: before (sync gRPC) and after (async_push
    over shared_fs and broadcast). Per mode: median step seconds, median seconds waited on publishing."""
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    tokens = torch.randint(0, int(model.config.vocab_size), (1, 256))

    def train_step() -> None:
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    results: dict[str, dict[str, float]] = {}
    for mode in ("grpc synchronous", "shared_fs async_push", "broadcast async_push"):
        transport = mode.split()[0]
        pub = publisher(transport, addresses)
        version = pub.served_version()
        pusher = BackgroundPush(pub, lambda _version: None) if "async" in mode else None
        totals, waits = [], []
        try:
            for _ in range(steps + 1):  # the first step warms up
                started = time.perf_counter()
                train_step()
                version += 1
                state = dedupe_tied(model, {k: v.detach() for k, v in model.state_dict().items()})
                publishing = time.perf_counter()  # the trainer's thread: serializing, and any wait
                if pusher is None:
                    pub.publish(state, version)
                else:
                    pusher.submit(state, version)
                ended = time.perf_counter()
                totals.append(ended - started)
                waits.append(ended - publishing)
            if pusher is not None:
                pusher.close()
        finally:
            pub.close()
        total, wait = statistics.median(totals[1:]), statistics.median(waits[1:])
        results[mode] = {"step": total, "wait": wait, "share": wait / total}
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    SHARED.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lodestar-bench-weights-"))
    models: list[tuple[str, Path, str]] = [("SmolLM2-135M (fp32)", SMOLLM2, "float32")]
    if not args.skip_large:
        models.append(("random 0.5B (bf16)", build_large(work / "large"), "bfloat16"))
    rows: list[dict[str, Any]] = []
    steps: dict[str, dict[str, float]] = {}
    try:
        for name, model_dir, dtype in models:
            model = load_model(model_dir)
            state = dedupe_tied(model, dict(model.state_dict()))
            params = sum(t.numel() for t in state.values())
            for count in (1, 3):
                with replicas(model_dir, count, work, dtype) as servers:
                    addresses = [server.address for server in servers]
                    for transport in TRANSPORTS:
                        row = time_pushes(transport, addresses, state, args.repeats)
                        check_alive(servers)
                        row |= {"model": name, "params": params, "replicas": count, "transport": transport}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                    if count == 3 and model_dir == SMOLLM2 and not args.skip_steps:
                        del model, state
                        steps = step_waits(addresses, model_dir, args.steps)
                        check_alive(servers)
                        print(json.dumps(steps), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(SHARED, ignore_errors=True)
    return {"rows": rows, "steps": steps}


def section(results: dict[str, Any], repeats: int) -> str:
    lines = [
        "## Weight sync: grpc vs shared_fs vs broadcast (bench/weights.py)",
        "",
        f"{time.strftime('%Y-%m-%d')}, the machine above ({platform.machine()}, 2 shared cores, load from other "
        "work), torch "
        f"{torch.__version__}. Replicas: `lodestar inference serve --backend transformers` processes on this "
        "machine; a push is timed from the trainer's fp32 state to every replica serving the version "
        f"(serialize, transfer, validate, swap). Median of {repeats} pushes after a warm-up, all in one run.",
        "",
        "| model | replicas | transport | seconds (median) | each push | vs grpc | payload MB | MB moved |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple[str, int], float] = {}
    for row in results["rows"]:
        key = (row["model"], row["replicas"])
        if row["transport"] == "grpc":
            base[key] = row["seconds"]
        ratio = base[key] / row["seconds"] if key in base else 1.0
        lines.append(
            f"| {row['model']} | {row['replicas']} | {row['transport']} | {row['seconds']:.2f} | "
            f"{' / '.join(f'{t:.1f}' for t in row['all'])} | {ratio:.1f}x | {row['payload'] / 1e6:.0f} | "
            f"{row['moved'] / 1e6:.0f} |"
        )
    if results["steps"]:
        lines += [
            "",
            "Trainer time per step spent waiting on publishing: SmolLM2-135M, one 256-token sequence per step "
            "(forward, backward, AdamW), 3 replicas, median of the steps after a warm-up:",
            "",
            "| mode | step seconds | waited on publishing | share of the step |",
            "|---|---|---|---|",
        ]
        for mode, row in results["steps"].items():
            lines.append(f"| {mode} | {row['step']:.2f} | {row['wait']:.2f} | {100 * row['share']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, *, report: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip-large", action="store_true", help="SmolLM2-135M only")
    parser.add_argument("--skip-steps", action="store_true", help="no trainer step table")
    parser.add_argument("--write-docs", action="store_true", help="replace the section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    results = run(args)
    text = section(results, args.repeats)
    report(text)
    if args.write_docs:
        replace_section(text.splitlines()[0], text)


if __name__ == "__main__":
    main()
