"""``distilserve serve --workers 2 --engine shared``: two front ends on one port and one
engine process running the model; outputs as the model's own, the engine's batches in the
one scrape, an engine process that dies replaced while the front ends answer 503 with
Retry-After, and SIGTERM answering the request in flight before everything stops."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import torch

from distilserve.server.engine import load_engine
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from loadtests.run import start_server
from tests import web
from tests.conftest import free_port, terminate, wait_for

pytestmark = pytest.mark.slow  # a server of three processes


def _engines(log: Path) -> list[int]:
    return [int(p) for p in re.findall(r"engine process (\d+) on", log.read_text())]


def _answers(url: str, model: str, times: int = 8) -> list[int]:
    """The statuses of ``times`` requests classifying with ``model``, answered by
    whichever front ends answer (all of them, most likely)."""
    return [web.post(url + "/v1/classify", json={"model": model, "inputs": "a"},
                     timeout=60).status_code for _ in range(times)]


def _until_all(url: str, model: str, status: int, why: str, before: int = 200) -> None:
    """Waits until eight requests with ``model`` in a row are answered ``status``; before,
    each is answered that, ``before``, or 503 by a front end a moment behind the engine
    (none is left unanswered, none fails)."""
    def settled() -> bool:
        seen = _answers(url, model)
        assert set(seen) <= {status, before, 503}, seen
        return set(seen) == {status}

    wait_for(settled, why)


def _own_embedding(folder: Path, text: str) -> np.ndarray:
    """The model's embedding of ``text``, run here on the CPU."""
    engine = load_engine(folder.name, folder, Settings(device="cpu"), Metrics())

    async def run():
        await engine.start(warmup=False)
        try:
            return (await engine.infer([text], "right")).postprocessed[0]
        finally:
            await engine.stop()

    return asyncio.run(run())


def _serve(repo: Path, log: Path, **env: str) -> tuple[subprocess.Popen, str]:
    """``distilserve serve --workers 2`` of ``repo`` (with the variables ``env``) once both
    front ends have started and /ready answers 200 (loadtests.run.start_server): the
    process and its URL."""
    port = free_port()
    return (start_server(repo, port, log, {"DISTILSERVE_WORKERS": "2", **env}),
            f"http://127.0.0.1:{port}")


def test_front_ends_share_one_engine_process(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "bert", "onnx")
    log = tmp_path / "serve.log"
    # a TMPDIR too deep for a Unix socket's path (sun_path: 107 bytes): the engine's socket
    # goes to a folder of its own in /tmp
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    # a lone request waits a second for company: in flight at SIGTERM
    server, url = _serve(tmp_path / "repo", log, DISTILSERVE_ENGINE="shared",
                         DISTILSERVE_THREADS="1", DISTILSERVE_MAX_WAIT_MS="1000",
                         TMPDIR=str(deep))

    def embed(text: str = "a text") -> httpx.Response:
        return web.post(url + "/embed", json={"inputs": text}, timeout=60)

    try:
        answer = embed()
        assert answer.status_code == 200
        np.testing.assert_allclose(answer.json()[0], _own_embedding(tmp_path / "repo" / "bert",
                                                                    "a text"), atol=1e-5)
        scraped = web.get(url + "/metrics", timeout=30).text  # the engine's series too
        assert re.search(r'distilserve_batch_size_count{model="bert"} [1-9]', scraped)
        assert len(_engines(log)) == 1

        os.kill(_engines(log)[0], signal.SIGKILL)
        statuses, deadline = [], time.monotonic() + 300
        while len(_engines(log)) < 2 or statuses[-1:] != [200]:  # until the new one serves
            response = embed()
            statuses.append(response.status_code)
            if response.status_code == 503:  # (a request it had, or one while it restarts)
                assert response.headers["retry-after"] in ("1", "2")
                assert "the engine process" in response.json()["error"]["message"]
                time.sleep(0.1)
            assert time.monotonic() < deadline, statuses[-10:]
        assert 503 in statuses and set(statuses) <= {200, 503}, statuses
        assert "exited (-9): starting another in 1 s" in log.read_text()
        wait_for(lambda: web.get(url + "/ready", timeout=5).status_code == 200, "ready again")

        in_flight: list[int] = []
        thread = threading.Thread(target=lambda: in_flight.append(embed().status_code))
        thread.start()
        time.sleep(0.3)  # the request waits in the engine's queue for company
        server.send_signal(signal.SIGTERM)
        thread.join(60)
        assert in_flight == [200]
        assert server.wait(60) == 0
        (socket,) = set(re.findall(r"engine process \d+ on (\S+)", log.read_text()))
        assert socket.startswith("/tmp/distilserve-engine-") and not Path(socket).parent.exists()
        assert not list(deep.glob("distilserve-*"))  # the metrics' folder removed too
    finally:
        terminate(server, _engines(log))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_workers_on_a_gpu_share_one_engine_process_there(exports, tiny_checkpoints, tmp_path):
    """``--workers 2`` on a GPU machine, the engine layout left to auto: one engine process
    holds the model on the GPU, the only one of the service's processes there (the front
    ends hold no CUDA context), and answers as the model does on the CPU."""
    from loadtests.peer import gpu_listing

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "bert", "torchscript")
    texts = ["The cat sat on the mat.", "GPUs multiply matrices quickly.", "short"]
    want = np.stack([_own_embedding(repo / "bert", text) for text in texts])
    log = tmp_path / "serve.log"
    server, url = _serve(repo, log, DISTILSERVE_DEVICE="auto")
    try:
        (model,) = web.get(url + "/v1/models", timeout=30).json()["data"]
        assert model["device"].startswith("cuda"), model
        for _ in range(4):  # (each front end, most likely)
            r = web.post(url + "/v1/embed", json={"inputs": texts}, timeout=60)
            assert r.status_code == 200, r.text
            assert (np.array(r.json()["embeddings"]) * want).sum(-1).min() >= 0.999
        (engine,) = _engines(log)
        service = {p.pid for p in psutil.Process(server.pid).children(recursive=True)}
        holding = (gpu_listing() or (0, {}))[1]
        if holding.keys() & (service | {server.pid}):  # (a container may name no process)
            assert holding.keys() & (service | {server.pid}) == {engine}, (holding, engine)
    finally:
        terminate(server, _engines(log))


def test_front_ends_serve_what_the_engine_finds_in_the_repository(exports, tiny_checkpoints,
                                                                  tmp_path):
    """``--workers 2 --engine shared`` with DISTILSERVE_POLL_SECONDS: a folder added to the
    repository is served through every front end, one removed no longer."""
    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx")
    log = tmp_path / "serve.log"
    server, url = _serve(repo, log, DISTILSERVE_ENGINE="shared", DISTILSERVE_POLL_SECONDS="0.3")
    try:
        assert set(_answers(url, "classify")) == {404}
        exports(tiny_checkpoints["bert", "classify"], tmp_path / "staging" / "classify", "onnx")
        (tmp_path / "staging" / "classify").rename(repo / "classify")  # whole, at once
        _until_all(url, "classify", 200, "the new folder to be served", before=404)
        (repo / "classify").rename(tmp_path / "gone")
        _until_all(url, "classify", 404, "the removed folder to be unloaded")
    finally:
        terminate(server, _engines(log))


def test_a_model_unloaded_and_loaded_by_request_through_the_front_ends(exports,
                                                                       tiny_checkpoints,
                                                                       tmp_path):
    """``--workers 2 --engine shared`` with DISTILSERVE_MODEL_CONTROL=explicit: Triton's
    unload and load, sent to whichever front end, are the engine process's, and every
    front end serves the outcome."""
    repo = tmp_path / "repo"
    for task in ("embed", "classify"):
        exports(tiny_checkpoints["bert", task], repo / task, "onnx")
    log = tmp_path / "serve.log"
    server, url = _serve(repo, log, DISTILSERVE_ENGINE="shared",
                         DISTILSERVE_MODEL_CONTROL="explicit")
    try:
        assert set(_answers(url, "classify")) == {200}
        unloaded = web.post(url + "/v2/repository/models/classify/unload", timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        _until_all(url, "classify", 404, "every front end to drop it")
        loaded = web.post(url + "/v2/repository/models/classify/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        _until_all(url, "classify", 200, "every front end to serve it", before=404)
    finally:
        terminate(server, _engines(log))


def test_sighup_has_the_engine_read_its_repository_again(exports, tiny_checkpoints, tmp_path):
    """``--workers 2 --engine shared``: SIGHUP replaces the front ends in turn, as with a
    copy each, and has the engine process read its repository again: a folder exported
    again is served through every front end, requests answered throughout."""
    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx")
    log = tmp_path / "serve.log"
    server, url = _serve(repo, log, DISTILSERVE_ENGINE="shared")

    def families(times: int = 8) -> set[str]:
        return {m["family"] for _ in range(times)
                for m in web.get(url + "/v1/models", timeout=30).json()["data"]}

    def embedded() -> bool:  # eight in a row (each 200, or a 503 to retry meanwhile)
        seen = [web.post(url + "/v1/embed", json={"inputs": "a"}, timeout=60).status_code
                for _ in range(8)]
        assert set(seen) <= {200, 503}, seen
        return set(seen) == {200}

    try:
        assert families() == {"bert"}
        exports(tiny_checkpoints["minialbert", "embed"], tmp_path / "staging" / "embed", "onnx")
        (repo / "embed").rename(tmp_path / "old")
        (tmp_path / "staging" / "embed").rename(repo / "embed")
        server.send_signal(signal.SIGHUP)
        wait_for(lambda: embedded() and families() == {"minialbert"}, "the new export served")
        assert "SIGHUP: reading the model repository" in log.read_text()
    finally:
        terminate(server, _engines(log))
