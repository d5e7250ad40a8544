"""distilserve/server/app.py's start: what /ready says while the embedded default is built; no server,
no models."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading

from distilserve.server.app import create_app, loaded_or_stopped
from distilserve.server.metrics import Metrics
from distilserve.server.service import Service, build_and_load
from distilserve.server.settings import Settings


def test_ready_says_the_default_is_being_built_before_the_build_says_where(tmp_path, monkeypatch):
    """The build's first words come after slow imports, in its own thread; /ready says
    what is happening from the task's first step (before the port opens)."""
    release = threading.Event()

    def build(cache_dir, progress):  # importing, saying nothing yet; then it fails
        release.wait()
        raise OSError("disk full")

    monkeypatch.setattr("distilserve.server.embedded_default.ensure_default_repository", build)

    async def start():
        service = Service(Settings(cache_dir=tmp_path), Metrics())
        loading = asyncio.create_task(build_and_load(service, None))
        await asyncio.sleep(0)
        first = service.status
        release.set()
        await loading
        return first, service.status

    first, last = asyncio.run(start())
    assert first == "building the embedded default"
    assert last == "building the embedded default failed: OSError: disk full"


def test_the_service_collects_garbage_and_switches_threads_its_own_way_and_puts_pythons_back(
        tmp_path):
    """While serving, Python's youngest generation is collected every gc_threshold net
    allocations (not Python's 700), and a thread waiting for Python's lock gets it after
    switch_interval_ms (not Python's 5 ms); after, the process has Python's own back."""
    before = gc.get_threshold(), sys.getswitchinterval()
    app = create_app(Settings(gc_threshold=12_345, switch_interval_ms=0.25),
                     repository=tmp_path)

    async def serve():
        async with app.router.lifespan_context(app):
            return gc.get_threshold(), sys.getswitchinterval()

    assert asyncio.run(serve()) == ((12_345, *before[0][1:]), 0.00025)
    assert (gc.get_threshold(), sys.getswitchinterval()) == before
    assert (Settings().gc_threshold, Settings().switch_interval_ms) == (50_000, 0.5)


def _ready_after_loading(repository, caplog, **settings):
    """/ready's status code and body once the repository is read (in-process, no port),
    and what the start logged."""
    import logging

    import httpx

    app = create_app(Settings(**settings), repository=repository)

    async def serve():
        async with app.router.lifespan_context(app):
            service = app.state.service
            while not service.ready:
                await asyncio.sleep(0.01)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.get("/ready")

    with caplog.at_level(logging.ERROR, logger="distilserve"):
        response = asyncio.run(serve())
    return response.status_code, response.json(), caplog.text


def test_a_repository_with_nothing_to_serve_is_not_ready_and_says_why(tmp_path, caplog):
    # a volume's own lost+found, and a hidden folder (a notebook's): no model folders
    for folder in ("lost+found", ".ipynb_checkpoints"):
        (tmp_path / folder).mkdir()
    status, body, logged = _ready_after_loading(tmp_path, caplog)
    assert status == 503 and body["status"] == "no model folder in the model repository"
    assert "failed" not in body or body["failed"] == {}
    assert "serving nothing, not ready: no model folder in the model repository" in logged
    # pointed at a model folder rather than the folder that holds it
    (tmp_path / "manifest.json").write_text("{}")
    status, body, _ = _ready_after_loading(tmp_path, caplog)
    assert status == 503 and body["status"].endswith(
        "the repository is itself a model folder (it has a manifest.json): serve the folder "
        "that holds it, a folder per model")
    # every folder failed
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "broken").mkdir()
    status, body, _ = _ready_after_loading(tmp_path, caplog)
    assert status == 503
    assert body["status"] == "no model in the model repository loaded (failed: broken)"
    # models loaded by request: an empty start is how it begins
    status, body, _ = _ready_after_loading(tmp_path, caplog, model_control="explicit")
    assert status == 200 and body["models"] == [] and "broken" in body["failed"]


def test_every_reference_in_the_openapi_document_resolves_and_every_id_is_one(tmp_path):
    """Generated clients and schemathesis follow each ``$ref``: none points nowhere (POST /
    and /invocations name the bodies of the routes they stand for)."""
    document = create_app(Settings(), repository=tmp_path).openapi()

    def references(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    found = set(references(document))
    assert "#/components/schemas/HfQaRequest" in found
    missing = {ref for ref in found
               if ref.rsplit("/", 1)[-1] not in document["components"]["schemas"]}
    assert not missing
    assert all(ref.startswith("#/components/schemas/") for ref in found)
    ids = [operation["operationId"] for operations in document["paths"].values()
           for operation in operations.values()]
    assert len(ids) == len(set(ids))  # (a probe's GET and HEAD: one route)


def test_a_worker_that_loads_before_it_serves_stops_when_told_to_while_it_loads():
    """SIGTERM while the loading goes on (a front end whose engine process never comes
    up): the wait ends, the handler it found (uvicorn's) is called too and put back."""
    heard = []

    def uvicorns(sig, frame):
        heard.append(sig)

    async def go():
        loading = asyncio.create_task(asyncio.Event().wait())  # never done
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        await loaded_or_stopped(loading)
        assert not loading.done()
        loading.cancel()
        done = asyncio.create_task(asyncio.sleep(0))
        await loaded_or_stopped(done)  # done first: as it was
        assert done.done()

    before = signal.signal(signal.SIGTERM, uvicorns)
    try:
        asyncio.run(go())
        assert heard == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is uvicorns
    finally:
        signal.signal(signal.SIGTERM, before)
