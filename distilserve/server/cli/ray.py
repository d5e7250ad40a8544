"""``distilserve ray``: a model repository as a Ray Serve application."""

from __future__ import annotations

import argparse
from pathlib import Path

from distilserve.server.cli.common import (
    Refused,
    buildable_default,
    listening_socket,
    require,
    status,
    warn_if_open,
)


def add(sub) -> None:
    ray = sub.add_parser("ray", help="serve a model repository on Ray Serve",
                         description="Deploys a model repository as a Ray Serve application "
                         "(one deployment per model, the same HTTP API) on a new local Ray "
                         "instance or on a cluster (--address), and removes it on Ctrl-C or "
                         "SIGTERM. Other settings: DISTILSERVE_* variables.")
    ray.add_argument("--model-repository", type=Path,
                     help="folder of model folders, readable by every Ray node (default: "
                     "the embedded default, built here on first run)")
    ray.add_argument("--address", help="Ray cluster to join (auto, HOST:PORT or "
                     "ray://HOST:10001; default RAY_ADDRESS, or a new local instance)")
    ray.add_argument("--host", help="Ray Serve's HTTP host, DISTILSERVE_HOST (default "
                     "127.0.0.1)")
    ray.add_argument("--port", type=int, help="Ray Serve's HTTP port, DISTILSERVE_PORT "
                     "(default 8000)")
    ray.add_argument("--grpc-port", type=int,
                     help="DISTILSERVE_GRPC_PORT: Ray Serve's gRPC port, serving the Open "
                     "Inference Protocol, Text Embeddings Inference's tei.v1 and health "
                     "checks as `distilserve serve --grpc-port` does; default: none")
    ray.add_argument("--replicas", type=int, help="replicas per model (default 1)")
    ray.add_argument("--min-replicas", type=int, help="autoscale each model from this many "
                     "replicas (with --max-replicas)")
    ray.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    ray.add_argument("--target-ongoing", type=float, help="autoscaling target: requests "
                     "ongoing (queued or running) per replica (default 64)")
    ray.add_argument("--max-ongoing", type=int, help="requests a replica takes at once, "
                     "sharing its batches (default 256)")
    ray.add_argument("--replica-cpus", type=float, help="CPUs per replica (default 1)")
    ray.add_argument("--replica-gpus", type=float, help="GPUs per replica (default 0)")
    ray.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import signal

    from pydantic import ValidationError

    from distilserve.server import logs
    from distilserve.server.settings import Settings, unknown_variables

    require("distilserve ray")
    try:
        settings = Settings(**{k: v for k, v in (("model_repository", args.model_repository),
                                                 ("host", args.host), ("port", args.port),
                                                 ("grpc_port", args.grpc_port))
                               if v is not None})
        from distilserve.server.ray_serve import Scaling

        scaling = Scaling(**{k: v for k, v in vars(args).items()
                             if k in Scaling.model_fields and v is not None})
    except ValidationError as e:
        raise Refused.invalid(e) from None
    if settings.grpc_port is not None:
        require("--grpc-port")
    logging.basicConfig(level=logging.INFO, format=logs.TEXT)
    for line in unknown_variables(os.environ):
        logging.getLogger("distilserve").warning(line)
    warn_if_open(settings, "inference, /metrics")  # on Ray Serve's HTTP and gRPC proxies
    repository = settings.model_repository
    if repository is None:  # the embedded default, built here first (on the first run)
        from distilserve.server.embedded_default import ensure_default_repository

        buildable_default(settings.cache_dir)
        with status("building the embedded default") as progress:
            repository = ensure_default_repository(settings.cache_dir, progress)
    if not repository.is_dir():
        raise Refused(f"model repository {repository} is not a folder")
    import ray
    from ray import serve

    from distilserve.server.ray_serve import (
        GRPC_SERVICERS,
        application,
        deploy_failures,
        init_local,
        servable,
    )

    try:
        folders = servable(repository)
    except ValueError as e:
        raise Refused(str(e)) from None

    local = not (args.address or os.environ.get("RAY_ADDRESS"))
    if local:  # its ports here: one in use is a one-line error before Ray starts
        for port in filter(None, (settings.port, settings.grpc_port)):
            try:
                listening_socket(settings.host, port).close()
            except OSError as e:
                raise Refused(f"cannot listen on {settings.host}:{port}: "
                              f"{e.strerror or e}") from None
        init_local(grpc_host=settings.host)
    else:
        refuse_if_unreachable(args.address or os.environ["RAY_ADDRESS"])
        ray.init(address=args.address)
    if short := scaling.shortfall(len(folders), ray.cluster_resources()):
        reserved, fits = short
        if local:  # nothing adds to a local instance: a replica it cannot place waits forever
            ray.shutdown()
            raise Refused(f"{reserved}, so one would wait for them forever: {fits}")
        logging.getLogger("distilserve").warning(
            "%s now: a replica waits until the cluster has more (%s)", reserved, fits)
    grpc = {} if settings.grpc_port is None else {"grpc_options": {
        "port": settings.grpc_port, "grpc_servicer_functions": GRPC_SERVICERS}}

    def interrupted(*_):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # while deploying too (Ray's own SIGTERM
        signal.signal(sig, interrupted)         # handler ends the process, leaving it there)
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port}, **grpc)
        try:
            serve.run(application(folders, settings, scaling), name="distilserve",
                      route_prefix="/")
        except RuntimeError:  # a deployment failed; Ray's error names none of the reasons
            app = serve.status().applications["distilserve"]
            raise Refused("not deployed: " + "; ".join(deploy_failures(app))) from None
        grpc_at = "" if not grpc else f" and grpc://{settings.host}:{settings.grpc_port}"
        print(f"distilserve on Ray Serve at http://{settings.host}:{settings.port}{grpc_at} "
              "(Ctrl-C or SIGTERM removes the application)", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("removing the application", flush=True)
    finally:
        if local:  # the instance, with everything on it
            serve.shutdown()
        else:  # a cluster's Serve keeps running for its other applications
            serve.delete("distilserve")
    return 0


def refuse_if_unreachable(address: str) -> None:
    """Refuses a cluster's HOST:PORT (or ray://HOST:PORT) that takes no connection, which
    Ray would retry for minutes; "auto" and what is not HOST:PORT are Ray's to read."""
    import socket

    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise Refused(f"no Ray cluster at {address}: {e.strerror or e}") from None
