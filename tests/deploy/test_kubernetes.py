"""The Kubernetes manifests in deploy/: valid against the Kubernetes schemas (no cluster
here), and wired to the service as it is (port, probes, GPU request)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
VERSION = "1.37.0"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_are_valid_kubernetes(path):
    docs = _docs(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)  # raises on any error


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_deployments_probe_the_service_and_services_reach_it(path):
    docs = {d["kind"]: d for d in _docs(path)}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": int(env["DISTILSERVE_PORT"]),
                     "grpc": int(env["DISTILSERVE_GRPC_PORT"])}
    assert env["DISTILSERVE_HOST"] == "0.0.0.0"
    scrape = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert (scrape["prometheus.io/port"], scrape["prometheus.io/path"]) == (
        env["DISTILSERVE_PORT"], "/metrics")
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # /health is 200 while the default is built: started means ready, within 10 minutes
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    # kube-proxy and ingresses stop sending to a terminating pod seconds after it is told
    # to stop: it serves on through preStop's sleep, then drains for up to 30 s on SIGTERM
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and pod["terminationGracePeriodSeconds"] > int(pause[1]) + 30
    service = docs["Service"]["spec"]
    assert service["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert [port["targetPort"] for port in service["ports"]] == ["http", "grpc"]
    if "HorizontalPodAutoscaler" in docs:
        target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
        assert target["name"] == docs["Deployment"]["metadata"]["name"]
        assert "PodDisruptionBudget" in docs  # several pods: not all evicted at once
    if "PodDisruptionBudget" in docs:  # the Deployment's pods, one at a time
        budget = docs["PodDisruptionBudget"]["spec"]
        assert budget["selector"] == docs["Deployment"]["spec"]["selector"]
        assert budget["maxUnavailable"] == 1 < docs["Deployment"]["spec"]["replicas"]


def test_the_gpu_variant_asks_for_a_gpu_and_runs_on_it():
    docs = {d["kind"]: d for d in _docs(DEPLOY / "distilserve-gpu.yaml")}
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DISTILSERVE_DEVICE"] == "cuda"


def test_an_invalid_manifest_is_caught():
    docs = _docs(DEPLOY / "distilserve.yaml")
    broken = dict(docs[0], spec={**docs[0]["spec"], "replicas": "two"})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
