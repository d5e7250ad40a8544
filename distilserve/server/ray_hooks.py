"""Ray's worker process setup hook for a local instance (distilserve/server/ray_serve.py's
init_local): light, since every Ray worker runs it, Ray Serve's controller and proxies
too."""

from __future__ import annotations

import os

# where Ray Serve's gRPC proxy listens: the environment variable init_local sets
GRPC_HOST = "DISTILSERVE_RAY_GRPC_HOST"


def bind_proxy_to_host() -> None:
    """Where GRPC_HOST is set, Ray Serve's gRPC proxy listens on that host rather than on
    every interface (Ray Serve binds ``[::]:PORT`` whatever its HTTP host)."""
    host = os.environ.get(GRPC_HOST)
    if not host:
        return
    from ray.serve._private import default_impl

    def add_grpc_address(server, address: str) -> None:
        port = address.rpartition(":")[2]
        server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")

    default_impl.add_grpc_address = add_grpc_address
