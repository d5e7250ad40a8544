"""distilserve on Ray Serve, past one machine: ``distilserve ray`` or, for ``serve run`` and
KubeRay's RayService, the application builder ``distilserve.server.ray_serve:build``.

A model repository becomes one Ray Serve application:
- one deployment per model folder (``ModelReplica``): the folder's engine as in
  ``distilserve serve`` (batching queue, runtime backend), its replicas fixed or
  autoscaled on the requests ongoing per replica. Batching stays inside each replica:
  the requests that reach one together share its forward passes.
- an ingress deployment (``Ingress``): the same FastAPI app, routes, validation and
  errors as ``distilserve serve``, whose engines (with a ``RayRunner``) keep the tokenizer
  and metadata (validation before queueing, /v1/tokenize, NER's spans) and send each
  request's inputs to a replica of its model; with the grpc extra it takes the gRPC calls
  that Ray Serve's gRPC proxy forwards too (distilserve/server/ray_grpc.py).

A replica that dies is replaced by Ray Serve; a request that was on it is answered 503
with Retry-After (the Python client retries it), never left hanging.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import ray
from pydantic import BaseModel, Field, model_validator
from ray import serve

from distilserve.server import ray_hooks
from distilserve.server.engine import ModelLoadError, read_manifest
from distilserve.server.ray_deployments import Ingress, ModelReplica
from distilserve.server.service import model_folders
from distilserve.server.settings import Settings

log = logging.getLogger("distilserve")


class Scaling(BaseModel):
    """How each model's deployment scales (``distilserve ray`` flags; the builder's args)."""

    replicas: int = Field(1, ge=1, description="replicas per model (without autoscaling)")
    min_replicas: int | None = Field(None, ge=0, description="autoscale from this many")
    max_replicas: int | None = Field(None, ge=1, description="autoscale up to this many")
    target_ongoing: float = Field(64, gt=0, description="autoscaling's target of requests "
                                  "ongoing per replica (its queue length)")
    max_ongoing: int = Field(256, ge=1, description="requests one replica takes at once "
                             "(they share its batches); more wait in Ray Serve's router")
    replica_cpus: float = Field(1, ge=0, description="CPUs Ray reserves per replica")
    replica_gpus: float = Field(0, ge=0, description="GPUs Ray reserves per replica")

    @model_validator(mode="after")
    def _both_bounds(self):
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("autoscaling needs both min_replicas and max_replicas")
        return self

    def replica_settings(self, settings: Settings) -> Settings:
        """A replica's settings: unless DISTILSERVE_THREADS says otherwise, as many intra-op
        threads per model as the CPUs Ray reserves for the replica (at least one), not
        every core of its machine, which its other replicas share (Ray sets
        OMP_NUM_THREADS so, too)."""
        if settings.threads:
            return settings
        return settings.model_copy(update={"threads": max(1, int(self.replica_cpus))})

    def shortfall(self, models: int, resources: dict) -> tuple[str, str] | None:
        """Where ``models`` deployments' first replicas reserve more CPUs or GPUs than
        ``resources`` (Ray's ``cluster_resources()``) hold: how many against how many, and
        what would fit them; None where they fit."""
        replicas = self.replicas if self.max_replicas is None else self.min_replicas
        count = models * replicas
        for kind, each in (("CPU", self.replica_cpus), ("GPU", self.replica_gpus)):
            have = resources.get(kind, 0)
            if count * each <= have + 1e-9:
                continue
            fit = math.floor(have / count * 100) / 100
            return (f"the replicas reserve {_some(count * each, kind)} ({_some(models, 'model')}, "
                    f"{_some(replicas, 'replica')} each, {each:g} {kind} a replica) and Ray "
                    f"has {have:g}", f"--replica-{kind.lower()}s {fit:g} fits them"
                    + (", or fewer replicas" if fit else ""))
        return None

    def options(self) -> dict:
        actor = {"num_cpus": self.replica_cpus, "num_gpus": self.replica_gpus}
        if self.max_replicas is None:
            return {"num_replicas": self.replicas, "max_ongoing_requests": self.max_ongoing,
                    "ray_actor_options": actor}
        return {"autoscaling_config": {"min_replicas": self.min_replicas,
                                       "max_replicas": self.max_replicas,
                                       "target_ongoing_requests": self.target_ongoing},
                "max_ongoing_requests": self.max_ongoing, "ray_actor_options": actor}


def _some(n: float, thing: str) -> str:
    return f"{n:g} {thing}{'s' * (n != 1)}"


def ingress() -> type:
    """The ingress's class: with the ``grpc`` extra, GrpcIngress (distilserve/server/ray_grpc.py), which
    takes the gRPC calls too where Ray Serve's proxy forwards them (its grpc_options name
    GRPC_SERVICERS)."""
    try:
        from distilserve.server.ray_grpc import GrpcIngress
    except ImportError:  # (grpcio, tritonclient and the rest are the grpc extra)
        return Ingress
    return GrpcIngress


# Ray Serve's grpc_options.grpc_servicer_functions that give its proxy distilserve's gRPC
# services (``distilserve ray --grpc-port``; for a Serve config, name it there)
GRPC_SERVICERS = ["distilserve.server.ray_grpc.add_servicers"]


def servable(repository: Path) -> list[Path]:
    """The repository's model folders that deploy: those whose manifest reads (the others
    logged and left out); ValueError where there are none."""
    folders = []
    for folder in model_folders(repository):
        try:
            read_manifest(folder)
        except ModelLoadError as e:
            log.error("model %s not served: %s", folder.name, e)
            continue
        folders.append(folder)
    if not folders:
        raise ValueError(f"model repository {repository} holds no model folders")
    return folders


def application(folders: list[Path], settings: Settings, scaling: Scaling,
                ingress_replicas: int = 1):
    """The Ray Serve application of a repository's model folders (``servable``'s): a
    model whose folder fails to load fails its deployment."""
    handles = {}
    logs = {"enable_access_log": settings.access_log}  # a line per call costs throughput
    for folder in folders:
        handles[folder.name] = serve.deployment(ModelReplica).options(
            name=folder.name, logging_config=logs, **scaling.options()).bind(
            str(folder), scaling.replica_settings(settings))
    return serve.deployment(ingress()).options(
        name="ingress", num_replicas=ingress_replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=settings.max_connections, logging_config=logs).bind(
        # Ray Serve's proxies take the HTTP requests and the gRPC calls (its grpc_options,
        # not DISTILSERVE_GRPC_PORT), and models are deployments, loaded and unloaded by
        # redeploying (not DISTILSERVE_MODEL_CONTROL)
        settings.model_copy(update={"grpc_port": None, "model_control": "none"}),
        [str(f) for f in folders], handles)


def deploy_failures(app) -> list[str]:
    """Why an application did not deploy (``app``: its entry in ``serve.status()``), a line
    for each deployment that failed: its model and the last line of its replicas' error
    (Ray's message is their traceback), the exception's module left out."""
    failed = []
    for name, deployment in app.deployments.items():
        if deployment.status != "DEPLOY_FAILED":
            continue
        lines = [line for line in deployment.message.splitlines() if line.strip()]
        kind, colon, said = (lines[-1].strip() if lines else "failed").partition(": ")
        if colon and " " not in kind:  # package.module.Error: what it says
            kind = kind.rpartition(".")[2]
        failed.append(f"model {name}: {kind}{colon}{said}")
    return failed or [app.message]


# Ray Serve gives a new HTTP proxy RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S (5 s) to start,
# then kills it, and serve.start fails ("The actor never ran"): on a small, busy machine
# (two cores beside other work) starting its Python process takes longer than that.
PROXY_READY_CHECK_TIMEOUT = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"


def init_local(grpc_host: str = "127.0.0.1", **options):
    """A new local Ray instance, on the loopback interface only, whose Serve proxy gets a
    minute to start (unless the variable above says otherwise) and listens for gRPC on
    ``grpc_host`` (the HTTP host: distilserve/server/ray_hooks.py); ``options`` go to ``ray.init``."""
    wait = os.environ.get(PROXY_READY_CHECK_TIMEOUT, "60")
    ray.init(_node_ip_address="127.0.0.1", runtime_env={
        "env_vars": {PROXY_READY_CHECK_TIMEOUT: wait, ray_hooks.GRPC_HOST: grpc_host},
        "worker_process_setup_hook": "distilserve.server.ray_hooks.bind_proxy_to_host"}, **options)


class BuildArgs(Scaling):
    """The builder's arguments: ``serve run distilserve.server.ray_serve:build model_repository=/models
    replicas=2`` or a RayService's ``args``. Other settings: DISTILSERVE_* variables."""

    model_repository: Path
    ingress_replicas: int = Field(1, ge=1)


def build(args: dict):
    """Ray Serve's application builder (``import_path: distilserve.server.ray_serve:build``)."""
    parsed = BuildArgs.model_validate(args)
    scaling = Scaling.model_validate(parsed.model_dump(include=set(Scaling.model_fields)))
    return application(servable(parsed.model_repository), Settings(), scaling,
                       parsed.ingress_replicas)
