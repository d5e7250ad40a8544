"""``distilserve serve --workers 2``: two processes on one port, metrics summed over both,
a worker that dies is replaced while the other serves (no request reaching the
replacement before it has loaded), SIGHUP replaces them in turn with every request
answered, SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton

from tests import web
from tests.conftest import free_port, terminate, unallocated_port, wait_for

pytestmark = pytest.mark.slow  # servers of several worker processes

ROOT = Path(__file__).resolve().parents[2]


def _workers(log: Path) -> list[int]:
    return [int(p) for p in re.findall(r"Started server process \[(\d+)\]", log.read_text())]


def _embed_count(url: str) -> float:
    text = web.get(url + "/metrics", timeout=30).text
    return sum(float(v) for v in re.findall(
        r'distilserve_requests_total{route="/v1/embed",status="200"} ([0-9.e+]+)', text))


def _until_loaded(url: str, log: Path, count: int) -> list[int | None]:
    """Requests sent one after another until the log says ``count`` times in all that a
    worker serves the model, and 20 at least: their statuses (None: no answer)."""
    answered, deadline = [], time.monotonic() + 300
    while (log.read_text().count("serving cmow") < count or len(answered) < 20) \
            and time.monotonic() < deadline:
        try:
            answered.append(web.post(url + "/v1/embed", json={"inputs": "x"},
                                       timeout=60).status_code)
        except httpx.TransportError:  # a connection a dead worker had accepted
            answered.append(None)
    assert log.read_text().count("serving cmow") == count, "a new worker never loaded"
    return answered


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _grpc_embed(port: int) -> tuple[int, ...]:
    """Two texts' embeddings over gRPC, on a connection of their own: their shape."""
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        text = triton.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array(["a text", "another"], dtype=object))
        return client.infer("cmow", [text]).as_numpy("embedding").shape
    finally:
        client.close()


def test_two_workers_share_the_port_and_the_metrics(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    port, grpc_port = free_port(), unallocated_port()
    log, url = tmp_path / "serve.log", f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "distilserve.server.cli", "serve", "--model-repository",
         str(tmp_path / "repo"), "--port", str(port), "--workers", "2",
         "--grpc-port", str(grpc_port)],
        cwd=ROOT, env={**os.environ, "DISTILSERVE_THREADS": "1"},
        stdout=log.open("w"), stderr=subprocess.STDOUT)

    def ready_everywhere():  # 10 answers in a row: whichever worker takes them is ready
        try:
            return all(web.get(url + "/ready", timeout=5).status_code == 200
                       for _ in range(10))
        except httpx.TransportError:
            return False

    try:
        wait_for(lambda: len(_workers(log)) == 2, "two workers")
        wait_for(ready_everywhere, "both workers ready")
        statuses = [web.post(url + "/v1/embed", json={"inputs": f"text {i}"},  # new
                               timeout=60).status_code for i in range(30)]  # connections
        assert statuses == [200] * 30
        # summed over the workers, whichever answers: each worker writes a request's series
        # as the turn of its event loop that answered it ends
        wait_for(lambda: _embed_count(url) == 30, "30 requests counted")
        # Triton's statistics are those series: every worker's requests, no warm-up's
        (stats,) = web.get(url + "/v2/models/cmow/stats", timeout=30).json()["model_stats"]
        assert stats["inference_stats"]["success"]["count"] == 30
        assert stats["inference_count"] == 30 and stats["execution_count"] == 30
        scraped = web.get(url + "/metrics", timeout=30).text  # Triton's and TEI's series
        assert 'nv_inference_request_success{model="cmow",version="1"} 30.0' in scraped
        assert 'te_request_success{model="cmow"} 30.0' in scraped
        assert 'te_request_duration_count{model="cmow"} 30.0' in scraped
        # gRPC's port too is both workers' (each binds it): a new connection each call
        assert [_grpc_embed(grpc_port) for _ in range(10)] == [(2, 48)] * 10
        wait_for(lambda: f'route="{GRPC_INFER}",status="200"}} 10.0' in web.get(
            url + "/metrics", timeout=30).text, "10 gRPC calls counted")

        first, second = _workers(log)
        os.kill(first, signal.SIGKILL)
        # the other worker serves meanwhile, and the replacement takes no connection before
        # its model is loaded (it would answer 503)
        answered = _until_loaded(url, log, 3)
        assert 503 not in answered, f"{answered.count(503)} of {len(answered)} answered 503"
        assert answered.count(200) >= len(answered) - 1, answered  # (the dead worker's)
        replacement = wait_for(lambda: [p for p in _workers(log) if p not in (first, second)],
                                "a replacement worker")
        assert "died" in log.read_text()
        wait_for(ready_everywhere, "the replacement ready")
        assert server.poll() is None and replacement
        # uvicorn's SIGHUP: each worker replaced in turn, retired once its successor has
        # loaded; every request answered meanwhile, those a retiring worker had accepted too
        server.send_signal(signal.SIGHUP)
        answered = _until_loaded(url, log, 5)
        assert answered.count(200) == len(answered), \
            f"{len(answered)} sent, not 200: {[s for s in answered if s != 200]}"
        assert [_grpc_embed(grpc_port) for _ in range(4)] == [(2, 48)] * 4  # the new ones'
    finally:
        terminate(server, _workers(log))


def test_no_connection_arriving_after_sigterm_is_reset(exports, tiny_checkpoints, tmp_path):
    """``--workers 2`` told to stop while requests keep coming, each on a new connection:
    every one is answered or refused at connect, none accepted and then reset (the
    supervisor's copy of the listening socket, kept until the workers had drained, left
    connections queued for no one)."""
    import threading

    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    port = free_port()
    log, url = tmp_path / "serve.log", f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "distilserve.server.cli", "serve", "--model-repository",
         str(tmp_path / "repo"), "--port", str(port), "--workers", "2"],
        cwd=ROOT, env={**os.environ, "DISTILSERVE_THREADS": "1",
                       # a batch waits for company: the workers take a while to drain
                       "DISTILSERVE_MAX_WAIT_MS": "1000"},
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    outcomes: list[str] = []
    stop = threading.Event()

    def stream():
        while not stop.is_set():
            try:
                status = web.post(url + "/v1/embed", json={"inputs": "x"}, timeout=60)
                outcomes.append(str(status.status_code))
            except httpx.ConnectError:
                outcomes.append("refused")
                time.sleep(0.01)
            except httpx.TransportError as e:  # accepted, then closed without an answer
                outcomes.append(f"reset: {type(e).__name__}")

    try:
        wait_for(lambda: log.read_text().count("Application startup complete") == 2,
                 "two workers")
        wait_for(lambda: web.get(url + "/ready", timeout=5).status_code == 200, "ready")
        threads = [threading.Thread(target=stream) for _ in range(8)]
        for thread in threads:
            thread.start()
        wait_for(lambda: outcomes.count("200") >= 16, "requests answered before the signal")
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0
        time.sleep(0.5)  # and after the exit
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
    for thread in threads:
        thread.join(60)
    resets = [o for o in outcomes if o.startswith("reset")]
    assert not resets, f"{len(resets)} of {len(outcomes)}: {resets[:3]}"
    assert set(outcomes) <= {"200", "503", "refused"} and "refused" in outcomes


def test_one_process_keeps_its_metrics_itself_whatever_folder_the_environment_names(
        exports, tiny_checkpoints, tmp_path):
    """PROMETHEUS_MULTIPROC_DIR inherited (a gunicorn setup's): ignored, and said so, where
    it kept one process's series in files there, or failed at start with a traceback when
    no such folder was."""
    from loadtests.run import start_server

    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    port, log, gone = free_port(), tmp_path / "serve.log", tmp_path / "no-such-folder"
    server = start_server(tmp_path / "repo", port, log, {"PROMETHEUS_MULTIPROC_DIR": str(gone)})
    try:
        url = f"http://127.0.0.1:{port}"
        assert web.post(url + "/v1/embed", json={"inputs": "x"}, timeout=60).status_code == 200
        assert _embed_count(url) == 1
        assert f"PROMETHEUS_MULTIPROC_DIR={gone} is ignored" in log.read_text()
        assert not gone.exists()
    finally:
        terminate(server, [])
