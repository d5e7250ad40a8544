"""The engine process: the service's models (their runners: batching queues, backends,
warm-ups, CUDA graphs), one copy of each, answering the front ends' requests on a Unix
socket. It reads the repository as a one-process service does (building the embedded
default when none is named; with DISTILSERVE_POLL_SECONDS, kept in step with it; with
DISTILSERVE_MODEL_CONTROL=explicit, loading and unloading as a front end asks). A front
end asks which models it serves, and is told when they change; it sends each request's
token ids, naming the version of the model it serves, and gets back the outputs, or a
refusal that says its model is not the one served here
(distilserve/server/engine_process/front_end.py). Batches form from all the front ends'
inputs. SIGTERM: what is queued is answered, then it exits; SIGINT is the supervisor's to
handle (it stops the front ends first)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from distilserve.server.core.batching import time_spent
from distilserve.server.core.runner import ModelUnavailable
from distilserve.server.core.threads import leave_an_abandoned_build
from distilserve.server.core.tokenisation import TokenIds
from distilserve.server.engine_process import wire
from distilserve.server.metrics import Metrics
from distilserve.server.service import Service, build_and_load
from distilserve.server.settings import Settings

log = logging.getLogger("distilserve")
T = TypeVar("T")


def models(service: Service) -> dict:
    """What a front end needs to serve the models: whether they are loaded yet (and what is
    being done meanwhile), each model's folder and which version of it is served, how its
    runner runs it and batches, and the folders that failed."""
    if not service.ready:
        return {"ready": False, "status": service.status}
    served = [{"name": name, "folder": str(engine.folder), "version": engine.version,
               "described": engine.runner.describe(),
               "batch_limits": list(engine.batch_limits), "depth": engine.depth,
               "max_queue": engine.runner.batcher.max_queue}
              for name, engine in service.engines.items()]
    return {"ready": True, "status": service.status, "models": served,
            "failures": service.failures,
            "repository": None if service.repository is None else str(service.repository)}


class Connection:
    """One front end's requests, each answered as soon as its outputs are ready (in any
    order: the reply names the request's id); one the front end cancels (its client went
    away) leaves the queue, as in one process."""

    def __init__(self, service: Service, writer: asyncio.StreamWriter):
        self.service, self.outbox = service, wire.Outbox(writer)
        self.running: dict[int, list] = {}  # each request's queued items, by its id
        self.controls: set[asyncio.Task] = set()  # loads and unloads by request, under way

    def reply(self, header: dict, arrays: list = ()) -> None:
        self.outbox.send(header, arrays)

    def unavailable(self, header: dict, why: str, stale: bool = False) -> None:
        """The request refused as unavailable (503, retry); ``stale``: the front end's
        model is not the one served here (removed, or another version loaded since it was
        sent)."""
        self.reply({"id": header["id"], **wire.failure(ModelUnavailable(why)),
                    **({"stale": True} if stale else {})})

    def handle(self, header: dict, arrays: list) -> None:
        if header["op"] == "models":
            self.reply({"id": header["id"], **models(self.service)})
            return
        if header["op"] == "cancel":
            for item in self.running.pop(header["id"], []):
                item.future.cancel()
            return
        if header["op"] in ("load", "unload"):
            task = asyncio.create_task(self.control(header))
            self.controls.add(task)
            task.add_done_callback(self.controls.discard)
            return
        engine = self.service.engines.get(header["model"])
        if self.service.draining:
            self.unavailable(header, "the engine process is shutting down")
            return
        if engine is None or engine.version != header["version"]:  # the front end is behind
            self.unavailable(header, "the engine process " + (
                "no longer serves it" if engine is None else "has loaded another version "
                "since"), stale=True)
            return
        encodings = [TokenIds(ids, types) for ids, types in wire.split(*arrays, header["lengths"])]
        try:
            items = engine.runner.queue([""] * len(encodings), None, encodings,
                                        header["iterations"], header["priority"])
        except Exception as e:  # QueueFull (counted there), OverQueue, ModelUnavailable
            self.reply({"id": header["id"], **wire.failure(e)})
            return
        self.running[header["id"]] = items
        futures = [item.future for item in items]
        done = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
        done.add_done_callback(lambda _: self.answer(header["id"], engine, items, done))

    async def control(self, header: dict) -> None:
        """A load or unload by request (Service.load, Service.unload), answered when done
        or refused (every front end told of the change: serve's ``on_change``)."""
        try:
            await getattr(self.service, header["op"])(header["model"])
            self.reply({"id": header["id"]})
        except Exception as e:  # a Refusal: not explicit, no such folder, a failed load
            self.reply({"id": header["id"], **wire.failure(e)})

    def answer(self, request: int, engine, items: list, done: asyncio.Future) -> None:
        """The request's outputs, once all are ready (a row per token cut to its tokens),
        with the time its inputs waited and ran; or its first failure."""
        self.running.pop(request, None)
        if done.cancelled():
            return
        if (error := done.exception()) is not None:
            for item in items:
                item.future.cancel()
            self.reply({"id": request, **wire.failure(error)})
            return
        raw = [done.result()] if len(items) == 1 else done.result()
        if engine.per_token:
            raw = [r[:item.length] for r, item in zip(raw, items)]
        arrays, pairs = wire.outputs(raw)
        _, waited, running = time_spent(items)
        self.reply({"id": request, "pairs": pairs, "waited": waited, "running": running},
                   arrays)


async def serve(service: Service, path: str, stop: asyncio.Event) -> None:
    """The engine of ``service`` on the socket ``path`` until ``stop`` is set: then what is
    queued is answered, the front ends' connections closed, and it returns."""
    settings = service.settings
    settings.tune_interpreter()  # (the process ends with it)
    connections: set[Connection] = set()

    def tell_everyone() -> None:  # that the models served changed: each front end looks
        for connection in connections:
            connection.reply({"news": "models"})

    service.on_change = tell_everyone
    loading = asyncio.create_task(build_and_load(service, settings.model_repository))

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(service, writer)
        connections.add(connection)
        try:
            while True:
                for header, arrays in await wire.read(reader):
                    connection.handle(header, arrays)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end has gone
        finally:
            connections.discard(connection)
            writer.close()

    server = await asyncio.start_unix_server(connected, path)
    log.info("engine process %d on %s", os.getpid(), path)
    await stop.wait()
    service.draining = True
    loading.cancel()
    await asyncio.gather(loading, return_exceptions=True)
    for engine in service.engines.values():
        await engine.stop()  # what is queued is answered first
    server.close()
    await asyncio.sleep(0)  # (the last replies written)
    for connection in list(connections):
        connection.outbox.writer.close()
    service.cpu_thread.shutdown(wait=False)


async def until_terminated(settings: Settings, path: str) -> None:
    """``serve`` until SIGTERM, or until the supervisor that started it is gone (SIGINT
    ignored: the supervisor's); SIGHUP: the repository read again (as a poll does), unless
    models are loaded by request."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    service = Service(settings, Metrics())
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    loop.add_signal_handler(signal.SIGHUP, service.reread_soon, "SIGHUP")
    orphaned = asyncio.create_task(_until_orphaned(stop))
    await serve(service, path, stop)
    orphaned.cancel()


async def _until_orphaned(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1)
    log.error("the engine process's supervisor is gone: stopping")
    stop.set()


def on_uvloop(main: Coroutine[Any, Any, T]) -> T:
    """``main`` run to its end on uvloop, the front ends' loop (uvicorn's), where it is
    installed; else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: list[str]) -> int:
    """``python -m distilserve.server.engine_process SOCKET``: its settings from the
    DISTILSERVE_* variables (set by ``distilserve serve``)."""
    from distilserve.server import logs

    logs.configure(Settings().log_format)
    on_uvloop(until_terminated(Settings(), argv[0]))
    Path(argv[0]).unlink(missing_ok=True)
    leave_an_abandoned_build()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
