"""End to end: with DISTILSERVE_POLL_SECONDS the service keeps serving its repository as it
changes (distilserve/server/service.py, sync_repository): a folder added is loaded, one exported again
takes the place of the one before while requests to it go on (each answered, 200 or a 503
to retry), one that fails to load leaves the one before served, one removed is unloaded."""

from __future__ import annotations

import shutil
import threading

import httpx
import pytest

from distilserve.models import export
from tests import web
from tests.conftest import running_server, wait_for


def models(url) -> dict[str, dict]:
    return {m["id"]: m for m in web.get(url + "/v1/models").json()["data"]}


@pytest.fixture
def repo(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    return tmp_path / "repo"


def test_the_repository_is_served_as_it_changes(repo, tiny_checkpoints, caplog):
    with running_server(repo, poll_seconds=0.2) as url:
        assert set(models(url)) == {"embed"}

        # added
        export.export(tiny_checkpoints["bert", "ner"], repo / "tagger", "onnx", check=False)
        wait_for(lambda: "tagger" in models(url), "the new folder to be served")
        ner = web.post(url + "/v1/ner", json={"model": "tagger", "inputs": "Anna in Rome"})
        assert ner.status_code == 200, ner.text

        # exported again, under load: every request answered, 200 or 503 (retry)
        statuses, stop = [], threading.Event()

        def client():
            with httpx.Client(base_url=url, timeout=60) as http:
                while not stop.is_set():
                    statuses.append(http.post("/v1/embed", json={
                        "model": "embed", "inputs": ["a sentence", "and another"]}).status_code)

        thread = threading.Thread(target=client)
        thread.start()
        try:
            wait_for(lambda: len(statuses) >= 5, "requests before the new export")
            export.export(tiny_checkpoints["minialbert", "embed"], repo / "embed", "onnx",
                          force=True, check=False)
            wait_for(lambda: models(url)["embed"]["family"] == "minialbert",
                     "the new export to take the old one's place")
            seen = len(statuses)
            wait_for(lambda: len(statuses) >= seen + 5, "requests after it")
        finally:
            stop.set()
            thread.join()
        assert set(statuses) <= {200, 503} and statuses[-1] == 200, statuses

        # a folder that fails to load: reported; the one before it stays served
        (repo / "broken").mkdir()
        (repo / "broken" / "manifest.json").write_text("{not json")
        wait_for(lambda: "broken" in web.get(url + "/ready").json()["failed"],
                 "the broken folder to be reported")
        (repo / "embed" / "manifest.json").write_text("{not json")  # its export spoiled
        wait_for(lambda: "model embed not reloaded" in caplog.text, "the failed reload")
        served = web.post(url + "/v1/embed", json={"model": "embed", "inputs": "still"})
        assert served.status_code == 200 and models(url)["embed"]["family"] == "minialbert"
        assert "embed" not in web.get(url + "/ready").json()["failed"]

        # removed
        shutil.rmtree(repo / "tagger")
        shutil.rmtree(repo / "broken")
        wait_for(lambda: "tagger" not in models(url)
                 and "broken" not in web.get(url + "/ready").json()["failed"],
                 "the removed folders to be unloaded and forgotten")
        gone = web.post(url + "/v1/ner", json={"model": "tagger", "inputs": "Anna"})
        assert gone.status_code == 404, gone.text


def test_a_folder_is_tried_again_when_any_of_its_files_changes(exports, repo, tiny_checkpoints, tmp_path):
    """A folder copied manifest first fails to load, then is served at the next poll after
    the rest arrives; an artefact copied under an unchanged manifest is loaded too."""
    import asyncio

    from distilserve.server.metrics import Metrics
    from distilserve.server.service import Service, load_repository, sync_repository
    from distilserve.server.settings import Settings

    made = tmp_path / "made"
    exports(tiny_checkpoints["bert", "embed"], made, "onnx", check=False)

    async def copy_in_parts():
        service = Service(Settings(warmup=False), Metrics())
        await load_repository(service, repo)
        (repo / "late").mkdir()
        shutil.copy2(made / "manifest.json", repo / "late")
        assert not await sync_repository(service, repo)
        assert "late" in service.failures and "late" not in service.engines
        assert not await sync_repository(service, repo)  # nothing changed: not tried again
        for part in made.iterdir():
            if part.name != "manifest.json":
                (shutil.copytree if part.is_dir() else shutil.copy2)(part, repo / "late" / part.name)
        assert await sync_repository(service, repo)
        assert "late" in service.engines and "late" not in service.failures
        first = service.engines["late"]
        (repo / "late" / "model.onnx").write_bytes((made / "model.onnx").read_bytes())
        assert await sync_repository(service, repo)  # same manifest, new artefact
        assert service.engines["late"] is not first
        for engine in service.engines.values():
            await engine.stop()

    asyncio.run(copy_in_parts())


def test_a_model_replaced_or_removed_is_freed(repo, tiny_checkpoints):
    """Frozen with the rest of what loaded at start (distilserve/server/service.py: freeze_long_lived), a
    model unloaded would never be collected: polling thaws first."""
    import asyncio
    import gc
    import weakref

    from distilserve.server.metrics import Metrics
    from distilserve.server.service import Service, freeze_long_lived, load_repository, sync_repository
    from distilserve.server.settings import Settings

    async def replace_then_remove():
        service = Service(Settings(warmup=False), Metrics())
        await load_repository(service, repo)  # freezes, as at start
        first = weakref.ref(service.engines["embed"].runner.backend)
        export.export(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", force=True, check=False)
        assert await sync_repository(service, repo)
        freeze_long_lived(thaw=True)  # as poll_repository does after a change
        second = weakref.ref(service.engines["embed"].runner.backend)
        shutil.rmtree(repo / "embed")
        assert await sync_repository(service, repo) and not service.engines
        freeze_long_lived(thaw=True)
        return first, second

    try:
        first, second = asyncio.run(replace_then_remove())
        assert first() is None and second() is None  # both models' memory given back
    finally:
        gc.unfreeze()


def test_the_polls_that_change_what_is_served_say_so(repo):
    """Service.on_change (the engine process's news to its front ends) after a poll that
    changed what is served or failed, not after those that found the repository as it was."""
    import asyncio

    from distilserve.server.metrics import Metrics
    from distilserve.server.service import Service, load_repository, poll_repository
    from distilserve.server.settings import Settings

    async def go():
        service = Service(Settings(warmup=False), Metrics())
        told = []
        service.on_change = lambda: told.append((sorted(service.engines),
                                                 sorted(service.failures)))
        await load_repository(service, repo)
        polling = asyncio.create_task(poll_repository(service, repo, 0.05))
        await asyncio.sleep(0.3)  # some polls: nothing changed
        quiet = list(told)
        (repo / "broken").mkdir()
        (repo / "broken" / "manifest.json").write_text("{not json")
        for _ in range(6000):  # (a minute at most, on a busy machine)
            if told:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # more polls, the broken folder as it was
        polling.cancel()
        for engine in service.engines.values():
            await engine.stop()
        return quiet, told

    quiet, told = asyncio.run(go())
    assert quiet == [] and told == [(["embed"], ["broken"])]


@pytest.mark.slow  # a server in a subprocess
def test_sighup_has_one_process_read_its_repository_again(repo, exports, tiny_checkpoints,
                                                          tmp_path):
    """``distilserve serve`` in one process: SIGHUP reads the repository again, as a poll
    does (a folder exported again served in place of the one before); the process serves
    on, where uvicorn alone would have ended."""
    import signal

    from loadtests.run import start_server
    from tests.conftest import free_port, terminate

    port, log = free_port(), tmp_path / "serve.log"
    server = start_server(repo, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        assert models(url)["embed"]["family"] == "bert"
        exports(tiny_checkpoints["minialbert", "embed"], tmp_path / "staging" / "embed",
                "onnx", check=False)
        (repo / "embed").rename(tmp_path / "old")
        (tmp_path / "staging" / "embed").rename(repo / "embed")
        server.send_signal(signal.SIGHUP)
        wait_for(lambda: models(url)["embed"]["family"] == "minialbert", "the new export")
        assert web.post(url + "/v1/embed", json={"inputs": "a"}).status_code == 200
        assert "SIGHUP: reading the model repository" in log.read_text()
        server.send_signal(signal.SIGHUP)  # again, the repository as it was: nothing changes
        wait_for(lambda: log.read_text().count("SIGHUP: reading") == 2, "the second SIGHUP")
        assert server.poll() is None and models(url)["embed"]["family"] == "minialbert"
    finally:
        terminate(server, [])
