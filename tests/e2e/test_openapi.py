"""The OpenAPI document tells the truth: schemathesis generates requests from it for every
operation (valid and invalid, with and without the API key) and checks each answer
against it: status codes, content types, bodies, headers, auth, no 5xx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distilserve.models.io import checkpoint
from tests.conftest import running_server

pytestmark = pytest.mark.slow  # schemathesis over every operation

CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def repository(exports, tiny_checkpoints, splade_checkpoint, tmp_path_factory):
    repo = tmp_path_factory.mktemp("openapi-repo")
    for task in ("embed", "classify", "ner"):  # the embedding model: for /embed_all too
        exports(tiny_checkpoints["bert", task], repo / f"bert-{task}", "onnx",
                token_embeddings=task == "embed", check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cross-checkpoint")
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    exports(splade_checkpoint, repo / "splade", "onnx", check=False)  # for /embed_sparse
    return repo


# with an API key, every check (the key's own among them) at 40 examples an operation;
# without one, the same operations answered with no key set, at fewer
@pytest.mark.parametrize("key,examples", [("sekret", 40), (None, 10)])
def test_schemathesis_all_checks_on_every_operation(repository, tmp_path, key, examples):
    command = Path(sys.executable).with_name("schemathesis")
    with running_server(repository, api_key=key, max_inputs=64) as url:
        result = subprocess.run(
            [str(command), "--config-file", str(CONFIG), "run", url + "/openapi.json",
             *(["--header", f"Authorization: Bearer {key}"] if key else []), "--checks", "all",
             "--max-examples", str(examples), "--seed", "1", "--workers", "1", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True)
    summary = result.stdout[-6000:]
    assert result.returncode == 0, summary
    tested = next(line for line in result.stdout.splitlines() if "Tested:" in line)
    operations = [
        "POST /v1/embeddings", "POST /v1/embed", "POST /v1/classify", "POST /v1/ner",
        "POST /v1/rerank", "POST /v1/qa", "POST /v1/fill-mask", "POST /v1/tokenize", "POST /v1/decode",
        "GET /v1/models",
        "GET /v1/models/{model_id}", "GET /health", "GET /ready", "GET /metrics",
        # TEI's, Infinity's and SageMaker's
        "POST /embeddings", "POST /tokenize", "POST /decode", "POST /embed",
        "POST /embed_all", "POST /embed_sparse", "POST /",
        "POST /invocations", "POST /similarity", "POST /predict", "POST /rerank",
        "POST /classify", "POST /vertex", "GET /info", "GET /models", "GET /", "GET /ping",
        # Cohere's v2, vLLM's score, pooling and detokenize, and Hugging Face's Inference API
        # by model
        "POST /v2/embed", "POST /v2/rerank", "POST /score", "POST /v1/score", "POST /pooling",
        "POST /detokenize",
        "POST /models/{model_name}",
        # the Open Inference Protocol's
        "GET /v2", "GET /v2/health/live", "GET /v2/health/ready", "GET /v2/models/{model_name}",
        "GET /v2/models/{model_name}/ready", "POST /v2/models/{model_name}/infer",
        "POST /v2/repository/index", "POST /v2/repository/models/{model_name}/load",
        "POST /v2/repository/models/{model_name}/unload",
        "GET /v2/models/stats", "GET /v2/models/{model_name}/stats",
        "GET /v2/models/{model_name}/config",
        *(f"{method} /v2/models/{{model_name}}/versions/{{model_version}}{path}"
          for method, path in (("GET", ""), ("GET", "/ready"), ("POST", "/infer"),
                               ("GET", "/stats"), ("GET", "/config"))),
        # the probes answer HEAD too
        *(f"HEAD {path}" for path in ("/health", "/ready", "/ping", "/", "/v2/health/live",
                                      "/v2/health/ready"))]
    assert tested.split()[-1] == str(len(operations)), summary  # every operation
    assert " passed" in summary and "failure" not in summary.lower(), summary
