"""SIGTERM: the service stops taking new work, lets in-flight requests finish, exits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from models import export

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_finishes_in_flight_requests_then_exits(tiny_checkpoints, tmp_path):
    export.export(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DISTILSERVE_MAX_WAIT_MS": "700"}  # keeps a request in the queue
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--model-repository",
                               str(tmp_path / "repo"), "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        answers = []
        in_flight = threading.Thread(target=lambda: answers.append(
            httpx.post(url + "/v1/embed", json={"inputs": "still answered"}, timeout=30)))
        in_flight.start()
        time.sleep(0.3)  # the request is waiting in the queue now
        server.send_signal(signal.SIGTERM)
        in_flight.join(30)
        assert answers and answers[0].status_code == 200
        assert server.wait(30) == 0  # a clean drain is a success (Kubernetes, systemd)
        assert b"Finished server process" in server.stdout.read()
        try:
            late = httpx.post(url + "/v1/embed", json={"inputs": "too late"}, timeout=2)
            assert late.status_code == 503
        except httpx.TransportError:
            pass  # refused: the socket is closed, which is the other way to say no
    finally:
        if server.poll() is None:
            server.kill()
