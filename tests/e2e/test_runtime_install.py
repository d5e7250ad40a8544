"""`make serve` and the Docker image install the runtime alone (pyproject's dependencies),
`make test` the dev extras besides: the service serves with every dev package
unimportable, its own optional features (gRPC, Ray, traces) refused with the extra to
install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import web
from tests.conftest import free_port, wait_until_ready

pytestmark = pytest.mark.slow  # real servers in subprocesses

ROOT = Path(__file__).resolve().parents[2]
# the dev extras' modules (pyproject's [dev]; OpenTelemetry's API is FastAPI's own): none
# is needed to serve
DEV = ("pytest", "locust", "openai", "kubernetes_validate", "schemathesis", "ray",
       "tritonclient", "grpc", "grpc_tools", "grpc_health", "grpc_reflection",
       "opentelemetry.sdk", "opentelemetry.exporter", "langchain_openai", "tiktoken",
       "llama_index", "cohere", "bpe_openai")
WITHOUT_DEV = (f"import sys; sys.modules.update(dict.fromkeys({DEV!r})); "
               "from distilserve.server.cli import main; sys.exit(main(sys.argv[1:]))")


def commands(target: str) -> str:
    """What ``make TARGET`` runs on a fresh clone (``-B``: as if nothing were installed)."""
    quiet = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL",
                                                                "MFLAGS")}  # (under make)
    return subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=ROOT,
                          capture_output=True, text=True, check=True, env=quiet).stdout


def test_make_serve_and_the_image_install_the_runtime_and_make_test_the_dev_extras():
    for target in ("serve", "install"):
        assert "pip install --quiet -c constraints.txt -e .\n" in commands(target)
        assert "[dev]" not in commands(target)
    assert "-e '.[dev]'" in commands("test")
    assert commands("install") in commands("test")  # the same runtime install, then more
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "RUN make install" in dockerfile and "[dev]" not in dockerfile


def test_the_service_serves_with_the_dev_extras_unimportable(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx")
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_DEV, "serve", "--model-repository",
         str(tmp_path / "repo"), "--port", str(port)], cwd=ROOT, stdout=log.open("w"),
        stderr=subprocess.STDOUT, env={**os.environ, "DISTILSERVE_API_KEY": "sekret"})

    key = {"Authorization": "Bearer sekret"}
    try:
        wait_until_ready(url, lambda: server.poll() is None, f"the server (log: {log})")
        for path, body in (("/v1/embed", {"inputs": "a"}), ("/v1/embeddings", {"input": "a"}),
                           ("/v2/models/embed/infer", {"inputs": [{
                               "name": "text", "datatype": "BYTES", "shape": [1],
                               "data": ["a"]}]})):
            assert web.post(url + path, json=body, headers=key).status_code == 200, path
        for path in ("/metrics", "/docs", "/openapi.json", "/v1/models"):
            assert web.get(url + path, headers=key).status_code == 200, path
    finally:
        server.terminate()
        server.wait(120)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("argv, env, extra", [
    (["serve", "--grpc-port", "9"], {}, "--grpc-port needs the grpc extra"),
    (["ray"], {}, "distilserve ray needs the ray extra"),
    (["serve"], {"DISTILSERVE_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
     "DISTILSERVE_OTLP_ENDPOINT needs the otlp extra"),
    (["serve"], {"DISTILSERVE_TOKEN_IDS": "cl100k_base"},
     "DISTILSERVE_TOKEN_IDS needs the token-ids extra"),
])
def test_an_optional_feature_without_its_extra_is_refused_naming_it(argv, env, extra,
                                                                     tmp_path):
    done = subprocess.run([sys.executable, "-c", WITHOUT_DEV, *argv, "--model-repository",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and extra in done.stderr, done.stderr  # one line
    assert "pip install -c constraints.txt 'distilserve[" in done.stderr
