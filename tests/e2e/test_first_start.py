"""The first start of ``distilserve serve``: the port opens at once while the embedded
default is built (/health 200, /ready 503 saying what is being built, progress in the log
when no terminal shows it, a DISTILSERVE_* variable that is no setting warned of), and a
port in use is a one-line error before anything loads.
The full build itself is tested once, in test_embedded_default.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from distilserve.server.embedded_default import VERSION
from tests import web
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.slow  # real servers in subprocesses, building the default

ROOT = Path(__file__).resolve().parents[2]


def test_the_port_opens_while_the_default_is_built(tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "DISTILSERVE_CACHE_DIR": str(tmp_path / "cache"),
           "DISTILSERVE_MAX_BATCH": "8"}  # a typo, said
    server = subprocess.Popen([sys.executable, "-m", "distilserve.server.cli", "serve", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def get(path):
        try:
            return web.get(url + path, timeout=5)
        except httpx.TransportError:
            return None

    try:
        health = wait_for(lambda: get("/health"), "/health")
        assert health.status_code == 200
        ready = wait_for(lambda: get("/ready"), "/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"]
        body = ready.json()
        assert body["error"]["type"] == "unavailable"
        assert body["status"].startswith("building the embedded default")  # from the start
        wait_for(lambda: (r := get("/ready")) and r.json()["status"].startswith(
            "building the embedded default: all-minilm-l6-v2"), "/ready naming the first model")
        wait_for(lambda: "building the embedded default (" in log.read_text(),
                  "a progress line in the log")
        assert server.poll() is None
        said = log.read_text()
        assert f"listening on http://127.0.0.1:{port}\n" in said
        assert "serving the embedded default; it is built on this first start" in said
        assert ("WARNING DISTILSERVE_MAX_BATCH is not a setting: ignored (did you mean "
                "DISTILSERVE_MAX_BATCH_SIZE?)") in said
    finally:
        server.send_signal(signal.SIGTERM)  # stops the build too
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("SIGTERM did not stop the build") from None
    assert not (tmp_path / "cache" / f"default-v{VERSION}").exists()  # nothing half-built is used
    # the build abandoned mid-step: nothing half-built left, a clean exit
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".build.lock"]
    assert server.returncode == 0
    assert "Traceback" not in log.read_text() and "terminate called" not in log.read_text()


@pytest.mark.parametrize("which", ["http", "grpc"])
def test_a_port_in_use_is_one_line_before_anything_loads(tmp_path, which):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = ["--port", str(port)] if which == "http" else [
            "--port", str(free_port()), "--grpc-port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "distilserve.server.cli", "serve", *ports], cwd=ROOT,
            capture_output=True, text=True,
            env={**os.environ, "DISTILSERVE_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "in use" in lines[0]
    assert not (tmp_path / "cache").exists()  # the default was not built
