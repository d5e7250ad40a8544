"""DISTILSERVE_LOG_FORMAT=json: every line `distilserve serve` writes is one JSON object,
uvicorn's and the access log's included, in worker processes too."""

from __future__ import annotations

import json
import signal

import pytest

from loadtests.run import free_port, start_server
from tests import web
from tests.conftest import wait_for

pytestmark = pytest.mark.slow  # real servers in subprocesses


@pytest.mark.parametrize("workers", ["1", "2"])
def test_json_logs_are_one_object_a_line_with_the_access_logs_fields(
        tiny_checkpoints, tmp_path, workers, exports):
    exports(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "cmow", "onnx")
    port, log = free_port(), tmp_path / "server.log"
    server = start_server(tmp_path / "repo", port, log, {
        "DISTILSERVE_LOG_FORMAT": "json", "DISTILSERVE_ACCESS_LOG": "true",
        "DISTILSERVE_WORKERS": workers})
    url = f"http://127.0.0.1:{port}"
    try:
        # every worker has loaded the model (and said so) before it is asked (one still
        # loading answers a 503) and before the service stops
        wait_for(lambda: log.read_text().count("serving cmow") == int(workers),
                 "every worker to load the model")
        ok = web.post(url + "/v1/embed", json={"inputs": "x"})
        refused = web.post(url + "/v1/embed", json={"inputs": []},
                             headers={"x-request-id": "from-the-ingress"})
        assert (ok.status_code, refused.status_code) == (200, 422)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    records = [json.loads(line) for line in log.read_text().splitlines()]  # all JSON
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert not any("color_message" in r for r in records)  # uvicorn's terminal colours
    access = [r for r in records if r["logger"] == "uvicorn.access"
              and r["path"] == "/v1/embed"]
    assert [(r["method"], r["status"]) for r in access] == [("POST", 200), ("POST", 422)]
    # each with its request's id, the one it was sent back with (the client's, if it gave one)
    assert [r["request_id"] for r in access] == [ok.headers["x-request-id"], "from-the-ingress"]
    assert not any("request_id" in r for r in records if r["logger"] == "distilserve")
    assert any(r["logger"] == "distilserve" and "serving cmow" in r["message"]
               for r in records)
    last = "Stopping parent process" if workers == "2" else "Finished server process"
    assert any(r["message"].startswith(last) for r in records)  # logged to the end
