"""SIGTERM: the service stops taking new work, lets in-flight requests finish, exits."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

from loadtests.run import free_port, start_server
from tests import web
from tests.conftest import wait_for

pytestmark = pytest.mark.slow  # real servers in subprocesses, stopped by signals


def test_sigterm_finishes_in_flight_requests_then_exits(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    port = free_port()
    log = tmp_path / "server.log"
    # a batch waits 2 s for company, which keeps a request in the queue
    server = start_server(tmp_path / "repo", port, log, {"DISTILSERVE_MAX_WAIT_MS": "2000"})
    url = f"http://127.0.0.1:{port}"
    try:
        answers = []
        in_flight = threading.Thread(target=lambda: answers.append(
            web.post(url + "/v1/embed", json={"inputs": "still answered"}, timeout=30)))
        in_flight.start()
        wait_for(lambda: 'distilserve_queue_depth{model="cmow"} 1.0' in web.get(
            url + "/metrics").text, "the request to wait in the queue")
        server.send_signal(signal.SIGTERM)
        in_flight.join(30)
        assert answers and answers[0].status_code == 200
        assert server.wait(30) == 0  # a clean drain is a success (Kubernetes, systemd)
        assert "Finished server process" in log.read_text()
        try:
            late = web.post(url + "/v1/embed", json={"inputs": "too late"}, timeout=2)
            assert late.status_code == 503
        except httpx.TransportError:
            pass  # refused: the socket is closed, which is the other way to say no
    finally:
        if server.poll() is None:
            server.kill()
