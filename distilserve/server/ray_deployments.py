"""The deployments of distilserve's Ray Serve application (distilserve/server/ray_serve.py
assembles them): ``ModelReplica``, one model folder's engine; ``Ingress``, the FastAPI app
whose engines (each with a ``RayRunner``) send each request's inputs to a replica of its model
(distilserve/server/ray_grpc.py adds the gRPC calls to it)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)

from distilserve.server.app import create_app
from distilserve.server.engine import Engine, ModelUnavailable, open_engine, read_manifest
from distilserve.server.metrics import Metrics
from distilserve.server.service import load_models
from distilserve.server.settings import Settings

log = logging.getLogger("distilserve")

# the replica is gone or cannot take the request: 503, the client retries
GONE = (RayActorError, BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError)


class ModelReplica:
    """A Ray Serve replica of one model folder: its engine, started and warmed."""

    async def __init__(self, folder: str, settings: Settings):
        path = Path(folder)
        self.engine = await open_engine(path.name, path, settings, Metrics())

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0):
        return await self.engine.infer(texts, truncation, windows, iterations, priority)

    def describe(self) -> dict:
        return self.engine.describe()

    def batch_limits(self) -> tuple[int, int]:
        return self.engine.batch_limits

    def pid(self) -> int:
        return os.getpid()


class RayRunner:
    """A model's runner whose inputs run on Ray Serve replicas (each a LocalRunner): the
    engine here keeps the card and the tokenizer."""

    def __init__(self, handle, described: dict, batch_limits: tuple[int, int]):
        self.handle, self.described = handle, described
        self.batch_limits = tuple(batch_limits)  # the replicas', which batch
        span = described.get("iterations")  # the replica's backend's depth (Engine.depth)
        self.depth = span["max"] if span and span["min"] == 1 else None

    def describe(self) -> dict:
        return self.described  # the replica's (its device and dtype)

    async def start(self, warmup: bool = True) -> None:
        pass  # the replicas started and warmed themselves

    async def stop(self) -> None:
        pass

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0):
        try:
            return await self.handle.infer.remote(texts, truncation, windows, iterations,
                                                  priority)
        except RayTaskError as e:  # the replica raised it: InputTooLong, QueueFull, ...
            raise e.cause from None
        except GONE as e:
            raise ModelUnavailable(f"its replica is gone: {type(e).__name__}") from None


def remote_engine(folder: Path, settings: Settings, metrics: Metrics, handle, described: dict,
                  batch_limits: tuple[int, int]) -> Engine:
    """The model of ``folder`` here, its inputs run by Ray Serve's replicas (``handle``)."""
    return Engine(folder.name, folder, read_manifest(folder), settings, metrics,
                  runner=lambda engine: RayRunner(handle, described, batch_limits))


@serve.ingress()
class Ingress:
    """The FastAPI app of ``distilserve serve``, with the models' deployments as engines."""

    def __init__(self, settings: Settings, folders: list[str], handles: dict):
        self.settings, self.folders, self.handles = settings, folders, handles

    def __serve_build_asgi_app__(self):
        settings, handles = self.settings, self.handles

        async def loader(service) -> None:
            async def open_remote(folder: Path) -> Engine:
                handle = handles[folder.name]
                described = await handle.describe.remote()
                limits = await handle.batch_limits.remote()
                return await asyncio.to_thread(remote_engine, folder, settings,
                                               service.metrics, handle, described, limits)

            await load_models(service, [Path(f) for f in self.folders], open_remote,
                              "through its deployment")

        # (the ASGI wrapper has its own "app"; distilserve/server/ray_grpc.py runs this one too)
        self.fastapi_app = create_app(settings, loader=loader)
        return self.fastapi_app
