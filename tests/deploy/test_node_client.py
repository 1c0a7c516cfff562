"""The Node.js client (clients/node, @grpc/grpc-js with the protos loaded from protos/) against running
services: scripted inference, rollout (with etcd) and a gateway node, each its own `lodestar <svc> serve`
process with mutual TLS and the control-plane token. The client opens a gateway session, streams a
generation from InferenceService.Generate and reads the run from RolloutService.GetRun."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from lodestar.grpc import security
from lodestar.grpc.client import connect
from lodestar.grpc.security import Security
from lodestar.tls import ensure_local_pki
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import LocalCluster, ServiceSpec, find_etcd, free_port
from lodestar_inference.tiny_model import TinyModelSpec, build
from tests.rollout.helpers import make_spec

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "node"
TOKEN = "node-client-token"


def _tls_flags(pki_dir: Path, name: str) -> list[str]:
    return [
        "--tls-cert",
        str(pki_dir / f"{name}.pem"),
        "--tls-key",
        str(pki_dir / f"{name}-key.pem"),
        "--tls-ca",
        str(pki_dir / "ca.pem"),
        "--auth-token",
        TOKEN,
    ]


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, str]]:
    """The three services, started once for this module's tests."""
    tmp_path = tmp_path_factory.mktemp("node-client")
    pki = ensure_local_pki(tmp_path / "pki")
    model = build(tmp_path / "tiny-model", TinyModelSpec())
    before = security.current()
    client = pki.identities["client"]
    security.configure(Security(client.cert, client.key, pki.ca, TOKEN))
    cluster = LocalCluster(tmp_path / "up", etcd_binary=find_etcd(), max_restarts=0)
    ports = {name: free_port() for name in ("inference", "rollout", "gateway")}
    addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    try:
        await cluster.start_etcd(timeout=30)
        args = {
            "inference": ["--backend", "scripted", "--model", str(model)],
            "rollout": ["--etcd", cluster.etcd_url, "--store", str(tmp_path / "rollout.sqlite")],
            "gateway": ["--http-port", str(free_port()), "--inference", addresses["inference"]],
        }
        args["gateway"] += ["--data-dir", str(tmp_path / "gateway")]
        specs = [ServiceSpec(name, ports[name], [*args[name], *_tls_flags(pki.ca.parent, name)]) for name in args]
        await cluster.start_services(specs, timeout=90)
        yield {**addresses, "pki": str(pki.ca.parent)}
    finally:
        await cluster.stop()
        security.configure(before)


async def _node(*args: str) -> tuple[int, str, str]:
    node = shutil.which("node")
    assert node is not None, "node not found (Node.js 20 is a prerequisite of `make test`)"
    process = await asyncio.create_subprocess_exec(
        node, str(CLIENT / "demo.js"), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_node_client_opens_a_session_streams_a_generation_and_reads_a_run(stack: dict[str, str]) -> None:
    assert (CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make node-client` (npm ci in clients/node)"
    channel = connect(stack["rollout"])
    reply = await rollout_pb2_grpc.RolloutServiceStub(channel).CreateRun(
        rollout_pb2.CreateRunRequest(spec=make_spec(tasks=2, group_size=2))
    )
    await channel.close()
    run_id = reply.run.run_id
    pki = Path(stack["pki"])
    tls = [
        "--tls-ca",
        str(pki / "ca.pem"),
        "--tls-cert",
        str(pki / "client.pem"),
        "--tls-key",
        str(pki / "client-key.pem"),
    ]
    code, out, err = await _node(
        "--gateway", stack["gateway"], "--inference", stack["inference"], "--rollout", stack["rollout"],
        "--run", run_id, *tls, "--token", TOKEN,
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["session"]["has_key"] is True
    assert result["session"]["session_id"]
    assert result["generate"]["text"] == "Hello from the scripted engine."
    assert result["generate"]["final_text"] == result["generate"]["text"]
    assert result["generate"]["tokens"] == result["generate"]["logprobs"] > 0
    assert result["generate"]["finish_reason"] == "FINISH_REASON_STOP"
    assert result["run"] == {"run_id": run_id, "state": "RUN_STATE_RUNNING", "sessions_pending": 4}

    # Without a client certificate the handshake fails and the client says so (exit 1).
    code, _, err = await _node("--gateway", stack["gateway"], "--inference", stack["inference"], "--tls-ca", tls[1])
    assert code == 1
    assert "14 " in err  # UNAVAILABLE: no TLS session without a client certificate


async def test_the_client_loads_the_protos_from_the_repository() -> None:
    """The client reads protos/ (no generated copy to drift)."""
    assert "protos" in (CLIENT / "lodestar.js").read_text()
    assert not list(CLIENT.glob("*_pb.js"))
    assert sys.version_info >= (3, 11)


async def _run(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_the_grpcurl_and_buf_curl_examples_of_docs_grpc_md(stack: dict[str, str]) -> None:
    """docs/grpc.md's secured forms: grpcurl and buf curl with the CA, a client certificate and the token."""
    pki = Path(stack["pki"])
    grpcurl = str(REPO / ".venv" / "bin" / "grpcurl")
    buf = str(REPO / "node_modules" / ".bin" / "buf")
    tls = ["-cacert", str(pki / "ca.pem"), "-cert", str(pki / "client.pem"), "-key", str(pki / "client-key.pem")]
    buf_tls = ["--cacert", str(pki / "ca.pem"), "--cert", str(pki / "client.pem"), "--key", str(pki / "client-key.pem")]
    auth = f"authorization: Bearer {TOKEN}"
    spec = {"name": "demo", "groupSize": 2, "tasks": [{"taskId": "t0", "prompt": "hi"}],
            "harness": {"kind": "command", "command": ["true"]}, "verifier": {"kind": "exact_match"}}  # fmt: skip
    method = "lodestar.v1.RolloutService"
    code, out = await _run(
        grpcurl, *tls, "-H", auth, "-d", json.dumps({"spec": spec}), stack["rollout"], f"{method}/CreateRun"
    )
    assert code == 0, out
    run_id = json.loads(out)["run"]["runId"]
    code, out = await _run(grpcurl, *tls, "-d", json.dumps({"runId": run_id}), stack["rollout"], f"{method}/CancelRun")
    assert code != 0
    assert "Unauthenticated" in out
    url = f"https://{stack['rollout']}/{method}/GetRun"
    code, out = await _run(buf, "curl", "--protocol", "grpc", *buf_tls, "-d", json.dumps({"runId": run_id}), url)
    assert code != 0  # reads need the token too: a run carries its tasks and harness env
    assert "unauthenticated" in out.lower()
    get_run = ["curl", "--protocol", "grpc", *buf_tls, "-H", auth, "-d", json.dumps({"runId": run_id}), url]
    code, out = await _run(buf, *get_run)
    assert code == 0, out
    assert json.loads(out)["run"]["state"] == "RUN_STATE_RUNNING"  # the refused cancel changed nothing
    code, out = await _run(
        buf, "curl", "--protocol", "grpc", *buf_tls, "--list-methods", f"https://{stack['inference']}"
    )
    assert code == 0, out
    assert "lodestar.v1.InferenceService/Generate" in out
    code, out = await _run(grpcurl, "-plaintext", stack["gateway"], "list")  # plaintext against mutual TLS
    assert code != 0


async def test_the_lodestar_cli_talks_to_a_secured_rollout(stack: dict[str, str], tmp_path: Path) -> None:
    """`lodestar run create/status` and `lodestar health` with the CA, a client certificate and the token."""
    pki = Path(stack["pki"])
    tls = [
        "--tls-ca",
        str(pki / "ca.pem"),
        "--tls-cert",
        str(pki / "client.pem"),
        "--tls-key",
        str(pki / "client-key.pem"),
    ]
    token = tmp_path / "token"
    token.write_text(TOKEN)
    lodestar = [sys.executable, "-m", "lodestar_app.cli.main"]
    code, out = await _run(*lodestar, "run", "create", str(REPO / "examples" / "runs" / "command-agent.yaml"),
                           "--rollout", stack["rollout"], *tls, "--auth-token-file", str(token))  # fmt: skip
    assert code == 0, out
    run_id = out.strip().splitlines()[-1]
    status = [*lodestar, "run", "status", run_id, "--json", "--rollout", stack["rollout"], *tls]
    code, out = await _run(*status)  # no token: reads need it too
    assert code != 0
    assert "token" in out
    code, out = await _run(*status, "--auth-token-file", str(token))
    assert code == 0, out
    assert json.loads(out[out.index("{") :])["runId"] == run_id
    code, out = await _run(*lodestar, "run", "cancel", run_id, "--rollout", stack["rollout"], *tls)  # no token
    assert code != 0
    assert "token" in out
    code, out = await _run(*lodestar, "health", stack["inference"], *tls)
    assert code == 0, out
    assert "SERVING" in out
