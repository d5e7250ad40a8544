"""End to end: fill-mask (/v1/fill-mask) equals transformers' fill-mask pipeline for the
transformers families' masked-language models (BERT's and DistilBERT's layouts);
huggingface_hub's fill_mask works against the root, and tritonclient against the Open
Inference Protocol."""

from __future__ import annotations

import asyncio
import json

import huggingface_hub
import huggingface_hub.constants
import huggingface_hub.utils
import numpy as np
import pytest
import tritonclient.http as triton

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server, transformers_pipeline

TEXTS = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK] all day long."]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill-mask")
    return {family: checkpoint.save(checkpoint.new(family, "tiny", "fill-mask", seed=4),
                                    root / family) for family in ("bert", "distilbert")}


@pytest.fixture(scope="module")
def url(exports, checkpoints, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("fill-mask-repo")
    exports(checkpoints["bert"], repo / "bert", "onnx", task="fill-mask", max_length=32, check=False)
    exports(checkpoints["distilbert"], repo / "distilbert", "torchscript",
            task="fill-mask", check=False)
    exports(checkpoints["bert"], repo / "bert-torch", "torch", task="fill-mask", check=False)
    exports(tiny_checkpoints["bert", "embed"], repo / "embedder", "onnx", check=False)
    with running_server(repo, max_inputs=8) as url:
        yield url


def pipe(checkpoints, family):
    return transformers_pipeline("fill-mask", checkpoints[family], family)


def fill(url, **body):
    return web.post(url + "/v1/fill-mask", json=body, timeout=60)


def same(ours: list[dict], theirs: list[dict]) -> None:
    assert [(t["token"], t["token_str"], t["sequence"]) for t in ours] == [
        (t["token"], t["token_str"], t["sequence"]) for t in theirs]
    np.testing.assert_allclose([t["score"] for t in ours], [t["score"] for t in theirs],
                               rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(("model", "family"), [("bert", "bert"), ("distilbert", "distilbert"),
                                               ("bert-torch", "bert")])  # ONNX, TS, torch
@pytest.mark.parametrize("options", [{}, {"top_k": 3}, {"targets": ["paris", "city",
                                                                     "capital", "zzzqx"]}])
def test_tokens_equal_the_transformers_pipeline(url, checkpoints, model, family, options):
    res = fill(url, model=model, inputs=TEXTS, **options)
    assert res.status_code == 200, res.text
    reference = pipe(checkpoints, family)
    one, two = res.json()["results"]
    assert len(one) == 1 and len(two) == 2  # per input, per mask
    same(one[0], reference(TEXTS[0], **options))  # one mask: a list
    for ours, theirs in zip(two, reference(TEXTS[1], **options)):  # several: one per mask
        same(ours, theirs)
        assert "[CLS]" in ours[0]["sequence"]  # the other mask kept, special tokens shown


def test_huggingface_hubs_fill_mask_at_the_root(exports, checkpoints, tmp_path, monkeypatch):
    exports(checkpoints["bert"], tmp_path / "lone" / "mlm", "onnx", task="fill-mask", check=False)
    expected = pipe(checkpoints, "bert")(TEXTS[0], top_k=2)
    with running_server(tmp_path / "lone") as lone:
        # the Inference API's answer: a text's tokens (per mask where it has several); for
        # a list, each's
        same(web.post(lone + "/", json={"inputs": TEXTS[0], "parameters": {"top_k": 2}}
                        ).json(), expected)
        both = web.post(lone + "/", json={"inputs": TEXTS}).json()
        assert len(both) == 2 and len(both[0]) == 5 and [len(m) for m in both[1]] == [5, 5]
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        huggingface_hub.utils.reset_sessions()
        try:
            got = huggingface_hub.InferenceClient(model=lone).fill_mask(TEXTS[0], top_k=2)
        finally:
            monkeypatch.undo()
            huggingface_hub.utils.reset_sessions()
    same([{"token": t.token, "token_str": t.token_str, "sequence": t.sequence,
           "score": t.score} for t in got], expected)


def test_the_open_inference_protocol_gives_each_inputs_tokens(url):
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    text = triton.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array(TEXTS, dtype=object))
    answer = client.infer("bert", [text], parameters={"top_k": 2})
    tokens = [json.loads(t) for t in answer.as_numpy("tokens")]
    assert tokens == fill(url, model="bert", inputs=TEXTS, top_k=2).json()["results"]
    listed = web.get(url + "/v1/models/bert").json()
    assert (listed["task"], listed["mask_token"]) == ("fill-mask", "[MASK]")


def test_refusals(url):
    for body, words in (
            ({"model": "bert", "inputs": "no mask here"}, "input 0 has no [MASK]"),
            ({"model": "bert", "inputs": TEXTS[0], "targets": ["\u0301"]}, "targets: none"),
            ({"model": "embedder", "inputs": TEXTS[0]}, "does embed, not fill-mask"),
            ({"model": "bert", "inputs": "word " * 40 + "[MASK]"}, "was cut")):
        res = fill(url, **body)
        assert res.status_code in (400, 422), res.text
        assert words in res.json()["error"]["message"], res.text
    res = web.get(url + "/info", params={"model": "bert"})
    assert res.status_code == 400 and "fill-mask" in res.text


def test_answers_are_bounded_as_the_other_answers(url):
    # each answer holds its input's tokens; masks x top_k answers of max_length (32) tokens
    # are counted as numbers against the answer's bound (2^25): 1048576 answers here
    texts = ["[MASK] " * 20] * 2
    res = fill(url, model="bert", inputs=texts, top_k=30522)
    assert res.status_code == 413, res.text
    assert res.json()["error"]["message"] == (
        "1220880 answers (40 masks x top_k 30522); model 'bert' answers at most 1048576 at "
        "once (each up to 32 tokens)")
    res = fill(url, model="bert", inputs=texts, top_k=30522, targets=["paris", "city"])
    assert res.status_code == 200, res.text  # targets bound each mask's answers: 80 here
    assert [len(answers) for answers in res.json()["results"][0]] == [2] * 20


def test_the_clients_fill_mask(url):
    from distilserve.client.api import AsyncDistilServeClient, DistilServeClient

    expected = fill(url, model="bert", inputs=TEXTS, top_k=2).json()["results"]
    with DistilServeClient(url) as client:
        assert client.fill_mask(TEXTS, model="bert", top_k=2) == expected

    async def run():
        async with AsyncDistilServeClient(url) as client:
            return await client.fill_mask(TEXTS[0], model="bert", targets=["capital"])

    (tokens,), = asyncio.run(run())
    assert [t["token_str"] for t in tokens] == ["capital"]
