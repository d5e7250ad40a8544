"""deploy/sagemaker/serve, the `serve` SageMaker runs an image with: the service on the port
SageMaker talks to, answering its GET /ping and POST /invocations, draining on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests import web
from tests.conftest import free_port, wait_until_ready

pytestmark = pytest.mark.slow  # a real server in a subprocess

SERVE = Path(__file__).resolve().parents[2] / "deploy" / "sagemaker" / "serve"


def test_serve_answers_sagemakers_ping_and_invocations(exports, tiny_checkpoints, tmp_path):
    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embedder", "onnx")
    port = free_port()  # SageMaker's 8080, where a pipeline's SAGEMAKER_BIND_TO_PORT says
    env = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "DISTILSERVE_HOST": "127.0.0.1",
           "DISTILSERVE_MODEL_REPOSITORY": str(repo)}
    log = tmp_path / "serve.log"
    process = subprocess.Popen([str(SERVE)], env=env, stdout=log.open("w"),
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, lambda: process.poll() is None, f"serve (log: {log})", "/ping")
        inputs = ["Dogs bark.", "The cat sat on the mat."]
        got = web.post(url + "/invocations", json={"inputs": inputs}, timeout=60)
        assert got.status_code == 200, got.text
        expected = web.post(url + "/v1/embed", json={"inputs": inputs}).json()["embeddings"]
        np.testing.assert_allclose(got.json(), expected, atol=1e-6)
    finally:
        process.send_signal(signal.SIGTERM)  # the script exec'd distilserve: it drains
        assert process.wait(300) == 0, log.read_text()
