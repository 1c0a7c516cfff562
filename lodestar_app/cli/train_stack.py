"""The services `lodestar train` trains against: a running `lodestar up` stack, or its own.

Attaching: `lodestar up` records its addresses and served model in `<data-dir>/addresses.json` (default
`.lodestar/up/addresses.json`). With `attach = "auto"` (the default) `lodestar train` uses that stack when the
file exists and its rollout answers SERVING; `attach = "never"` always starts its own; any other value names
an addresses file that must be up. A stack of `lodestar up --tls` is attached to with its `client` certificate
and token, and the trainer started on it gets the `trainer` one. Any other secured stack is attached to with
`lodestar train`'s own TLS and token flags (`--tls-ca`, `--tls-cert`, `--tls-key`, `--auth-token-file`),
which the trainer started on it gets too (it serves and calls with them: a `--tls-cert` must name localhost);
the stack `lodestar train` starts itself is plaintext on loopback, so those flags without a stack to attach
to are refused. Its own stack is what `lodestar up` starts minus the idle trainer: etcd, inference (the
tiny model unless `model` is set; `inference_replicas` of them), rollout and one gateway node, under
`data_dir`; the node starts only once the trainer serves (`start_node`), so no sessions pile up under the
initial policy while the trainer imports torch. The trainer itself is always a process of its own
(`lodestar trainer serve` with the run, the model and the config file's `[trainer]` table), so `lodestar up`'s
idle trainer stays idle.

Several replicas (`inference_replicas` > 1) register in the stack's etcd, and the gateway node and the
trainer find them there (`--inference-discovery etcd`): a replica that dies leaves their view a lease TTL
(5 s) later, its sessions' next calls go to the others, and pushes skip it, so the run goes on. Nothing
restarts it (`lodestar up` restarts its services; `lodestar train` does not).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.grpc import security
from lodestar_app.cli import up_tls
from lodestar_app.cli.model import ensure_tiny_model
from lodestar_app.cli.train_config import UP_ADDRESSES, TrainConfig
from lodestar_app.local import LocalCluster, ServiceSpec, find_etcd, free_port, wait_serving

REPLICA_LEASE_TTL_S = 5
"""etcd lease TTL of the inference replicas of an own stack: a replica that dies leaves discovery after it."""


@dataclass
class Stack:
    inference: str
    rollout: str
    model: Path
    cluster: LocalCluster | None = None
    """Set when this process started the stack (and stops it)."""
    node: ServiceSpec | None = None
    """The gateway node of a stack this process starts, started by `start_node` once the trainer serves."""
    attached: Path | None = None
    """The addresses file of the `lodestar up` stack attached to."""
    tls_dir: Path | None = None
    """Where the attached `lodestar up --tls` stack keeps its CA, certificates and token."""
    client: list[str] = field(default_factory=list)
    """The TLS and token flags `lodestar train` attached with (another secured stack); its trainer gets them."""
    discovery_etcd: str = ""
    """The etcd the inference replicas register in, when the gateway and trainer find them there (an own stack
    with several replicas)."""


def write_addresses(path: Path, addresses: dict[str, str]) -> None:
    """Record a stack's addresses (`lodestar up` calls this once every service is SERVING)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(addresses, indent=2) + "\n")


def _read_addresses(path: Path) -> dict[str, str]:
    addresses: dict[str, str] = json.loads(path.read_text())
    return addresses


async def _attach(path: Path) -> Stack | None:
    """The stack recorded in `path` when it serves; a `lodestar up --tls` stack also makes this process a
    client with its `client` identity and token (the process's security is left as it was otherwise)."""
    try:
        addresses = await asyncio.to_thread(_read_addresses, path)
        tls_dir = Path(addresses["tls"]) if addresses.get("tls") else None
        stack = Stack(
            addresses["inference"], addresses["rollout"], Path(addresses["model"]), attached=path, tls_dir=tls_dir
        )
        before = security.current()
        if tls_dir is not None:
            security.configure(await asyncio.to_thread(up_tls.client, tls_dir))
    except (OSError, ValueError, KeyError):
        return None
    try:
        await wait_serving(stack.rollout, timeout=3.0)
        await wait_serving(stack.inference, timeout=3.0)
    except UnavailableError:
        security.configure(before)
        return None
    return stack


async def _start_own(config: TrainConfig, console: Console) -> Stack:
    data_dir = config.data_dir
    model = config.model or data_dir / "tiny-model"
    if config.model is None:
        await ensure_tiny_model(model, console)
    cluster = LocalCluster(data_dir, etcd_binary=find_etcd(), max_restarts=0)
    ports = {name: free_port() for name in ("rollout", "gateway", "http")}
    replicas = [
        ("inference" if i == 0 else f"inference-{i + 1}", free_port()) for i in range(config.inference_replicas)
    ]
    inference = ",".join(f"127.0.0.1:{port}" for _, port in replicas)
    rollout = f"127.0.0.1:{ports['rollout']}"
    stack = Stack(inference, rollout, model, cluster=cluster)
    try:
        with console.status("starting etcd"):
            await cluster.start_etcd(timeout=config.start_timeout_s)
        (data_dir / "rollout.sqlite").unlink(missing_ok=True)
        gateway_args = ["--http-port", str(ports["http"]), "--inference", inference, "--rollout", rollout]
        gateway_args += ["--etcd", cluster.etcd_url, "--data-dir", str(data_dir / "gateway")]
        gateway_args += ["--slots", str(config.slots), "--ready-buffer", str(config.ready_buffer)]
        serve = ["--backend", config.backend, "--model", str(model)]
        if config.max_new_tokens is not None:
            serve += ["--max-new-tokens", str(config.max_new_tokens)]
        if config.vllm_lora is not None:
            serve += ["--vllm-lora", config.vllm_lora]
        if len(replicas) > 1:  # replicas register in etcd; the gateway and the trainer follow them there
            stack.discovery_etcd = cluster.etcd_url
            serve += ["--etcd", cluster.etcd_url, "--etcd-lease-ttl-s", str(REPLICA_LEASE_TTL_S)]
            gateway_args += ["--inference-discovery", "etcd"]
        specs = [
            *(ServiceSpec(name, port, [*serve, "--replica-id", name], command="inference") for name, port in replicas),
            ServiceSpec(
                "rollout", ports["rollout"], ["--etcd", cluster.etcd_url, "--store", f"{data_dir}/rollout.sqlite"]
            ),
        ]
        with console.status("starting inference and rollout"):
            await cluster.start_services(specs, timeout=config.start_timeout_s)
        stack.node = ServiceSpec("gateway", ports["gateway"], gateway_args, http_port=ports["http"])
    except BaseException:
        await cluster.stop()
        raise
    return stack


async def open_stack(config: TrainConfig, console: Console, client: list[str] | None = None) -> Stack:
    """Attach to `lodestar up` or start a stack (see the module docstring); `client`: the TLS and token flags
    `lodestar train` was given, for attaching only."""
    if config.attach != "never":
        path = UP_ADDRESSES if config.attach == "auto" else Path(config.attach)
        stack = await _attach(path)
        if stack is not None:
            console.print(f"attached to the lodestar up stack recorded in {path}")
            if stack.tls_dir is None:
                stack.client = list(client or [])
            return stack
        if config.attach != "auto":
            raise UnavailableError(f"no running stack at the addresses in {path} (is `lodestar up` running?)")
    if client:
        raise InvalidArgumentError(
            "the TLS and token flags are for attaching to a secured stack; the one lodestar train starts itself "
            "is plaintext on loopback (no stack to attach to answered)"
        )
    return await _start_own(config, console)


async def start_trainer(config: TrainConfig, stack: Stack, run_id: str) -> tuple[LocalCluster, str]:
    """`lodestar trainer serve` on the run (logs in <run_dir>/logs/trainer.log); returns it and its address."""
    cluster = LocalCluster(config.run_dir, etcd_binary="", max_restarts=0)
    port = free_port()
    args = ["--config", str(config.config_path), "--run", run_id, "--model", str(stack.model)]
    args += ["--run-dir", str(config.run_dir), "--steps", str(config.steps)]
    args += ["--rollout", stack.rollout, "--inference", stack.inference]
    if stack.discovery_etcd:
        args += ["--inference-discovery", "etcd", "--etcd", stack.discovery_etcd]
    if stack.tls_dir is not None:  # an up --tls stack: the trainer serves and calls with its own identity
        args += await asyncio.to_thread(up_tls.service_args, stack.tls_dir, "trainer")
    else:  # another secured stack: the identity lodestar train attached with
        args += stack.client
    try:
        await cluster.start_services([ServiceSpec("trainer", port, args)], timeout=config.start_timeout_s)
    except BaseException:
        await cluster.stop()
        raise
    return cluster, f"127.0.0.1:{port}"


async def start_node(config: TrainConfig, stack: Stack) -> None:
    """Start the gateway node of an own stack (after the trainer is up, so the first groups are fresh)."""
    if stack.cluster is None or stack.node is None or stack.node in stack.cluster.specs:
        return  # attached, or started already (the [eval] before training starts it first)
    started = stack.cluster.specs
    await stack.cluster.start_services([stack.node], timeout=config.start_timeout_s)
    stack.cluster.specs = [*started, stack.node]  # start_services keeps only the last list: stop all


async def close(*clusters: LocalCluster | None) -> None:
    """Stop the given clusters (each drains its services), in order, shielded from cancellation."""
    for cluster in clusters:
        if cluster is not None:
            await asyncio.shield(cluster.stop())
