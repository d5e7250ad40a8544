"""End to end: vLLM's pooling API (POST /pooling) and its encodings of packed numbers
(embed_dtype, endianness, bytes) on /pooling and /v1/embeddings give what the other routes
give."""

from __future__ import annotations

import base64
import json

import ml_dtypes
import numpy as np
import pytest

from tests import web
from tests.conftest import running_server

TEXTS = ["The soup was delicious.", "Kenji Tanaka lives in Osaka."]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    """One embedding model (exported with --token-embeddings: it also gives its tokens'
    vectors), a classifier and a NER model."""
    repo = tmp_path_factory.mktemp("vllm")
    exports(tiny_checkpoints["bert", "embed"], repo / "embedder", "onnx",
            token_embeddings=True, check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "classifier", "onnx", check=False)
    exports(tiny_checkpoints["bert", "ner"], repo / "tagger", "onnx", check=False)
    with running_server(repo) as url:
        yield url


def post(url, route, body):
    res = web.post(url + route, json=body, timeout=60)
    assert res.status_code == 200, (route, res.text)
    return res


def pooled(url, **body) -> list[np.ndarray]:
    answer = post(url, "/pooling", {"input": TEXTS, **body}).json()
    assert answer["object"] == "list" and answer["id"].startswith("pool-")
    assert [d["index"] for d in answer["data"]] == list(range(len(answer["data"])))
    return [np.array(d["data"]) for d in answer["data"]]


def token_counts(url) -> list[int]:
    return [len(t) for t in post(url, "/v1/tokenize", {"inputs": TEXTS}).json()]


def test_pooling_gives_each_models_own_output(url):
    """Unasked, each model's own kind: an embedding model's embeddings (the unnamed
    model: the one embedding model), a classifier's label scores, a NER model's scores of
    each token; use_activation false, the raw outputs."""
    embedded = post(url, "/v1/embeddings", {"input": TEXTS}).json()["data"]
    np.testing.assert_allclose(pooled(url), [d["embedding"] for d in embedded], atol=1e-6)
    raw = post(url, "/v1/embed", {"inputs": TEXTS, "normalize": False}).json()["embeddings"]
    np.testing.assert_allclose(pooled(url, use_activation=False), raw, atol=1e-5)
    np.testing.assert_allclose(pooled(url, normalize=False), raw, atol=1e-5)  # (its old name)

    scores = pooled(url, model="classifier")
    labels = web.get(url + "/v1/models/classifier").json()["labels"]
    ranked = post(url, "/v1/classify", {"model": "classifier", "inputs": TEXTS}).json()
    for row, each in zip(scores, ranked["results"]):
        assert dict(zip(labels, row)) == pytest.approx(
            {r["label"]: r["score"] for r in each}, abs=1e-6)
    logits = pooled(url, model="classifier", use_activation=False)
    for row, probabilities in zip(logits, scores):
        np.testing.assert_allclose(np.exp(row) / np.exp(row).sum(), probabilities, atol=1e-6)

    tokens = pooled(url, model="tagger")
    assert [t.shape[0] for t in tokens] == token_counts(url)
    np.testing.assert_allclose([t.sum(-1) for t in tokens[:1]], [np.ones(len(tokens[0]))],
                               atol=1e-5)
    tagged = post(url, "/v1/ner", {"model": "tagger", "inputs": TEXTS,
                                   "aggregation_strategy": "none", "ignore_labels": []}).json()
    for rows, entities in zip(tokens, tagged["results"]):
        found = [(e["index"], e["score"]) for e in entities]  # every token of text, its best
        assert [(i, pytest.approx(rows[i].max(), abs=1e-5)) for i, _ in found] == found
    logits = pooled(url, model="tagger", use_activation=False)
    assert not np.allclose(logits[0], tokens[0], atol=1e-2)


def test_pooling_gives_the_task_asked_for(url):
    """task token_embed: the tokens' vectors (of unit length; use_activation false, those
    the service pools into the embeddings); a task the model does not: a 400."""
    vectors = pooled(url, task="token_embed")
    assert [v.shape for v in vectors] == [(n, 32) for n in token_counts(url)]
    np.testing.assert_allclose([np.linalg.norm(v, axis=-1) for v in vectors[:1]],
                               [np.ones(len(vectors[0]))], atol=1e-5)
    raw = pooled(url, task="token_embed", use_activation=False)
    unpooled = post(url, "/v1/embed", {"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose([v.mean(0) for v in raw], unpooled["embeddings"], atol=1e-5)
    assert [v.shape for v in pooled(url, task="token_classify")] == [
        (n, 7) for n in token_counts(url)]  # the tagger, the one NER model
    for body, status, words in (
            ({"model": "tagger", "task": "classify"}, 400, "model 'tagger' does ner, not "
             "classify"),
            ({"model": "classifier", "task": "embed"}, 400, "does classify, not embed"),
            ({"task": "classify", "dimensions": 2}, 422, "dimensions: classify outputs are "
             "given whole"),
            ({"task": "pooled"}, 422, "task: Input should be 'embed', 'classify', "
             "'token_embed' or 'token_classify'")):
        res = web.post(url + "/pooling", json={"input": TEXTS, **body})
        assert res.status_code == status and words in res.json()["error"]["message"], res.text


def test_pooling_cuts_inputs_to_truncate_prompt_tokens(url):
    """truncate_prompt_tokens: each input as the model reads it cut to N tokens, [CLS] and
    [SEP] counted: a classifier scores the cut text, a tagger scores N tokens."""
    text = "the quick brown fox jumps over the lazy dog"  # each word a token
    cut = pooled(url, model="classifier", input=[text], truncate_prompt_tokens=5)
    short = pooled(url, model="classifier", input=["the quick brown"])
    np.testing.assert_allclose(cut, short, atol=1e-6)
    left = pooled(url, model="classifier", input=[text], truncate_prompt_tokens=5,
                  truncation_side="left")
    np.testing.assert_allclose(left, pooled(url, model="classifier", input=["the lazy dog"]),
                               atol=1e-6)
    assert pooled(url, model="tagger", input=[text], truncate_prompt_tokens=5)[0].shape[0] == 5
    res = web.post(url + "/pooling", json={"model": "classifier", "input": text,
                                           "truncate_prompt_tokens": 2})
    assert res.status_code == 422 and "leaves an input no token of its own" in res.text


@pytest.mark.parametrize("route", ["/pooling", "/v1/embeddings"])
def test_packed_numbers_in_base64_and_bytes(url, route):
    """embed_dtype and endianness pack base64's numbers (float16, bfloat16, big-endian);
    bytes sends the outputs packed one after another, its metadata header saying where each
    lies, bytes_only without the header."""
    key = "data" if route == "/pooling" else "embedding"
    floats = np.array([d[key] for d in post(url, route, {"input": TEXTS}).json()["data"]])
    for dtype, numpy_type in (("float16", "<f2"), ("bfloat16", ml_dtypes.bfloat16),
                              ("float32", ">f4")):
        endianness = "big" if dtype == "float32" else "little"
        answer = post(url, route, {"input": TEXTS, "encoding_format": "base64",
                                   "embed_dtype": dtype, "endianness": endianness}).json()
        got = [np.frombuffer(base64.b64decode(d[key]), numpy_type) for d in answer["data"]]
        np.testing.assert_allclose(np.array(got, dtype=np.float32), floats,
                                   atol=1e-7 if dtype == "float32" else 1e-2)
    res = post(url, route, {"input": TEXTS, "encoding_format": "bytes",
                            "embed_dtype": "float16"})
    assert res.headers["content-type"] == "application/octet-stream"
    metadata = json.loads(res.headers["metadata"])
    assert metadata["model"] == "embedder" and metadata["usage"]["prompt_tokens"] > 0
    got = [np.frombuffer(res.content[d["start"]:d["end"]], "<f2").reshape(d["shape"])
           for d in metadata["data"]]
    np.testing.assert_allclose(np.array(got, dtype=np.float32), floats, atol=1e-3)
    alone = post(url, route, {"input": TEXTS, "encoding_format": "bytes_only",
                              "embed_dtype": "float16"})
    assert "metadata" not in alone.headers and alone.content == res.content
    tokens = post(url, "/pooling", {"model": "tagger", "input": TEXTS,
                                    "encoding_format": "bytes"})
    where = json.loads(tokens.headers["metadata"])["data"]
    assert [d["shape"] for d in where] == [[n, 7] for n in token_counts(url)]
    assert where[-1]["end"] == len(tokens.content) == 4 * 7 * sum(token_counts(url))


def test_priority_is_taken_where_vllm_takes_it(url):
    """vLLM's priority (a batch starts from the lowest queued: tests/server/test_batching)
    on its embeddings, pooling, score and rerank bodies: the answers as without it; not a
    whole number, a 422."""
    bodies = {"/v1/embeddings": {"input": TEXTS}, "/pooling": {"input": TEXTS},
              "/score": {"text_1": TEXTS[0], "text_2": TEXTS},
              "/rerank": {"query": TEXTS[0], "documents": TEXTS}}
    for route, body in bodies.items():
        plain = post(url, route, body).json()
        urgent = post(url, route, {**body, "priority": -5}).json()
        for answer in (plain, urgent):
            answer.pop("id", None), answer.pop("created", None)
        assert urgent == plain, route
        res = web.post(url + route, json={**body, "priority": 1.5})
        assert res.status_code == 422 and "priority" in res.json()["error"]["message"]
