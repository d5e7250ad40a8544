"""The Dockerfile, read (no Docker engine here to build it): the server itself is the
container's main process, and the health check asks /ready on the port the container
serves (DISTILSERVE_PORT), not a fixed one."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> dict[str, str]:
    """The Dockerfile's last instruction of each kind, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            kind, _, rest = line.strip().partition(" ")
            out[kind] = rest.strip()
    return out


def test_the_server_is_the_containers_main_process():
    """Exec form, the venv's distilserve: docker stop's SIGTERM reaches the server's drain
    (make, or a shell, as PID 1 would not pass it on)."""
    docker = _instructions()
    command = json.loads(docker["CMD"])
    assert command[1:] == ["serve"]
    assert Path(command[0]) == Path(docker["WORKDIR"]) / ".venv" / "bin" / "distilserve"
    assert "VENV ?= .venv" in (ROOT / "Makefile").read_text()  # where make install puts it


def _health_check(port: int) -> int:
    """Runs the Dockerfile's HEALTHCHECK command (its shell form) with DISTILSERVE_PORT."""
    check = _instructions()["HEALTHCHECK"].split(" CMD ", 1)[1]
    argv = shlex.split(check)
    assert argv[0] == "python3"
    return subprocess.run([sys.executable, *argv[1:]], timeout=60,
                          env={**os.environ, "DISTILSERVE_PORT": str(port)}).returncode


def test_the_health_check_asks_ready_on_the_port_served():
    status = {"code": 200}

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"] if self.path == "/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _health_check(server.server_address[1]) == 0
        status["code"] = 503  # not ready: unhealthy
        assert _health_check(server.server_address[1]) != 0
    finally:
        server.shutdown()
        server.server_close()


def test_the_code_is_roots_and_the_service_runs_as_another_user():
    """The image's code and virtual environment are installed by root (COPY without
    --chown, make install before USER), so that the service, run as ``app``, cannot
    change them; the code is not in that user's home, which it owns."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    kinds = [line.partition(" ")[0] for line in lines]
    copy = next(line for line in lines if line.startswith("COPY "))
    install = next(i for i, line in enumerate(lines) if "make install" in line)
    assert "--chown" not in copy and kinds.index("USER") > install
    assert lines[kinds.index("USER")] == "USER app"
    assert not _instructions()["WORKDIR"].startswith("/home/")
