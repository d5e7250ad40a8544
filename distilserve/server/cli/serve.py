"""``distilserve serve``: a model repository over HTTP, in one process or several."""

from __future__ import annotations

import argparse
from pathlib import Path

from distilserve.server.cli.common import (
    Refused,
    buildable_default,
    listening_socket,
    open_files_for,
    require,
    warn_if_open,
)

WORKER_READY_S = 120  # how long a new worker of --workers N may take to load (see serve_workers)
WORKER_APP = "distilserve.server.app:app_from_environment"  # each worker's app factory


def add(sub) -> None:
    serve = sub.add_parser("serve", help="serve a model repository over HTTP",
                           description="Serves every model folder of a repository over "
                           "HTTP. Every flag has a DISTILSERVE_* environment twin; the "
                           "documentation's settings page lists the others (limits, batching, "
                           "API key).")
    serve.add_argument("--model-repository", type=Path,
                       help="folder of model folders (DISTILSERVE_MODEL_REPOSITORY); "
                       "default: the embedded default, built on first run")
    serve.add_argument("--host", help="DISTILSERVE_HOST (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="DISTILSERVE_PORT (default 8000)")
    serve.add_argument("--workers", type=int,
                       help="DISTILSERVE_WORKERS: processes serving the port (default 1)")
    serve.add_argument("--engine", choices=["auto", "shared", "per-worker"],
                       help="DISTILSERVE_ENGINE: with several workers, one engine process "
                       "running one copy of each model for all of them (shared), or a copy "
                       "of every model in each (per-worker); default auto: shared on a GPU, "
                       "per-worker on the CPU")
    serve.add_argument("--grpc-port", type=int,
                       help="DISTILSERVE_GRPC_PORT: also serve gRPC on this port, not "
                       "--port's: the Open Inference Protocol (tritonclient.grpc, KServe), "
                       "Text Embeddings Inference's tei.v1, health checks and reflection; "
                       "default: none")
    serve.add_argument("--device", help="DISTILSERVE_DEVICE: cpu, cuda, cuda:N or auto "
                       "(default: a GPU when one is visible)")
    serve.add_argument("--dtype", help="DISTILSERVE_DTYPE: auto, fp32, fp16 or bf16 "
                       "(default auto: fp16 or bf16 on a GPU, bf16 on a CPU with bf16 "
                       "matrix units, fp32 otherwise)")
    serve.set_defaults(func=run)


# prometheus-client's folder of every process's series (its multiprocess mode)
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def run(args: argparse.Namespace) -> int:
    import logging
    import os

    # the workers' metrics folder is this command's own (serve_workers): one named by the
    # environment would keep even one process's series in its files (from prometheus-client's
    # import on), counting those of processes gone before, or fail at start if not a folder
    inherited = os.environ.pop(MULTIPROC_DIR, None)

    from pydantic import ValidationError

    from distilserve.server import logs
    from distilserve.server.app import create_app
    from distilserve.server.connections import Config, Server
    from distilserve.server.core.threads import leave_an_abandoned_build
    from distilserve.server.settings import Settings, unknown_variables

    overrides = {k: v for k, v in (("model_repository", args.model_repository),
                                   ("host", args.host), ("port", args.port),
                                   ("device", args.device), ("dtype", args.dtype),
                                   ("workers", args.workers), ("engine", args.engine),
                                   ("grpc_port", args.grpc_port))
                 if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as e:
        raise Refused.invalid(e) from None
    if settings.device.startswith("cuda"):
        from distilserve.models.runtime.base import BackendError
        from distilserve.models.runtime.torch_device import resolve_device

        try:
            resolve_device(settings.device)
        except BackendError as e:
            raise Refused(f"every model: {e}") from None
    if settings.grpc_port is not None:
        require("--grpc-port")
    if settings.otlp_endpoint:
        require("DISTILSERVE_OTLP_ENDPOINT")
    if settings.token_ids != "model":
        require("DISTILSERVE_TOKEN_IDS")
    repository = settings.model_repository
    if repository is not None and not repository.is_dir():
        raise Refused(f"model repository {repository} is not a folder")
    if repository is not None:
        check_names(repository, settings)
    port = settings.port
    try:  # the ports first: a port in use is a one-line error before anything loads
        sock = listening_socket(settings.host, port)
        if settings.grpc_port is not None:  # bound again by the app (each worker's)
            port = settings.grpc_port
            listening_socket(settings.host, port).close()
    except OSError as e:
        raise Refused(f"cannot listen on {settings.host}:{port}: {e.strerror or e}") from None
    log_config = logs.configure(settings.log_format)
    say = logging.getLogger("distilserve").info
    for line in unknown_variables(os.environ):
        logging.getLogger("distilserve").warning(line)
    if inherited is not None:
        logging.getLogger("distilserve").warning(
            "%s=%s is ignored: the service keeps its workers' metrics in a folder of its "
            "own", MULTIPROC_DIR, inherited)
    if repository is None:
        from distilserve.server import embedded_default

        buildable_default(settings.cache_dir)
        say("serving the embedded default%s", "" if embedded_default.is_built(settings.cache_dir)
            else "; it is built on this first start (a few minutes; /ready says how far along)")
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    say("listening on http://%s:%d%s", host, settings.port, "" if settings.grpc_port is None
        else f", gRPC on {host}:{settings.grpc_port}")
    warn_if_open(settings, "inference, /metrics, model loading")
    open_files_for(settings.max_connections)
    # the app builds the embedded default (no repository) and loads the models in the
    # background, with the port open: /health answers at once, /ready when they are loaded
    common = dict(settings=settings, host=settings.host, port=settings.port, log_level="info",
                  access_log=settings.access_log, timeout_graceful_shutdown=30,
                  log_config=log_config)
    shared = engine_shared(settings)
    if settings.workers == 1 and not shared:
        app = create_app(settings, repository)
        Server(Config(app, **common), on_hup=lambda: hup(app)).run(sockets=[sock])
        leave_an_abandoned_build()
        return 0
    return serve_workers(settings, {**overrides, "engine": "shared" if shared else "per-worker"},
                         sock, common)


def hup(app) -> None:
    """SIGHUP to one process: its repository read again (Service.reread_soon)."""
    service = getattr(app.state, "service", None)  # (none before the app's start)
    if service is not None:
        service.reread_soon("SIGHUP")


def engine_shared(settings) -> bool:
    """Whether the models run in an engine process of their own (DISTILSERVE_ENGINE):
    auto, with several workers on a GPU."""
    if settings.engine != "auto":
        return settings.engine == "shared"
    if settings.workers == 1 or settings.device == "cpu":
        return False
    from distilserve.models.runtime.torch_device import resolve_device

    return resolve_device(settings.device).type == "cuda"


def check_names(repository, settings) -> None:
    """Refuses a repository where one name would be two models' (a folder's and an alias,
    or an alias of two), or DISTILSERVE_MODEL_ALIASES names no folder; a folder whose
    manifest cannot be read is left to its load, which says why."""
    from distilserve.models.io.manifest import FILE, Manifest, ManifestError
    from distilserve.server.service import aliases, model_folders

    claimed = {}
    for folder in model_folders(repository):
        try:
            claimed[folder.name] = Manifest.read(folder).aliases if (folder / FILE).is_file() \
                else []
        except ManifestError:
            claimed[folder.name] = []
    if wrong := aliases(settings.aliases(), claimed)[1]:
        raise Refused("; ".join(wrong))


def serve_workers(settings, overrides: dict, sock, common: dict) -> int:
    """N worker processes on one port (uvicorn's supervisor: it restarts a worker that
    dies and, on SIGTERM, drains every worker). Each worker builds its app from the
    DISTILSERVE_* variables set here; their metrics meet in one folder. With a shared
    engine, its process (on a socket in that folder, or in /tmp where that folder's path is
    too long for a socket's) starts first and stops last."""
    import os
    import shutil
    import tempfile

    from distilserve.server.connections import Config, Workers
    from distilserve.server.engine_process.supervisor import ENGINE_SOCKET, Supervisor, socket_path

    for key, value in overrides.items():
        os.environ[f"DISTILSERVE_{key.upper()}"] = str(value)
    metrics = tempfile.mkdtemp(prefix="distilserve-metrics-")
    os.environ[MULTIPROC_DIR] = metrics
    engine, sockets = None, metrics
    if overrides["engine"] == "shared":
        try:
            os.environ[ENGINE_SOCKET] = path = socket_path(metrics)
        except OSError as e:
            shutil.rmtree(metrics, ignore_errors=True)
            raise Refused(str(e)) from None
        sockets = os.path.dirname(path)
        engine = Supervisor(path)
        engine.start()
    try:
        # a new worker loads its models before it is ready (distilserve.server.app.app_from_environment):
        # SIGHUP's restart waits this long for each; a worker alive but not answering its
        # health check is found as late, a dead one at once (Workers)
        config = Config(WORKER_APP, factory=True,
                        workers=settings.workers, timeout_worker_healthcheck=WORKER_READY_S,
                        **common)
        Workers(config, sockets=[sock], on_hup=engine and engine.reread).run()
    finally:
        if engine is not None:
            engine.stop()
        for folder in {metrics, sockets}:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
