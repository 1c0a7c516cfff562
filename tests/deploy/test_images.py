"""Static checks of deploy/Dockerfile.* and deploy/compose.yaml (offline, no Docker daemon; the real
build and smoke test are `make images` / `make compose-test`): base image as a build ARG, multi-stage
with only the service's extra from the wheelhouse, non-root, `lodestar <svc> serve`, a gRPC health
check on the served port, LODESTAR_* environment that the service's settings accept, and a token wherever
a service binds beyond loopback (an image alone refuses to serve; compose requires LODESTAR_AUTH_TOKEN)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lodestar.errors import FailedPreconditionError
from lodestar.grpc.security import Security
from lodestar.grpc.server import GrpcServer
from lodestar.settings import ENV_PREFIX, load_settings
from lodestar_app.cli.services import REGISTRY
from tests.deploy.dockerfiles import DEPLOY, env_of, is_setting, parse

SETTINGS = {service.name: service.settings for service in REGISTRY}
IMAGES = {  # Dockerfile suffix -> (service, extras installed, gRPC port)
    "rollout": ("rollout", "rollout", 50053),
    "inference": ("inference", "inference", 50051),
    "gateway": ("gateway", "gateway", 50052),
    "trainer": ("trainer", "trainer", 50054),
    "inference-cuda": ("inference", "inference,vllm", 50051),
}


def check_settings(service: str, env: dict[str, str]) -> None:
    """Every LODESTAR_<SERVICE>_* variable is a setting of `service` and the values validate."""
    klass = SETTINGS[service]
    prefix = f"{ENV_PREFIX}{service.upper()}_"
    for name in env:
        if name.startswith(ENV_PREFIX):
            assert name.startswith(prefix), f"{name} is not a {service} variable"
            assert is_setting(klass, name.removeprefix(prefix).lower()), f"{name} is not a {service} setting"
    load_settings(klass, env=env)  # raises InvalidArgumentError on a bad value


@pytest.mark.parametrize("suffix", list(IMAGES))
def test_dockerfile(suffix: str) -> None:
    service, extras, port = IMAGES[suffix]
    global_args, stages = parse(DEPLOY / f"Dockerfile.{suffix}")
    assert global_args == ["BASE=python:3.11-slim"]
    assert len(stages) == 2
    assert all(stage.base.startswith("${BASE}") for stage in stages)
    build, final = stages
    (install,) = [run for run in build.all("RUN") if "pip install" in run]
    assert "--no-index --find-links /wheels" in install
    assert re.findall(r"'lodestar\[([^\]]*)\]'", install) == [extras]
    assert final.all("COPY")
    assert all("/wheels" not in copy for copy in final.all("COPY"))
    assert "useradd --system --uid 10001" in " ".join(final.all("RUN"))
    assert final.all("USER") == ["lodestar"]
    assert json.loads(final.all("ENTRYPOINT")[0]) == ["lodestar", service, "serve"]
    healthcheck = final.all("HEALTHCHECK")[0]
    assert healthcheck.split("CMD", 1)[1].strip() == json.dumps(["lodestar", "health", f"127.0.0.1:{port}"])
    assert final.all("EXPOSE")[0].split()[0] == str(port)
    env = env_of(final)
    assert env[f"LODESTAR_{service.upper()}_PORT"] == str(port)
    assert env[f"LODESTAR_{service.upper()}_HOST"] == "0.0.0.0"
    check_settings(service, env)


@pytest.mark.parametrize("suffix", ["inference-cuda", "trainer"])
def test_the_gpu_images_can_compile_tritons_launcher(suffix: str) -> None:
    """Triton builds a C launcher on a GPU (vLLM's kernels; the trainer's FlexAttention): the final stage of each
    GPU image installs a C compiler."""
    _, (_, final) = parse(DEPLOY / f"Dockerfile.{suffix}")
    run = " ".join(final.all("RUN"))
    assert re.search(r"apt-get install [^&]*\bgcc\b", run), run
    assert "libc6-dev" in run


def test_the_cuda_inference_image_serves_bf16_on_cuda() -> None:
    """The image serves on CUDA in bf16 with the KV cache sized by memory utilization (the settings' CUDA
    defaults)."""
    _, (_, final) = parse(DEPLOY / "Dockerfile.inference-cuda")
    env = env_of(final)
    assert env["LODESTAR_INFERENCE_DEVICE"] == "cuda"
    settings = load_settings(SETTINGS["inference"], env=env)
    assert settings.serving_dtype() == "bfloat16"  # type: ignore[attr-defined]


def test_the_etcd_image_runs_as_its_own_user() -> None:
    global_args, (stage,) = parse(DEPLOY / "Dockerfile.etcd")
    assert global_args == ["BASE=python:3.11-slim"]
    assert stage.all("USER") == ["etcd"]
    assert "etcd-server tini" in stage.all("RUN")[0]
    assert json.loads(stage.all("ENTRYPOINT")[0]) == ["tini", "-e", "143", "--", "etcd"]


def test_compose_stack() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    one_shots = {"credentials", "etcd-setup-auth"}  # run to completion before the services (credentials per role)
    assert set(services) == {"etcd", "rollout", "inference", "gateway"} | one_shots
    assert all(services[name]["image"] == "lodestar/rollout:dev" for name in one_shots)
    ports = {name: IMAGES[name][2] for name in ("rollout", "inference", "gateway")} | {"etcd": 2379}
    for name, spec in ((name, spec) for name, spec in services.items() if name not in one_shots):
        assert re.sub(r"\$\{LODESTAR_GATEWAY_IMAGE:-([^}]*)\}", r"\1", spec["image"]) == f"lodestar/{name}:dev"
        assert spec["init"] is (name != "etcd")  # SIGTERM reaches the service, which drains (etcd: its own tini)
        for published in spec["ports"]:
            assert published.startswith("127.0.0.1:"), f"{name} publishes {published} beyond loopback"
        if name == "etcd":
            continue
        dockerfile_env = env_of(parse(DEPLOY / f"Dockerfile.{name}")[1][-1])
        env = {**dockerfile_env, **{key: str(value) for key, value in spec.get("environment", {}).items()}}
        check_settings(name, env)
        for key, value in spec.get("environment", {}).items():  # every address names a service of the stack
            for host, port in re.findall(r"(?:http://)?([a-z]+):(\d+)", str(value)):
                if key.endswith(("_ETCD", "_INFERENCE", "_ROLLOUT")):
                    assert host in services, f"{name}: {key}={value}"
                    assert int(port) == ports[host], f"{name}: {key}={value}"
    assert "../build/compose/tiny-model:/models/policy:ro" in services["inference"]["volumes"]


def test_the_custom_gateway_image_adds_files_and_packages_to_the_node() -> None:
    """deploy/Dockerfile.gateway-custom: FROM the gateway image (a build ARG), the context at /opt/lodestar-user
    (the path docs/deploy.md names), its packages into the node's environment from its own wheels (no index),
    not writable by the sessions' user, and the image's own user again at the end."""
    global_args, (stage,) = parse(DEPLOY / "Dockerfile.gateway-custom")
    assert global_args == ["GATEWAY=lodestar/gateway:dev"]
    assert stage.base == "${GATEWAY}"
    assert stage.all("COPY") == [". /opt/lodestar-user"]
    (run,) = stage.all("RUN")
    assert "/opt/lodestar/bin/pip install --no-index --find-links /opt/lodestar-user/wheels" in run
    assert "chmod -R a+rX,go-w /opt/lodestar-user" in run
    assert stage.all("USER") == ["root", "lodestar"]
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    assert '"/opt/lodestar-user/agent.py"' in guide
    assert 'pythonpath: ["/opt/lodestar-user"]' in guide


def test_a_wrong_setting_is_caught() -> None:
    """The checks can fail: a misspelt variable or a bad value."""
    with pytest.raises(AssertionError):
        check_settings("rollout", {"LODESTAR_ROLLOUT_STOR": "/data/x"})
    with pytest.raises(Exception, match="port"):
        check_settings("rollout", {"LODESTAR_ROLLOUT_PORT": "not-a-port"})


def _refuses_to_serve(service: str, env: dict[str, str]) -> bool:
    """Whether `service` with these LODESTAR_* variables would refuse to start its gRPC server (bound beyond
    loopback without a token or mutual TLS): the real check of `GrpcServer`, nothing bound (call it from a
    running event loop: a grpc.aio server is built)."""
    settings = load_settings(SETTINGS[service], env=env)
    try:
        GrpcServer.for_settings(service, settings, security=Security.from_settings(settings))
    except FailedPreconditionError:
        return True
    return False


@pytest.mark.parametrize("suffix", list(IMAGES))
async def test_an_image_bound_to_every_interface_needs_a_token(suffix: str) -> None:
    """The images bind 0.0.0.0, so run without a token they refuse to start; with one (the Secret in
    Kubernetes, LODESTAR_AUTH_TOKEN in compose) they serve."""
    service = IMAGES[suffix][0]
    env = env_of(parse(DEPLOY / f"Dockerfile.{suffix}")[1][-1])
    assert _refuses_to_serve(service, env)
    assert not _refuses_to_serve(service, {**env, f"LODESTAR_{service.upper()}_AUTH_TOKEN": "t0ken"})


def test_the_compose_credentials_give_each_service_only_its_own(tmp_path: Path) -> None:
    """deploy/compose-credentials.sh (the stack's one-shot `credentials` service), run for real: each service's
    directory holds only what it needs; no service gets the operator's token or another's key."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(DEPLOY / "compose-credentials.sh"), str(tmp_path)], env=env, check=True, timeout=120)
    held = {d.name: sorted(f.name for f in d.iterdir()) for d in tmp_path.iterdir() if d.name not in ("pki", "tokens")}
    assert held == {
        "etcd": ["ca.pem", "client-key.pem", "client.pem", "etcd-key.pem", "etcd.pem"],
        "rollout": ["ca.pem", "rollout-key.pem", "rollout.pem", "tokens.sha256"],
        "inference": ["tokens.sha256"],
        "gateway": ["ca.pem", "gateway-key.pem", "gateway.pem", "node.token", "tokens.sha256"],
        "setup": ["ca.pem", "client-key.pem", "client.pem"],
        "operator": ["operator.token"],
    }
    operator = (tmp_path / "operator" / "operator.token").read_text()
    assert operator == (tmp_path / "tokens" / "operator.token").read_text()
    for directory in held:
        if directory != "operator":
            assert all(operator.strip() not in f.read_text() for f in (tmp_path / directory).iterdir())


async def test_the_compose_stack_checks_tokens_per_role_and_secures_etcd(tmp_path: Path) -> None:
    """Every compose service checks the digest table mounted from its credentials directory (it refuses to
    serve without it), only the gateway sends a token (the node's); etcd serves TLS only with client
    certificates, and its clients reach it on https:// with their own certificate, never plaintext."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    table, token = tmp_path / "tokens.sha256", tmp_path / "node.token"
    table.write_text("operator sha256:" + "0" * 64 + "\n")
    token.write_text("a-node-token-0123456789\n")
    for name in ("rollout", "inference", "gateway"):
        compose_env = {key: str(value) for key, value in services[name]["environment"].items()}
        prefix = f"LODESTAR_{name.upper()}_"
        assert compose_env[prefix + "AUTH_TOKENS_FILE"] == "/credentials/tokens.sha256"
        assert f"../build/compose/credentials/{name}:/credentials:ro" in services[name]["volumes"]
        assert (prefix + "AUTH_TOKEN_FILE" in compose_env) == (name == "gateway")
        assert prefix + "AUTH_TOKEN" not in compose_env
        env = env_of(parse(DEPLOY / f"Dockerfile.{name}")[1][-1])
        files = {prefix + "AUTH_TOKENS_FILE": str(table)} | (
            {prefix + "AUTH_TOKEN_FILE": str(token)} if name == "gateway" else {}
        )
        assert not _refuses_to_serve(name, {**env, **compose_env, **files})
        without = {key: v for key, v in compose_env.items() if "AUTH_TOKEN" not in key}
        assert _refuses_to_serve(name, {**env, **without})
    assert services["gateway"]["environment"]["LODESTAR_GATEWAY_AUTH_TOKEN_FILE"] == "/credentials/node.token"
    etcd = services["etcd"]["command"]
    assert "--client-cert-auth" in etcd
    assert "--listen-client-urls=https://0.0.0.0:2379" in etcd
    for name in ("rollout", "gateway"):
        environment = services[name]["environment"]
        prefix = f"LODESTAR_{name.upper()}_ETCD"
        assert environment[prefix] == "https://etcd:2379"
        assert prefix + "_ALLOW_INSECURE" not in environment
        assert environment[prefix + "_TLS_CERT"] == f"/credentials/{name}.pem"
    assert services["etcd-setup-auth"]["entrypoint"][:3] == ["lodestar", "etcd", "setup-auth"]
    assert services["rollout"]["depends_on"]["etcd-setup-auth"] == {"condition": "service_completed_successfully"}


ONE_SERVICE = """
import sys
keep = sys.argv[1]
# As in an image that installs `lodestar[<keep>]` only: the other services' packages cannot be found (their
# editable-install finders removed), then the CLI runs the arguments that follow.
sys.meta_path[:] = [f for f in sys.meta_path
                    if not (f.__module__.startswith("__editable___lodestar_") and keep not in f.__module__)]
from lodestar_app.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _one_service(service: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ONE_SERVICE, f"lodestar_{service}", *argv],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("service", ["rollout", "inference", "gateway", "trainer"])
def test_the_cli_starts_in_an_image_with_one_service(service: str) -> None:
    """Each image installs `lodestar[<service>]` only, and its ENTRYPOINT and HEALTHCHECK are the `lodestar`
    CLI: it starts with the other services' packages absent, serves its own service's flags, and names the
    install for another's."""
    own = _one_service(service, service, "serve", "--help")
    assert own.returncode == 0, own.stderr[-800:]
    assert "--config" in own.stdout
    other = "rollout" if service != "rollout" else "gateway"
    absent = _one_service(service, other, "serve", "--port", "1")
    assert absent.returncode == 2, absent.stderr[-800:]
    assert f"pip install 'lodestar[{other}]'" in absent.stdout + absent.stderr
    assert _one_service(service, "health", "--help").returncode == 0
