"""ONNX models are served without torch and transformers: ``distilserve serve`` works with
both unimportable, since the export recorded in the manifest what the service took from
transformers' tokenizer (its special tokens, and how it decodes; the Rust tokenizer is
checkpoint/tokenizer.json). That spares each serving process the ~300 MB and the seconds
their imports take. A model folder exported before (no ``tokenizer`` in its manifest) is
served through transformers, alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from distilserve.models import export
from distilserve.models.io import checkpoint
from distilserve.models.io.manifest import FILE
from distilserve.models.runtime.matrix_units import bf16_units
from tests import web
from tests.conftest import free_port, running_server, wait_for

pytestmark = pytest.mark.slow  # a real server in a subprocess

ROOT = Path(__file__).resolve().parents[2]
# the CLI with torch and transformers unimportable: any import of either raises ImportError
UNIMPORTABLE = ("import sys; sys.modules.update(torch=None, transformers=None); "
                "from distilserve.server.cli import main; sys.exit(main(sys.argv[1:]))")
MODELS = [("bert", "embed"), ("bert", "ner"), ("distilbert", "classify"), ("cmow", "embed"),
          ("minialbert", "classify"), ("bert", "fill-mask")]
ROUTES = {"embed": "/v1/embed", "classify": "/v1/classify", "ner": "/v1/ner",
          "fill-mask": "/v1/fill-mask"}
TEXTS = ["Kenji Tanaka flew from [MASK] to Paris, didn't he?", "naïve café, déjà vu [MASK] !"]


def answers(url: str) -> dict:
    """What each model answers for TEXTS, and their tokens."""
    out = {}
    for family, task in MODELS:
        name = f"{family}-{task}"
        for path in (ROUTES[task], "/v1/tokenize"):
            response = web.post(url + path, json={"inputs": TEXTS, "model": name}, timeout=60)
            assert response.status_code == 200, response.text
            out[name, path] = response.json()
    return out


def test_onnx_models_are_served_with_torch_and_transformers_unimportable(tiny_checkpoints,
                                                                         exports, tmp_path):
    repo, older = tmp_path / "repo", tmp_path / "older"
    # a fill-mask model whose tokenizer cleans up its decoded texts (spaces before ",", "?")
    masked = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), tmp_path / "masked")
    config = json.loads((masked / "tokenizer_config.json").read_text())
    (masked / "tokenizer_config.json").write_text(
        json.dumps({**config, "clean_up_tokenization_spaces": True}))
    for family, task in MODELS:
        folder = repo / f"{family}-{task}"
        source = masked if task == "fill-mask" else tiny_checkpoints[family, task]
        manifest = export.export(source, folder, "onnx", task=task)
        assert manifest.tokenizer.unk_token_id == 100  # bert-base-uncased's
        # the same folder as an export before the manifest said it: through transformers
        exports.copy(folder, older / folder.name)
        manifest = json.loads((folder / FILE).read_text())
        del manifest["tokenizer"]
        (older / folder.name / FILE).write_text(json.dumps(manifest))

    port, log = free_port(), tmp_path / "serve.log"
    # dtype auto, as served by default: on a CPU with bf16 matrix units it would run the
    # models' checkpoints in bf16, through torch; without torch, ONNX Runtime in fp32
    server = subprocess.Popen(
        [sys.executable, "-c", UNIMPORTABLE, "serve", "--model-repository", str(repo),
         "--port", str(port)], cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, "DISTILSERVE_DTYPE": "auto"})
    url = f"http://127.0.0.1:{port}"

    def ready():
        assert server.poll() is None, log.read_text()
        try:
            return web.get(url + "/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, "the server without torch")
        without = answers(url)
    finally:
        server.terminate()
        server.wait(120)
    assert "Traceback" not in log.read_text()
    if bf16_units():
        assert "bert-embed: ONNX Runtime on the CPU in fp32, not in bf16" in log.read_text()
    filled = without["bert-fill-mask", "/v1/fill-mask"]["results"][0][0]  # the first mask's
    assert all(a["sequence"].endswith(" to paris, didn't he?") for a in filled)  # cleaned up
    with running_server(older) as through_transformers:
        assert answers(through_transformers) == without
