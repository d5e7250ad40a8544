"""The service on CUDA (marked gpu; skipped where no GPU is visible): every family served
by the torch backend on the GPU in its auto dtype, with and without CUDA graphs, and every
family exported to ONNX (and a BGE-style model, pooling [CLS]) and served with the default
device, gives the CPU's embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distilserve.models import families
from distilserve.models.io import checkpoint, sentence_transformers
from tests import web
from tests.conftest import FAMILIES, running_server

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")]

TEXTS = ["The cat sat on the mat.", "GPUs multiply matrices quickly.", "short"]


def test_every_family_on_cuda_matches_the_cpu(exports, tiny_checkpoints, tmp_path):
    for family in FAMILIES:
        exports(tiny_checkpoints[family, "embed"], tmp_path / family, "torch")
    out = {}
    for device, graphs in (("cpu", 0), ("cuda", 0), ("cuda", 4096)):  # then CUDA graphs
        with running_server(tmp_path, device=device, cuda_graph_tokens=graphs) as url:
            models = web.get(url + "/v1/models").json()["data"]
            for m in models:
                want = ("fp16" if "fp16" in families.get(m["family"]).dtypes else "bf16")
                assert (m["device"], m["dtype"]) == (
                    ("cpu", "fp32") if device == "cpu" else ("cuda:0", want))
                assert m.get("cuda_graph_tokens", 0) == graphs
            for family in FAMILIES:
                r = web.post(url + "/v1/embed", json={"model": family, "inputs": TEXTS},
                               timeout=60)
                assert r.status_code == 200, r.text
                out[device, graphs, family] = np.array(r.json()["embeddings"])
    for family in FAMILIES:
        for graphs in (0, 4096):
            a, b = out["cpu", 0, family], out["cuda", graphs, family]
            assert (a * b).sum(-1).min() >= 0.999, (family, graphs)  # normalised: cosine


def test_onnx_models_are_served_on_the_gpu_by_default(exports, tiny_checkpoints, tmp_path):
    """`distilserve serve` of ONNX models (the embedded default's format) on a GPU machine:
    on the GPU, by ONNX Runtime with onnxruntime-gpu, else from each model's checkpoint
    traced with TorchScript; the CPU's embeddings either way."""
    from distilserve.models.runtime.onnx import has_cuda_provider

    repo = tmp_path / "repo"
    for family in FAMILIES:
        exports(tiny_checkpoints[family, "embed"], repo / family, "onnx")
    # a BGE-style model ([CLS] pooling, in its sentence-transformers files): traced from its
    # checkpoint on the GPU, it must pool as its ONNX graph does on the CPU
    bge = checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=5), tmp_path / "bge")
    sentence_transformers.write(sentence_transformers.Pipeline("cls", 64, True), bge, 32)
    exports(bge, repo / "bge", "onnx")
    names = [*FAMILIES, "bge"]
    out = {}
    for device in ("cpu", "auto"):
        with running_server(repo, device=device) as url:
            models = web.get(url + "/v1/models").json()["data"]
            assert sorted(m["id"] for m in models) == sorted(names)
            for m in models:
                assert m["backend"] == ("onnx" if device == "cpu" or has_cuda_provider()
                                        else "torchscript"), m
                assert m["device"].startswith("cpu" if device == "cpu" else "cuda"), m
            for name in names:
                r = web.post(url + "/v1/embed", json={"model": name, "inputs": TEXTS},
                               timeout=60)
                assert r.status_code == 200, r.text
                out[device, name] = np.array(r.json()["embeddings"])
    for name in names:
        assert (out["cpu", name] * out["auto", name]).sum(-1).min() >= 0.999, name


def test_question_answering_on_cuda_answers_as_the_cpu(exports, tmp_path):
    """A long context's windows batched on the GPU (fp32 there, so that near ties of a
    model with random weights keep their order) give the CPU's answers."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "qa", seed=3), tmp_path / "ck")
    exports(folder, tmp_path / "repo" / "squad", "torch")
    body = {"inputs": [{"question": "Where is the tower?",
                        "context": "The Eiffel Tower stands in Paris. " * 20}],
            "top_k": 3, "max_seq_len": 64, "doc_stride": 16}
    answers = {}
    for device in ("cpu", "cuda"):
        with running_server(tmp_path / "repo", device=device, dtype="fp32") as url:
            r = web.post(url + "/v1/qa", json=body, timeout=60)
            assert r.status_code == 200, r.text
            answers[device] = r.json()["results"][0]
    # (by text: spans of one text are one answer, its place the first of them found)
    assert [a["answer"] for a in answers["cuda"]] == [a["answer"] for a in answers["cpu"]]
    np.testing.assert_allclose([a["score"] for a in answers["cuda"]],
                               [a["score"] for a in answers["cpu"]], rtol=1e-3)


def test_fill_mask_on_cuda_fills_as_the_cpu(exports, tmp_path):
    """A fill-mask model on the GPU (fp32, as above): each batch started, collected and
    its mask tokens decoded together (the decoder on the GPU too), with the token ids it
    was started with; the CPU's tokens and scores."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask", seed=3),
                             tmp_path / "ck")
    exports(folder, tmp_path / "repo" / "mlm", "torch", task="fill-mask")
    body = {"inputs": [f"sentence {i} has a [MASK] here" + " and [MASK]" * (i % 3)
                       for i in range(12)], "top_k": 3}
    results = {}
    for device in ("cpu", "cuda"):
        with running_server(tmp_path / "repo", device=device, dtype="fp32") as url:
            r = web.post(url + "/v1/fill-mask", json=body, timeout=60)
            assert r.status_code == 200, r.text
            results[device] = r.json()["results"]
    for cpu, cuda in zip(results["cpu"], results["cuda"]):
        for on_cpu, on_cuda in zip(cpu, cuda, strict=True):  # each mask
            assert [t["token"] for t in on_cuda] == [t["token"] for t in on_cpu]
            np.testing.assert_allclose([t["score"] for t in on_cuda],
                                       [t["score"] for t in on_cpu], rtol=1e-3)
