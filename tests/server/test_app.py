"""server/app.py's start: what /ready says while the embedded default is built; no server,
no models."""

from __future__ import annotations

import asyncio
import threading

from server.app import Service, build_and_load
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
