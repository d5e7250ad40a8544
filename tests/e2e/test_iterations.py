"""A recursive model's depth per request (``iterations``): every depth of a kept loop, on
every native route that runs a model and OpenAI's, answered as PyTorch answers at that
depth; depths never share a forward pass; and what cannot be chosen is a 422 saying why."""

from __future__ import annotations

import asyncio
import random

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server

TEXTS = ["The Eiffel Tower stands in Paris.", "Bananas are rich in potassium.", "x"]


@pytest.fixture(scope="module")
def served(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterations")
    for family, task, fmt, loop in (("minialbert", "embed", "onnx", "keep"),
                                    ("falbert", "embed", "torchscript", "keep"),
                                    ("minialbert", "classify", "torch", "unroll"),
                                    ("falbert", "ner", "onnx", "keep"),
                                    ("minialbert", "embed", "onnx", "unroll"),
                                    ("bert", "embed", "onnx", "unroll")):
        exports(tiny_checkpoints[family, task], repo / f"{family}-{task}-{fmt}-{loop}",
                fmt, loop, check=False)
    with running_server(repo) as url:
        yield url, tiny_checkpoints


def post(url, route, body):
    return web.post(url + route, json=body, timeout=60)


def reference(folder, texts, depth):
    """The checkpoint at ``depth`` in PyTorch, [N, X] (per token: [N, T, X]), and the
    encodings."""
    ckpt = checkpoint.load(folder)
    enc = AutoTokenizer.from_pretrained(ckpt.tokenizer_dir)(texts, padding=True,
                                                            return_tensors="pt")
    with torch.no_grad():
        out = ckpt.model.eval().forward_iterations(enc["input_ids"], enc["attention_mask"],
                                                   enc["token_type_ids"], depth)
    return out.numpy(), enc


def test_models_lists_each_recursive_models_depths(served):
    url, _ = served
    listed = {m["id"]: m.get("iterations") for m in
              web.get(url + "/v1/models").json()["data"]}
    assert listed["minialbert-embed-onnx-keep"] == {"min": 1, "max": 3, "default": 3}
    assert listed["falbert-embed-torchscript-keep"] == {"min": 1, "max": 4, "default": 4}
    assert listed["minialbert-classify-torch-unroll"] == {"min": 1, "max": 3, "default": 3}
    assert listed["minialbert-embed-onnx-unroll"] == {"min": 3, "max": 3, "default": 3}
    assert listed["bert-embed-onnx-unroll"] is None


@pytest.mark.parametrize("name, family", [("minialbert-embed-onnx-keep", "minialbert"),
                                          ("falbert-embed-torchscript-keep", "falbert")])
def test_every_depth_embeds_as_pytorch_at_that_depth(served, name, family):
    url, checkpoints = served
    depths = web.get(url + "/v1/models/" + name).json()["iterations"]
    answers = []
    for depth in range(1, depths["max"] + 1):
        expected, _ = reference(checkpoints[family, "embed"], TEXTS, depth)
        expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
        native = post(url, "/v1/embed", {"model": name, "inputs": TEXTS, "iterations": depth})
        openai = post(url, "/v1/embeddings", {"model": name, "input": TEXTS,
                                              "iterations": depth})
        assert native.status_code == openai.status_code == 200, native.text
        got = np.array(native.json()["embeddings"])
        assert np.abs(got - expected).max() <= 1e-4, depth
        assert np.abs(np.array([d["embedding"] for d in openai.json()["data"]])
                      - expected).max() <= 1e-4
        answers.append(got)
    default = np.array(post(url, "/v1/embed", {"model": name, "inputs": TEXTS}).json()[
        "embeddings"])
    assert np.abs(default - answers[-1]).max() <= 1e-6
    assert np.abs(answers[0] - answers[-1]).max() > 1e-3


def test_classify_ner_and_rerank_take_iterations(served):
    url, checkpoints = served
    logits, _ = reference(checkpoints["minialbert", "classify"], TEXTS[:1], 1)
    classified = post(url, "/v1/classify", {"model": "minialbert-classify-torch-unroll",
                                            "inputs": TEXTS[:1], "function_to_apply": "none",
                                            "iterations": 1}).json()["results"][0]
    by_label = {r["label"]: r["score"] for r in classified}
    assert np.allclose([by_label["negative"], by_label["positive"]], logits[0], atol=1e-4)
    per_token, enc = reference(checkpoints["falbert", "ner"], TEXTS[:1], 2)
    raw = post(url, "/v1/ner", {"model": "falbert-ner-onnx-keep", "inputs": TEXTS[0],
                                "iterations": 2, "aggregation_strategy": "none",
                                "ignore_labels": []}).json()["results"][0]
    assert len(raw) == int(enc["attention_mask"].sum()) - 2  # every token of the text
    ranked = post(url, "/v1/rerank", {"model": "minialbert-embed-onnx-keep", "query": "Paris",
                                      "documents": TEXTS, "iterations": 1})
    assert ranked.status_code == 200, ranked.text
    # TEI's and Infinity's bodies take it too
    predicted = post(url, "/predict", {"model": "minialbert-classify-torch-unroll",
                                       "inputs": TEXTS[0], "raw_scores": True, "iterations": 1})
    assert predicted.status_code == 200, predicted.text
    assert np.allclose(sorted(s["score"] for s in predicted.json()), sorted(logits[0]),
                       atol=1e-4)
    for route, body in (("/rerank", {"query": "Paris", "texts": TEXTS}),
                        ("/classify", {"input": TEXTS})):
        model = "minialbert-classify-torch-unroll" if route == "/classify" else \
            "minialbert-embed-onnx-keep"
        answer = post(url, route, {"model": model, "iterations": 1, **body})
        assert answer.status_code == 200, (route, answer.text)
        assert post(url, route, {"model": model, "iterations": 9, **body}).status_code == 422


@pytest.mark.parametrize("body, message", [
    ({"model": "minialbert-embed-onnx-keep", "iterations": 4},
     "iterations 4: model 'minialbert-embed-onnx-keep' runs 1 to 3 iterations"),
    ({"model": "minialbert-embed-onnx-unroll", "iterations": 2},
     "iterations 2: model 'minialbert-embed-onnx-unroll' runs its 3 iterations unrolled"),
    ({"model": "bert-embed-onnx-unroll", "iterations": 2},
     "iterations 2: model 'bert-embed-onnx-unroll' is a bert model, not a recursive one"),
    ({"model": "minialbert-embed-onnx-keep", "iterations": 0}, "iterations"),
])
def test_a_depth_the_model_cannot_run_is_a_422_saying_why(served, body, message):
    url, _ = served
    answer = post(url, "/v1/embed", {"inputs": TEXTS, **body})
    assert answer.status_code == 422 and message in answer.json()["error"]["message"]


def test_an_unrolled_models_own_depth_is_taken(exports, served, tiny_checkpoints, tmp_path):
    url, _ = served
    assert post(url, "/v1/embed", {"model": "minialbert-embed-onnx-unroll", "inputs": "x",
                                   "iterations": 3}).status_code == 200
    exports(tiny_checkpoints["falbert", "embed"], tmp_path / "repo" / "traced",
            "torchscript", check=False)  # traced: unrolled
    with running_server(tmp_path / "repo") as other:
        answer = post(other, "/v1/embed", {"inputs": "x", "iterations": 4})
        assert answer.status_code == 200, answer.text


def _batches_by_depth(url, model) -> dict[str, float]:
    """distilserve_batches_by_iterations_total of ``model``: iterations -> forward passes."""
    return {sample.labels["iterations"]: sample.value
            for family in text_string_to_metric_families(web.get(url + "/metrics").text)
            for sample in family.samples
            if sample.name == "distilserve_batches_by_iterations_total"
            and sample.labels["model"] == model}


def test_mixed_depths_answer_each_at_its_own_and_batch_apart(served):
    url, _ = served
    name = "minialbert-embed-onnx-keep"
    alone = {depth: post(url, "/v1/embed", {"model": name, "inputs": TEXTS[0],
                                            "iterations": depth}).json()["embeddings"][0]
             for depth in (1, 2, 3)}
    before = _batches_by_depth(url, name)
    rng = random.Random(0)
    depths = [rng.choice((1, 2, 3)) for _ in range(48)]

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url + "/v1/embed", json={
                "model": name, "inputs": TEXTS[0], "iterations": d}) for d in depths))

    for depth, answer in zip(depths, asyncio.run(burst())):
        assert np.abs(np.array(answer.json()["embeddings"][0]) - alone[depth]).max() <= 1e-5
    after = _batches_by_depth(url, name)
    assert all(after.get(str(d), 0) > before.get(str(d), 0) for d in set(depths))


def test_the_open_inference_protocol_takes_iterations_as_a_parameter(served):
    url, _ = served
    name = "minialbert-embed-onnx-keep"
    native = post(url, "/v1/embed", {"model": name, "inputs": TEXTS[:1], "iterations": 1})
    infer = post(url, f"/v2/models/{name}/infer", {"parameters": {"iterations": 1}, "inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": TEXTS[:1]}]})
    assert infer.status_code == 200, infer.text
    assert np.allclose(infer.json()["outputs"][0]["data"], native.json()["embeddings"][0],
                       atol=1e-6)
    refused = post(url, f"/v2/models/{name}/infer", {"parameters": {"iterations": 9}, "inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": TEXTS[:1]}]})
    assert refused.status_code == 422 and "runs 1 to 3 iterations" in refused.json()["error"]
    config = web.get(url + f"/v2/models/{name}/config").json()["parameters"]
    assert config["iterations_min"] == {"string_value": "1"}
    assert config["iterations_max"] == {"string_value": "3"}


def test_the_python_client_sends_iterations(served):
    from distilserve.client import AsyncDistilServeClient, DistilServeClient

    url, _ = served
    name = "minialbert-embed-onnx-keep"
    native = post(url, "/v1/embed", {"model": name, "inputs": TEXTS, "iterations": 1}).json()
    with DistilServeClient(url) as client:
        assert np.allclose(client.embed(TEXTS, model=name, iterations=1),
                           native["embeddings"], atol=1e-6)
        assert len(client.rerank("Paris", TEXTS, model=name, iterations=2)) == 3

    async def asynchronous():
        async with AsyncDistilServeClient(url) as client:
            return await client.ner(TEXTS[0], model="falbert-ner-onnx-keep", iterations=1)

    assert isinstance(asyncio.run(asynchronous()), list)
