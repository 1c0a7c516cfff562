"""`lodestar up`: a local etcd and all four services as supervised processes on loopback.

Starts etcd (the `etcd` binary from Debian's `etcd-server`), then inference, rollout (store under the data
directory), gateway (a node attached to rollout: it pulls and runs the sessions of runs created with
`lodestar run create SPEC --rollout ADDRESS`) and trainer, each as `python -m lodestar_app.cli.main <service>
serve` on a free port, waits until every gRPC
health check answers SERVING, prints the addresses, and supervises: a service that exits is restarted
(at most `--max-restarts` times). Ctrl-C / SIGTERM stops everything (services drain first, etcd last).
With `--check` it exits 0 right after the self-check instead of serving. While up, the addresses and the served
model are in `<data-dir>/addresses.json` (`lodestar train` attaches through it).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lodestar.errors import UnavailableError
from lodestar.grpc import security
from lodestar_app.cli import up_tls
from lodestar_app.cli.dashboard import DEFAULT_RUNS_DIR, start_local
from lodestar_app.cli.model import ensure_tiny_model
from lodestar_app.cli.train_stack import write_addresses
from lodestar_app.local import LocalCluster, ServiceSpec, find_etcd, port_or_free

if TYPE_CHECKING:
    from lodestar_app.dashboard.server import Dashboard

_console = Console(stderr=True)
DEFAULT_PORTS = {"inference": 50051, "gateway": 50052, "rollout": 50053, "trainer": 50054}
"""The services' own default gRPC ports (their settings' defaults)."""
DEFAULT_HTTP_PORT = 8080
BACKENDS = ("transformers", "vllm", "scripted")
"""The inference backends (`InferenceSettings.backend`)."""


def _service_specs(args: argparse.Namespace, data_dir: Path, etcd_url: str) -> list[ServiceSpec]:
    # Each service's own default port when free (predictable addresses), else any free port.
    ports = {name: port_or_free(DEFAULT_PORTS[name]) for name in ("inference", "rollout", "gateway", "trainer")}
    http_port = args.http_port or port_or_free(DEFAULT_HTTP_PORT)
    inference_args = ["--backend", args.backend, "--model", str(args.model or data_dir / "tiny-model")]
    return [
        ServiceSpec("inference", ports["inference"], inference_args),
        ServiceSpec(
            "rollout",
            ports["rollout"],
            ["--etcd", etcd_url, "--store", str(data_dir / "rollout.sqlite")],
        ),
        ServiceSpec(
            "gateway",
            ports["gateway"],
            [
                "--http-port",
                str(http_port),
                "--inference",
                f"127.0.0.1:{ports['inference']}",
                "--rollout",
                f"127.0.0.1:{ports['rollout']}",
                "--etcd",
                etcd_url,
                "--data-dir",
                str(data_dir / "gateway"),
                "--slots",
                str(args.slots),
                "--ready-buffer",
                str(args.ready_buffer),
            ],
            http_port=http_port,
        ),
        ServiceSpec(
            "trainer",
            ports["trainer"],
            [
                "--rollout",
                f"127.0.0.1:{ports['rollout']}",
                "--inference",
                f"127.0.0.1:{ports['inference']}",
                "--checkpoints.dir",
                str(data_dir / "checkpoints"),
            ],
        ),
    ]


def _print_addresses(cluster: LocalCluster) -> None:
    table = Table(title="lodestar is up", show_lines=False)
    table.add_column("service")
    table.add_column("address")
    table.add_column("status")
    table.add_column("log")
    table.add_row("etcd", cluster.etcd_url, "healthy", str(cluster.etcd_log))
    for spec in cluster.specs:
        address = f"127.0.0.1:{spec.port}"
        if spec.http_port:
            address += f"  (HTTP http://127.0.0.1:{spec.http_port})"
        table.add_row(spec.name, address, "SERVING", str(cluster.log_path(spec)))
    _console.print(table)


async def _up(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    etcd = find_etcd()
    cluster = LocalCluster(data_dir, etcd_binary=etcd, max_restarts=args.max_restarts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    dashboard: Dashboard | None = None
    try:
        if args.model is None:
            await ensure_tiny_model(data_dir / "tiny-model", _console)
        with _console.status("starting etcd"):  # with --tls: TLS, client certificates and auth on
            await cluster.start_etcd(timeout=args.start_timeout_s, tls=up_tls.etcd(data_dir) if args.tls else None)
        specs = _service_specs(args, data_dir, cluster.etcd_url)
        secured: dict[str, str] = {}
        if args.tls:
            client, pki, token_file = up_tls.secure(specs, data_dir)
            security.configure(client)
            _console.print(f"TLS: CA {pki.ca}, client certificate {client.tls_cert}, token in {token_file}")
            secured = {"tls": str(data_dir / "tls")}  # `lodestar train` attaches with the client identity
        with _console.status("starting inference, rollout, gateway, trainer"):
            await cluster.start_services(specs, timeout=args.start_timeout_s)
        _print_addresses(cluster)
        addresses = {spec.name: f"127.0.0.1:{spec.port}" for spec in cluster.specs}
        addresses |= {"etcd": cluster.etcd_url, "model": str(args.model or data_dir / "tiny-model"), **secured}
        write_addresses(data_dir / "addresses.json", addresses)  # `lodestar train` attaches through it
        if args.dashboard:
            model = Path(addresses["model"])
            dashboard = await start_local(addresses["rollout"], DEFAULT_RUNS_DIR.resolve(), model)
            _console.print(f"dashboard: {dashboard.url}  (runs of `lodestar train` under {DEFAULT_RUNS_DIR})")
        if args.check:
            _console.print("[green]self-check passed: every service is SERVING[/green]")
            return 0
        _console.print("Ctrl-C stops everything.")
        supervisor = asyncio.create_task(cluster.supervise())
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({supervisor, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (supervisor, stopper):
            task.cancel()
        if supervisor in done and supervisor.exception() is not None:
            raise supervisor.exception()  # type: ignore[misc]
        return 0
    except UnavailableError as error:
        _console.print(f"[red]lodestar up failed: {error.message}[/red]")
        return 1
    finally:
        if dashboard is not None:
            await dashboard.close()
        (data_dir / "addresses.json").unlink(missing_ok=True)
        with _console.status("stopping (services drain, then etcd)"):
            await cluster.stop()


def _handle(args: argparse.Namespace) -> int:
    return asyncio.run(_up(args))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="run a local etcd and all four services on loopback")
    parser.add_argument("--data-dir", type=Path, default=Path(".lodestar/up"), help="state and logs")
    parser.add_argument(
        "--backend", default="transformers", choices=BACKENDS, help="inference backend (default transformers)"
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory to serve (default: build the offline tiny model)"
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=0,
        help="gateway vendor-API port (default 8080, or a free port when 8080 is taken)",
    )
    parser.add_argument("--slots", type=int, default=4, help="sessions the gateway node runs at once")
    parser.add_argument("--ready-buffer", type=int, default=2, help="prepared sessions waiting for a run slot")
    parser.add_argument(
        "--start-timeout-s", type=float, default=120.0, help="seconds each service may take to serve (default 120)"
    )
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts per crashed service")
    parser.add_argument("--check", action="store_true", help="exit after the self-check passes")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS + a control-plane token, etcd with TLS and auth (local CA made in <data-dir>/tls)",
    )
    parser.add_argument(
        "--dashboard", action="store_true", help="also serve the run dashboard on loopback (docs/dashboard.md)"
    )
    parser.set_defaults(handler=_handle)
