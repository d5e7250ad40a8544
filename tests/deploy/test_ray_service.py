"""deploy/ray/rayservice.yaml: KubeRay's RayService for the Ray Serve path. Its CRD's
schema is not on this machine (no cluster, no KubeRay), so the test checks what it can:
the pod templates against the Kubernetes schemas, and the Serve config against the
application builder it names."""

from __future__ import annotations

import importlib
from pathlib import Path

import kubernetes_validate
import yaml

from distilserve.server.ray_serve import GRPC_SERVICERS, BuildArgs

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "rayservice.yaml"
VERSION = "1.37.0"


def _service() -> dict:
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return doc


def _templates(doc: dict) -> list[dict]:
    cluster = doc["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"],
            *(group["template"] for group in cluster["workerGroupSpecs"])]


def test_pod_templates_are_valid_kubernetes():
    for template in _templates(_service()):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
               "template": template}
        kubernetes_validate.validate(pod, VERSION, strict=True)


def test_the_serve_config_names_our_builder_with_valid_arguments():
    doc = _service()
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    module, _, name = app["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    args = BuildArgs.model_validate(app["args"])  # what build() will be given
    assert args.max_replicas >= args.min_replicas >= 1
    assert app["route_prefix"] == "/"


def test_the_serve_config_gives_the_grpc_proxy_our_services_on_the_head_pods_port():
    doc = _service()
    options = yaml.safe_load(doc["spec"]["serveConfigV2"])["grpc_options"]
    assert options["grpc_servicer_functions"] == GRPC_SERVICERS
    for path in options["grpc_servicer_functions"]:  # as Ray Serve's proxy imports them
        module, _, name = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name))
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in head["spec"]["containers"][0]["ports"]}
    assert ports["grpc"] == options["port"]


def test_every_pod_mounts_the_model_repository_the_builder_reads():
    doc = _service()
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    repository = app["args"]["model_repository"]
    assert doc["spec"]["rayClusterConfig"]["rayVersion"] == importlib.import_module(
        "ray").__version__
    for template in _templates(doc):
        container = template["spec"]["containers"][0]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert repository in mounts
        volumes = {v["name"] for v in template["spec"]["volumes"]}
        assert mounts[repository] in volumes
        path = next(e["value"] for e in container["env"] if e["name"] == "PATH")
        assert path.startswith("/opt/distilserve/.venv/bin")  # the image's ray (Dockerfile)
