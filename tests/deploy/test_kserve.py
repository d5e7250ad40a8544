"""deploy/kserve/inferenceservice.yaml: KServe's InferenceService with distilserve as its
predictor. Its CRD's schema is not on this machine (no cluster, no KServe), so the test
checks what it can: the predictor's containers against the Kubernetes schemas, and their
wiring to the service as it is (port, probes on the Open Inference Protocol's routes)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from distilserve.server.app import create_app
from distilserve.server.settings import Settings

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kserve" / "inferenceservice.yaml"
VERSION = "1.37.0"


def _service() -> dict:
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    return doc


def _predictor() -> dict:
    return _service()["spec"]["predictor"]


def test_the_predictors_containers_are_valid_kubernetes():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": _predictor()["containers"]}}
    kubernetes_validate.validate(pod, VERSION, strict=True)  # raises on any error


def test_the_container_serves_on_kserves_port_and_is_probed_on_the_v2_routes():
    (container,) = _predictor()["containers"]
    assert container["name"] == "kserve-container"
    env = {e["name"]: e["value"] for e in container["env"]}
    port = container["ports"][0]["containerPort"]
    assert port == int(env["DISTILSERVE_PORT"]) == 8080 and env["DISTILSERVE_HOST"] == "0.0.0.0"
    Settings(**{k.removeprefix("DISTILSERVE_").lower(): v for k, v in env.items()})  # valid
    probes = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert all(container[p]["httpGet"]["port"] == port for p in ("readinessProbe",
                                                                 "livenessProbe"))
    served = set(create_app(Settings()).openapi()["paths"])  # the service's routes
    assert probes == {"/v2/health/ready", "/v2/health/live"} and probes <= served
    scrape = _service()["metadata"]["annotations"]  # KServe's Prometheus annotations
    assert scrape["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert int(scrape["prometheus.kserve.io/port"]) == port
    assert scrape["prometheus.kserve.io/path"] == "/metrics" and "/metrics" in served
