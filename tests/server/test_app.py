"""server/app.py's start: what /ready says while the embedded default is built; no server,
no models."""

from __future__ import annotations

import asyncio
import gc
import threading

from server.app import Service, build_and_load, create_app
from server.metrics import Metrics
from server.settings import Settings


def test_ready_says_the_default_is_being_built_before_the_build_says_where(tmp_path, monkeypatch):
    """The build's first words come after slow imports, in its own thread; /ready says
    what is happening from the task's first step (before the port opens)."""
    release = threading.Event()

    def build(cache_dir, progress):  # importing, saying nothing yet; then it fails
        release.wait()
        raise OSError("disk full")

    monkeypatch.setattr("server.embedded_default.ensure_default_repository", build)

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


def test_the_service_collects_garbage_at_its_own_threshold_and_puts_pythons_back(tmp_path):
    """While serving, Python's youngest generation is collected every gc_threshold net
    allocations (not Python's 700: some 300 collections a second under load); after,
    the process has its thresholds back."""
    before = gc.get_threshold()
    app = create_app(Settings(gc_threshold=12_345), repository=tmp_path)

    async def serve():
        async with app.router.lifespan_context(app):
            return gc.get_threshold()

    assert asyncio.run(serve()) == (12_345, *before[1:])
    assert gc.get_threshold() == before
    assert Settings().gc_threshold == 50_000
