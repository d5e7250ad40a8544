"""End to end: a real server on 127.0.0.1 serving exported tiny models of every family
and backend, plus the real all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import socket
import time
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, pipeline

from distilserve.models import families
from distilserve.models.io import checkpoint, sentence_transformers
from loadtests import lightload
from tests import web
from tests.conftest import FAMILIES, running_server, wait_for

# (task, backend, loop) served for every family
SERVED = [("embed", "onnx", "unroll"), ("classify", "torchscript", "unroll"),
          ("ner", "torch", "unroll"), ("ner", "onnx", "unroll"), ("classify", "onnx", "unroll")]
TRICKY = ["Angela Merkel visited Paris and Zürich with Café Müller GmbH.",
          "Ich heiße José Ñúñez 😊 and I work at Apple   in   Cupertino.",
          "東京タワーは日本にあります。 Tokyo Tower is in Japan!",
          "  Leading and trailing spaces, and   repeated   spaces.  ",
          "unaffable antidisestablishmentarianism [UNK] ☃☃ done"]
LONG = "a " * 600  # 602 tokens with [CLS] and [SEP], past any model's max_length here


def name(family, task, fmt, loop="unroll"):
    return f"{family}-{task}-{fmt}" + ("-keep" if loop == "keep" else "")


BGE_PROMPTS = {"query": "Represent this sentence for searching relevant passages: ",
               "passage": "passage: "}


def _bge_like(folder):
    """A tiny BERT saved as sentence-transformers saves BGE and E5: [CLS] pooling, prompts
    by name, one of them the default."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=5), folder)
    sentence_transformers.write(sentence_transformers.Pipeline(
        "cls", 64, True, BGE_PROMPTS, default_prompt_name="passage"), folder, 32)
    return folder


def _multi_label(folder):
    """A tiny BERT classifier whose labels are independent, as toxicity models' are."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "classify",
                                            ["toxic", "insult", "threat"], seed=6), folder)
    config = json.loads((folder / "config.json").read_text())
    config["problem_type"] = "multi_label_classification"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def repository(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    cases = [(f, *s) for f in FAMILIES for s in SERVED]
    cases += [(f, "ner", "onnx", "keep") for f in families.RECURSIVE]
    cases += [(f, "embed", "torchscript", "keep") for f in families.RECURSIVE]
    for family, task, fmt, loop in cases:
        exports(tiny_checkpoints[family, task], repo / name(family, task, fmt, loop),
                fmt, loop, check=False)
    exports(checkpoint.minilm_path(), repo / "minilm", "onnx", max_length=256, check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cross-checkpoint")  # one logit: a cross-encoder
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    exports(_bge_like(repo.parent / "bge-checkpoint"), repo / "bge", "onnx", check=False)
    exports(_multi_label(repo.parent / "multilabel-checkpoint"), repo / "multilabel",
            "onnx", check=False)
    (repo / "broken").mkdir()
    (repo / "broken" / "manifest.json").write_text(json.dumps(
        {"task": "embed", "family": "bert", "backend": "onnx", "max_length": 8,
         "artifact": "model.onnx"}))
    (repo / "broken" / "model.onnx").write_bytes(b"not an onnx file")
    return repo


@pytest.fixture(scope="module")
def minilm_alone(repository, exports, tmp_path_factory):
    """A repository of the MiniLM alone, for the servers started with settings of their own."""
    small = tmp_path_factory.mktemp("minilm-alone")
    exports.copy(repository / "minilm", small / "minilm")
    return small


@pytest.fixture(scope="module")
def url(repository):
    with running_server(repository, max_inputs=64, max_input_chars=2000,
                        max_body_bytes=200_000) as url:
        yield url


def post(url, route, body, **kw):
    return web.post(url + route, json=body, timeout=60, **kw)


def test_models_lists_every_good_folder_and_omits_the_broken_one(url, repository):
    data = web.get(url + "/v1/models").json()["data"]
    ids = {m["id"] for m in data}
    expected = {p.name for p in repository.iterdir() if p.is_dir()} - {"broken"}
    assert ids == expected
    minilm = next(m for m in data if m["id"] == "minilm")
    assert (minilm["task"], minilm["dimensions"], minilm["max_length"]) == ("embed", 384, 256)
    # OpenAI's model object: created is when it was exported, in Unix seconds
    exported = (repository / "minilm" / "manifest.json").stat().st_mtime
    assert (minilm["object"], minilm["created"]) == ("model", int(exported))
    ready = web.get(url + "/ready").json()
    assert "broken" in ready["failed"] and "model.onnx" in ready["failed"]["broken"]


def test_strict_readiness_is_503_while_a_model_failed(repository, exports, tmp_path):
    small = tmp_path / "repo"
    small.mkdir()
    for folder in (name("bert", "embed", "onnx"), "broken"):
        exports.copy(repository / folder, small / folder)
    with running_server(small, until="/health", require_all_models=True) as u:
        ready = wait_for(lambda: (r := web.get(u + "/ready")).status_code == 503
                         and "failed" in r.json()["status"] and r, "the load to finish")
        assert "broken" in ready.json()["status"] and "model.onnx" in ready.json()["status"]
        # the models that loaded are served all the same
        assert post(u, "/v1/embed", {"inputs": "x"}).status_code == 200


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_backend_serves_what_pytorch_computes(url, tiny_checkpoints, family):
    served = [(t, f, loop) for t, f, loop in SERVED] + (
        [("ner", "onnx", "keep"), ("embed", "torchscript", "keep")]
        if family in families.RECURSIVE else [])
    text = "The quick brown fox jumps over the lazy dog."
    for task, fmt, loop in served:
        ckpt = checkpoint.load(tiny_checkpoints[family, task])
        tok = AutoTokenizer.from_pretrained(tiny_checkpoints[family, task])
        enc = tok([text], return_tensors="pt")
        with torch.no_grad():
            ref = ckpt.model(enc["input_ids"], enc["attention_mask"],
                             enc["token_type_ids"])[0].numpy()
        model = name(family, task, fmt, loop)
        if task == "embed":
            got = np.array(post(url, "/v1/embed", {"model": model, "inputs": text,
                                                   "normalize": False}).json()["embeddings"][0])
            assert np.abs(got - ref).max() <= 1e-4, model
        elif task == "classify":
            res = post(url, "/v1/classify", {"model": model, "inputs": [text]}).json()
            scores = {r["label"]: r["score"] for r in res["results"][0]}
            probs = np.exp(ref - ref.max()) / np.exp(ref - ref.max()).sum()
            assert abs(scores[ckpt.labels[0]] - probs[0]) <= 1e-4, model
        else:
            res = post(url, "/v1/ner", {"model": model, "inputs": text,
                                        "aggregation_strategy": "none"}).json()
            for ent in res["results"][0]:
                probs = np.exp(ref[ent["index"]]) / np.exp(ref[ent["index"]]).sum()
                assert abs(probs.max() - ent["score"]) <= 1e-4, model
                assert text[ent["start"]:ent["end"]] == ent["word"]


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_ner_equals_the_transformers_pipeline(url, tiny_checkpoints, strategy):
    pipe = pipeline("token-classification", model=tiny_checkpoints["bert", "ner"],
                    aggregation_strategy=strategy, device="cpu")
    res = post(url, "/v1/ner", {"model": "bert-ner-onnx", "inputs": TRICKY,
                                "aggregation_strategy": strategy})
    assert res.status_code == 200
    for text, ours, theirs in zip(TRICKY, res.json()["results"], pipe(TRICKY)):
        key = "entity" if strategy == "none" else "entity_group"
        assert [(e[key], e["start"], e["end"]) for e in ours] == \
               [(e[key], e["start"], e["end"]) for e in theirs]
        for a, b in zip(ours, theirs):
            assert abs(a["score"] - float(b["score"])) <= 1e-4
            assert text[a["start"]:a["end"]] == a["word"]


def test_classify_equals_the_transformers_pipeline_for_texts_and_pairs(url, tiny_checkpoints):
    pipe = pipeline("text-classification", model=tiny_checkpoints["bert", "classify"],
                    top_k=None, device="cpu")
    inputs = TRICKY[:3] + [["How old are you?", "What is your age?"]]
    res = post(url, "/v1/classify", {"model": "bert-classify-onnx", "inputs": inputs}).json()
    theirs = pipe(TRICKY[:3]) + [pipe({"text": inputs[3][0], "text_pair": inputs[3][1]})]
    for ours, ref in zip(res["results"], theirs):
        assert [r["label"] for r in ours] == [r["label"] for r in ref]
        assert np.allclose([r["score"] for r in ours], [r["score"] for r in ref], atol=1e-4)
    top = post(url, "/v1/classify", {"model": "bert-classify-onnx", "inputs": "x",
                                     "top_k": 1}).json()["results"][0]
    assert len(top) == 1
    # function_to_apply as the pipeline's; raw_scores: the logits, as its "none"
    for options, function in (({"raw_scores": True}, "none"),
                              ({"function_to_apply": "none"}, "none"),
                              ({"function_to_apply": "sigmoid"}, "sigmoid"),
                              ({"function_to_apply": "softmax"}, "softmax")):
        got = post(url, "/v1/classify", {"model": "bert-classify-onnx", "inputs": inputs[:3],
                                         **options}).json()
        for ours, ref in zip(got["results"], pipe(TRICKY[:3], function_to_apply=function)):
            assert [r["label"] for r in ours] == [r["label"] for r in ref]
            assert np.allclose([r["score"] for r in ours], [r["score"] for r in ref],
                               atol=1e-4)
    both = post(url, "/v1/classify", {"model": "bert-classify-onnx", "inputs": "x",
                                      "raw_scores": True, "function_to_apply": "softmax"})
    assert both.status_code == 422 and "send one" in both.json()["error"]["message"]
    zero = post(url, "/v1/classify", {"inputs": "x", "candidate_labels": ["a", "b"],
                                      "function_to_apply": "none"})
    assert zero.status_code == 422 and "multi_label" in zero.json()["error"]["message"]


def test_a_multi_label_classifier_scores_each_label_as_the_pipeline_does(url, repository):
    pipe = pipeline("text-classification", model=str(repository.parent / "multilabel-checkpoint"),
                    top_k=None, device="cpu")
    res = post(url, "/v1/classify", {"model": "multilabel", "inputs": TRICKY[:3]}).json()
    for ours, ref in zip(res["results"], pipe(TRICKY[:3])):
        assert [r["label"] for r in ours] == [r["label"] for r in ref]
        assert np.allclose([r["score"] for r in ours], [r["score"] for r in ref], atol=1e-4)
        assert abs(sum(r["score"] for r in ours) - 1) > 1e-3  # independent: no softmax
    # the softmax when asked for, as the pipeline's function_to_apply
    res = post(url, "/v1/classify", {"model": "multilabel", "inputs": TRICKY[:3],
                                     "function_to_apply": "softmax"}).json()
    for ours, ref in zip(res["results"], pipe(TRICKY[:3], function_to_apply="softmax")):
        assert np.allclose([r["score"] for r in ours], [r["score"] for r in ref], atol=1e-4)
    assert web.get(url + "/v1/models/multilabel").json()["multi_label"] is True


def test_embeddings_equal_in_process_pytorch_minilm(url):
    ckpt = checkpoint.load(checkpoint.minilm_path())
    tok = AutoTokenizer.from_pretrained(ckpt.tokenizer_dir)
    texts = ["A man is playing a guitar.", "Der Kaffee ist heiß ☕", TRICKY[2]]
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = torch.nn.functional.normalize(ckpt.model(
            enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]), dim=-1).numpy()
    got = np.array(post(url, "/v1/embed", {"model": "minilm", "inputs": texts}).json()["embeddings"])
    assert np.abs(got - ref).max() <= 1e-4
    oa = post(url, "/v1/embeddings", {"model": "minilm", "input": texts,
                                      "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                        for d in oa["data"]])
    assert np.abs(decoded - ref).max() <= 1e-4
    assert oa["usage"]["prompt_tokens"] == int(enc["attention_mask"].sum())


def test_truncate_prompt_tokens_cuts_each_input_to_what_the_model_reads(url):
    """vLLM's truncate_prompt_tokens on /v1/embeddings: each input as the model reads it
    (its [CLS] and [SEP], and a default prompt, counted) at most N tokens; its
    add_special_tokens false is refused."""
    text = "the quick brown fox jumps over the lazy dog"

    def embedded(model, inputs, **cap):
        answer = post(url, "/v1/embeddings", {"model": model, "input": inputs, **cap})
        assert answer.status_code == 200, answer.text
        return np.array([d["embedding"] for d in answer.json()["data"]]), answer.json()["usage"]

    tokens = post(url, "/v1/tokenize", {"model": "minilm", "inputs": text,
                                        "add_special_tokens": False}).json()[0]
    ids = [t["id"] for t in tokens]
    for model, prompt in (("minilm", 0), ("bge", 2)):  # bge: "passage: " before each text
        cut, usage = embedded(model, [text, "a fox"], truncate_prompt_tokens=6)
        kept = 6 - 2 - prompt  # the tokens of the text it keeps
        short, short_usage = embedded(model, [text[:tokens[kept - 1]["stop"]], "a fox"])
        assert np.abs(cut - short).max() <= 1e-6 and usage == short_usage
        whole, whole_usage = embedded(model, [text, "a fox"])
        assert np.abs(cut[0] - whole[0]).max() > 1e-3 and np.allclose(cut[1], whole[1])
        kept_whole = embedded(model, [text, "a fox"], truncate_prompt_tokens=-1)
        assert np.abs(kept_whole[0] - whole).max() <= 1e-6 and kept_whole[1] == whole_usage
    by_ids, usage = embedded("minilm", [ids], truncate_prompt_tokens=5)  # ids, no prompt
    assert usage["prompt_tokens"] == 5
    assert np.abs(by_ids - embedded("minilm", [ids[:3]])[0]).max() <= 1e-6
    # vLLM's truncation_side left: the last tokens kept (each word of the text one token)
    for sent, last in (([text], [" ".join(text.split()[-3:])]), ([ids], [ids[-3:]])):
        left, _ = embedded("minilm", sent, truncate_prompt_tokens=5, truncation_side="left")
        assert np.abs(left - embedded("minilm", last)[0]).max() <= 1e-6
    refused = post(url, "/v1/embeddings", {"model": "bge", "input": text,
                                           "truncate_prompt_tokens": 4})
    assert refused.status_code == 422 and refused.json()["error"]["message"] == (
        "truncate_prompt_tokens 4 leaves an input no token of its own: model 'bge' reads 2 "
        "special tokens and 2 of its prompt with each"), refused.text
    unserved = post(url, "/v1/embeddings", {"model": "minilm", "input": text,
                                            "add_special_tokens": False})
    assert unserved.status_code == 422 and "add_special_tokens: false is not served" in \
        unserved.json()["error"]["message"], unserved.text


def test_vllms_tokenize_and_detokenize_bodies(url):
    """/tokenize takes vLLM's body (``prompt``) beside TEI's and answers in vLLM's shape;
    /detokenize reads ids back, special tokens included."""
    text = "Tokenisation works"
    tei = post(url, "/tokenize", {"model": "minilm", "inputs": text}).json()[0]
    answer = post(url, "/tokenize", {"model": "minilm", "prompt": text,
                                     "return_token_strs": True}).json()
    assert answer["tokens"] == [t["id"] for t in tei] and answer["count"] == len(tei)
    assert answer["max_model_len"] == 256  # minilm's, as exported here
    strs = answer["token_strs"]
    assert (strs[0], strs[-1]) == ("[CLS]", "[SEP]") and any(s.startswith("##") for s in strs)
    bare = post(url, "/tokenize", {"model": "minilm", "prompt": text,
                                   "add_special_tokens": False}).json()
    assert bare["tokens"] == answer["tokens"][1:-1] and bare["token_strs"] is None
    back = post(url, "/detokenize", {"model": "minilm", "tokens": answer["tokens"]})
    assert back.json() == {"prompt": "[CLS] tokenisation works [SEP]"}, back.text
    refused = post(url, "/tokenize", {"model": "minilm"})  # neither body: TEI's errors
    assert refused.status_code == 422 and "inputs" in refused.json()["error"]["message"]
    refused = post(url, "/detokenize", {"model": "minilm", "tokens": [10**9]})
    assert refused.status_code == 422, refused.text


def test_official_openai_client(url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    out = client.embeddings.create(model="minilm", input=["hello", "world"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == 384
    assert abs(np.linalg.norm(out.data[0].embedding) - 1) < 1e-4
    short = client.embeddings.create(model="minilm", input="hello", dimensions=128)
    assert len(short.data[0].embedding) == 128
    ids = client.embeddings.create(model="minilm", input=[[7592]])  # "hello"
    assert np.allclose(ids.data[0].embedding, out.data[0].embedding, atol=1e-5)
    assert client.models.retrieve("minilm").id == "minilm"


def _metric(url, name, **labels):
    """A sample's value in /metrics (0 before its first observation); ``labels`` in the
    order the metric declares them."""
    text = web.get(url + "/metrics").text
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"{re.escape(f'{name}{{{selector}}}')} ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def _forward_passes(url, model):
    return _metric(url, "distilserve_batch_size_count", model=model)


def test_metrics_time_each_requests_wait_for_its_batch(url):
    before = _metric(url, "distilserve_queue_seconds_count", model="minilm")
    assert post(url, "/v1/embed", {"model": "minilm", "inputs": ["a", "b", "c"]}).status_code == 200
    assert _metric(url, "distilserve_queue_seconds_count", model="minilm") == before + 1
    assert _metric(url, "distilserve_queue_seconds_sum", model="minilm") > 0


def test_concurrent_requests_are_batched_and_unchanged(url):
    texts = [f"sentence number {i} " + "word " * (i % 13) for i in range(64)]
    alone = [post(url, "/v1/embed", {"model": "minilm", "inputs": t}).json()["embeddings"][0]
             for t in texts]
    before = _forward_passes(url, "minilm")

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url + "/v1/embed", json={
                "model": "minilm", "inputs": t}) for t in texts))

    responses = asyncio.run(burst())
    passes = _forward_passes(url, "minilm") - before
    together = [r.json()["embeddings"][0] for r in responses]
    assert np.abs(np.array(together) - np.array(alone)).max() <= 1e-4
    assert passes < len(texts)


BAD = [
    ("/v1/embed", b'{"inputs": ', 422, "malformed JSON"),
    ("/v1/embed", b"[" * 50_000 + b"]" * 50_000, 422, "nested too deeply"),
    ("/v1/embed", {"inputs": 5}, 422, "inputs"),
    ("/v1/embed", b'{"model": "minilm", "inputs": ["fine", "a\\ud800"]}', 422,
     "input 1 is not valid Unicode"),
    ("/v1/classify", b'{"model": "bert-classify-onnx", "inputs": [["a", "\\udfff"]]}', 422,
     "input 0 is not valid Unicode"),
    ("/v1/embed", {"model": "minilm", "inputs": []}, 422, "at least 1"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "encoding_format": "int8"}, 422,
     "encoding_format"),
    ("/v1/ner", {"model": "bert-ner-onnx", "inputs": "x", "aggregation_strategy": "best"},
     422, "aggregation_strategy"),
    ("/v1/classify", {"model": "bert-classify-onnx", "inputs": [["a", "b", "c"]]}, 422,
     "inputs"),
    ("/v1/embed", {"model": "minilm", "inputs": ["x"] * 65}, 413, "at most 64"),
    ("/v1/embed", {"model": "minilm", "inputs": "x" * 2001}, 413, "2001 characters"),
    ("/v1/embed", {"model": "minilm", "inputs": "word " * 400, "truncate": False}, 413,
     "max_length 256"),
    ("/v1/embed", {"model": "minilm", "inputs": ["y" * 1000] * 300}, 413,
     "over the limit of 200000"),
    ("/v1/embed", {"model": "nope", "inputs": "x"}, 404, "unknown model 'nope'"),
    ("/v1/embed", {"model": "bert-ner-onnx", "inputs": "x"}, 400, "does ner"),
    ("/v1/embed", {"inputs": "x"}, 400, "several models do embed ("),
    ("/v1/nothing", {"inputs": "x"}, 404,
     "no route POST /v1/nothing (GET /openapi.json lists them)"),
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": []}, 422, "at least 1"),
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": ["d"], "top_n": -3}, 422,
     "top_n"),
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": ["d"] * 10_000}, 413,
     "10000 documents; at most 64"),
    ("/v1/rerank", {"model": "bert-ner-onnx", "query": "q", "documents": ["d"]}, 400,
     "does ner"),
    ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}, 404, "unknown"),
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": [{"txt": "d"}]}, 422,
     "documents.0.text: Field required"),  # no union branch names in the message
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 1000}, 422,
     "dimensions 1000 is more than the width of model 'minilm', 384"),
    ("/v1/embed", {"model": "minilm", "inputs": "x", "dimensions": 0}, 422, "dimensions"),
    ("/v1/embeddings", {"model": "minilm", "input": [[2023, 999_999]]}, 422,
     "input 0: token id 999999 is not in the vocabulary of model 'minilm'"),
    ("/v1/embeddings", {"model": "minilm", "input": [[5], [-1]]}, 422,
     "input.1.0: Input should be greater than or equal to 0"),
    ("/v1/embeddings", {"model": "minilm", "input": []}, 422, "input"),
    ("/v1/tokenize", {"model": "nope", "inputs": "x"}, 404, "unknown model"),
    ("/v1/tokenize", {"model": "minilm", "inputs": []}, 422, "at least 1"),
    # not JSON at all: 422 (as the docs say), not FastAPI's 400
    ("/v1/embed", b'{"model": "minilm", "inputs": "\xff\xfe"}', 422, "not UTF-8"),
    ("/v1/embed", b'{"model": "minilm", "inputs": "x", "dimensions": ' + b"9" * 5000 + b"}",
     422, "malformed JSON: a number of more than 4300 digits"),
    ("/v1/classify", b"[" * 10_000 + b"]" * 10_000, 422, "nested too deeply"),
    ("/v1/ner", b'{"inputs": "x",', 422, "malformed JSON"),
    # strict types and bounded integers
    ("/v1/embed", {"model": "minilm", "inputs": "x", "truncate": 0}, 422,
     "truncate: Input should be a valid boolean"),
    ("/v1/embed", {"model": "minilm", "inputs": "x", "normalize": "false"}, 422, "normalize"),
    ("/v1/classify", {"model": "bert-classify-onnx", "inputs": "x", "top_k": 2**70}, 422,
     "top_k: Input should be less than or equal to 2147483647"),
    ("/v1/classify", {"model": "bert-classify-onnx", "inputs": "x", "top_k": "2"}, 422,
     "top_k"),
    ("/v1/embeddings", {"model": "minilm", "input": [[True]]}, 422, "input"),
    ("/v1/embeddings", {"model": "minilm", "input": [2023, 2**40]}, 422, "input"),
]


@pytest.mark.parametrize("route,body,status,words", BAD)
def test_bad_requests_get_the_documented_error(url, route, body, status, words):
    if isinstance(body, bytes):
        res = web.post(url + route, content=body, headers={"content-type": "application/json"})
    else:
        res = post(url, route, body)
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert set(err) == {"type", "message"} and words in err["message"]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain",
                                          "multipart/form-data; boundary=x"])
def test_a_json_body_sent_as_another_content_type_is_told_to_send_json(url, content_type):
    # curl -d sends the first; FastAPI alone says "body: Input should be a valid dictionary"
    res = web.post(url + "/v1/embed", content=b'{"model": "minilm", "inputs": "x"}',
                     headers={"content-type": content_type})
    assert res.status_code == 422, res.text
    message = res.json()["error"]["message"]
    assert "Content-Type: application/json" in message and repr(content_type) in message


def test_the_fast_path_answers_as_fastapi_does(url):
    # the inference routes are answered by distilserve/server/routes/fast_path.py: its errors are the
    # documented ones, the same on every route
    for body, status in (({"inputs": 5}, 422), ({"model": "nope", "inputs": "x"}, 404),
                         ({"inputs": "x" * 2001}, 413)):
        embed, ner = (post(url, route, {"model": model, **body}) for route, model in
                      (("/v1/embed", "minilm"), ("/v1/ner", "bert-ner-onnx")))
        assert embed.status_code == ner.status_code == status
        assert embed.json() == ner.json()
    # a body that does not validate is FastAPI's to refuse (pydantic on JSON text would
    # say "valid array"; FastAPI validates the parsed body: "valid list")
    bad = post(url, "/v1/classify", {"model": "bert-classify-onnx", "inputs": 5})
    assert "Input should be a valid list" in bad.json()["error"]["message"]
    # a body that is not JSON, and another method, go on to FastAPI as before
    res = web.post(url + "/v1/embed", content=b'{"inputs": "x"}',
                     headers={"content-type": "text/plain"})
    assert res.status_code == 422 and res.json()["error"]["type"] == "invalid_request"
    assert web.get(url + "/v1/embed").status_code == 405


def test_openapi_documents_every_route_and_its_errors(url):
    schema = web.get(url + "/openapi.json").json()
    for route in ("/v1/embeddings", "/v1/embed", "/v1/classify", "/v1/ner", "/v1/rerank",
                  "/v1/tokenize"):
        post_op = schema["paths"][route]["post"]
        assert "requestBody" in post_op, route
        errors = {"400", "401", "404", "413", "422", "503"}
        if route != "/v1/tokenize":  # tokenising is never queued: no 429
            errors.add("429")
        assert set(post_op["responses"]) == {"200"} | errors, route
        assert post_op["responses"]["422"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}, route
    assert "EmbedResponse" in schema["components"]["schemas"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # FastAPI's shape
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {
        "text/plain"}
    assert set(schema["paths"]["/v1/models/{model_id}"]["get"]["responses"]) == {
        "200", "401", "404", "422"}
    assert "securitySchemes" not in schema.get("components", {})  # no API key here
    assert web.get(url + "/docs").status_code == 200


def test_a_body_without_content_type_is_read_as_json(url):
    good = web.post(url + "/v1/embed", content=b'{"model": "minilm", "inputs": "x"}')
    assert good.status_code == 200 and len(good.json()["embeddings"][0]) == 384
    bad = web.post(url + "/v1/embed", content=b"\xff")
    assert bad.status_code == 422 and "not UTF-8" in bad.json()["error"]["message"]


def test_a_chunked_body_over_the_limit_gets_413(url):
    def chunks():  # no Content-Length: the limit applies while the body is read
        yield b'{"model": "minilm", "inputs": "'
        for _ in range(300):
            yield b"y" * 1000
        yield b'"}'

    res = web.post(url + "/v1/embed", content=chunks(),
                     headers={"content-type": "application/json"})
    assert res.status_code == 413, res.text
    assert "over the limit of 200000" in res.json()["error"]["message"]
    assert post(url, "/v1/embed", {"model": "minilm", "inputs": "fine"}).status_code == 200


def test_a_client_gone_before_its_body_arrived_is_a_499_not_a_500(url, caplog):
    """Half a body, then the connection closes: counted as the client's doing (499), with
    no traceback in the log, and the service goes on."""
    def count(status):
        return _metric(url, "distilserve_requests_total", route="/v1/embed", status=status)

    before = {status: count(status) for status in ("499", "500")}
    port = urlsplit(url).port
    uvicorn_log = logging.getLogger("uvicorn.error")  # which does not propagate
    uvicorn_log.addHandler(caplog.handler)
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(lightload.request(
                    "/v1/embed", b'{"model": "minilm", "inputs": "half a bo', length=1000))
        wait_for(lambda: count("499") - before["499"] == 3, "three 499s", seconds=120)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert count("500") == before["500"]
    assert "Exception in ASGI application" not in caplog.text
    assert post(url, "/v1/embed", {"model": "minilm", "inputs": "fine"}).status_code == 200


def test_empty_strings_are_texts_too(url):
    for route, body in (("/v1/embed", {"model": "minilm", "inputs": ""}),
                        ("/v1/embeddings", {"model": "minilm", "input": ""}),
                        ("/v1/ner", {"model": "bert-ner-onnx", "inputs": [""]})):
        assert post(url, route, body).status_code == 200, route


def test_truncate_true_accepts_the_same_long_text(url):
    res = post(url, "/v1/embed", {"model": "minilm", "inputs": "word " * 400})
    assert res.status_code == 200 and res.json()["usage"]["prompt_tokens"] == 256


@pytest.mark.parametrize("truncate", [True, False])
def test_responses_say_where_their_time_went_as_tei_does(url, truncate):
    texts = ["The cat sat on the mat.", "Dogs bark."]
    res = post(url, "/v1/embed", {"model": "minilm", "inputs": texts, "truncate": truncate})
    assert res.status_code == 200
    h = res.headers
    assert int(h["x-compute-tokens"]) == res.json()["usage"]["prompt_tokens"] == 14
    assert int(h["x-compute-characters"]) == sum(map(len, texts))
    assert h["x-compute-type"] == "cpu" and h["x-compute-time"] == h["x-total-time"]
    # Server-Timing: the same times to the microsecond; the parts fit in the whole
    timing = dict(part.split(";dur=") for part in h["server-timing"].split(", "))
    ms = {name: float(value) for name, value in timing.items()}
    assert set(ms) == {"tokenization", "queue", "inference", "total"}
    for name, value in ms.items():  # TEI's headers: whole milliseconds
        assert int(h[f"x-{name}-time"]) == int(value)
    assert ms["tokenization"] > 0 and ms["inference"] > 0 and ms["queue"] >= 0
    assert ms["tokenization"] + ms["queue"] + ms["inference"] <= ms["total"] + 0.002


def test_truncation_direction_left_keeps_the_end_of_a_long_text(url):
    text = "word " * 300 + "the cat sat on the mat"  # 306 tokens; 2000 characters at most
    ids = [t["id"] for t in post(url, "/v1/tokenize", {"model": "minilm", "inputs": text,
                                                       "add_special_tokens": False}).json()[0]]

    def embed(**body):
        res = post(url, "/v1/embed", {"model": "minilm", "inputs": text, **body})
        assert res.status_code == 200 and res.json()["usage"]["prompt_tokens"] == 256, res.text
        return np.array(res.json()["embeddings"][0])

    def of_ids(kept):  # the same model on exactly these ids
        res = post(url, "/v1/embeddings", {"model": "minilm", "input": [kept]}).json()
        return np.array(res["data"][0]["embedding"])

    left, right = embed(truncation_direction="left"), embed()
    assert np.abs(left - of_ids(ids[-254:])).max() < 1e-5  # 254 + [CLS] and [SEP]
    assert np.abs(right - of_ids(ids[:254])).max() < 1e-5
    assert np.abs(left - right).max() > 1e-2
    assert np.array_equal(embed(truncation_direction="Left"), left)  # TEI's spelling
    # and on the other routes that truncate, with the same field
    for route, body in (("/v1/classify", {"model": "bert-classify-onnx"}),
                        ("/v1/ner", {"model": "bert-ner-onnx"}),
                        ("/v1/rerank", {"model": "minilm", "query": "cat"})):
        key = "documents" if route == "/v1/rerank" else "inputs"
        res = post(url, route, {**body, key: [text], "truncation_direction": "left"})
        assert res.status_code == 200, (route, res.text)
    bad = post(url, "/v1/embed", {"model": "minilm", "inputs": "x",
                                  "truncation_direction": "middle"})
    assert bad.status_code == 422 and "truncation_direction" in bad.text


def test_metrics_count_requests_by_route_and_status(url):
    post(url, "/v1/embed", {"model": "nope", "inputs": "x"})
    text = web.get(url + "/metrics").text
    assert 'distilserve_requests_total{route="/v1/embed",status="404"}' in text
    assert "distilserve_request_seconds_bucket" in text
    assert 'distilserve_queue_depth{model="minilm"}' in text


def test_tiny_queue_burst_gets_429_never_500_then_recovers(minilm_alone):
    with running_server(minilm_alone, max_queue=2, api_key="sekret") as u:
        auth = {"Authorization": "Bearer sekret"}

        async def burst():
            async with httpx.AsyncClient(timeout=60, headers=auth) as client:
                return await asyncio.gather(*(client.post(u + "/v1/embed", json={
                    "inputs": ["some text to embed"] * 2}) for _ in range(40)))

        codes = [r.status_code for r in asyncio.run(burst())]
        assert 429 in codes and 200 in codes and 500 not in codes
        limited = next(r for r in asyncio.run(burst()) if r.status_code == 429)
        assert limited.headers["retry-after"] and limited.json()["error"]["type"] == "overloaded"
        # more inputs at once than the queue ever holds: no retry would help, so 413
        res = web.post(u + "/v1/embed", json={"inputs": ["a", "b", "c"]}, headers=auth)
        assert res.status_code == 413 and "DISTILSERVE_MAX_QUEUE" in res.text, res.text
        assert web.post(u + "/v1/embed", json={"inputs": "again"}, headers=auth).status_code == 200
        # the API key
        assert web.post(u + "/v1/embed", json={"inputs": "x"}).status_code == 401
        wrong = web.post(u + "/v1/embed", json={"inputs": "x"},
                           headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
        assert len(wrong.headers["x-request-id"]) == 32  # every answer: refused ones too
        assert web.get(u + "/v1/models").status_code == 401
        assert web.get(u + "/v1/models/minilm").status_code == 401
        text = web.get(u + "/metrics", headers=auth).text  # counted by route all the same
        assert 'distilserve_requests_total{route="/v1/embed",status="401"} 2.0' in text
        assert 'distilserve_requests_total{route="/v1/models/{model_id}",status="401"}' in text
        for probe in ("/health", "/ready", "/ping", "/", "/v2/health/live", "/v2/health/ready"):
            assert web.get(u + probe).status_code == 200, probe
            head = web.head(u + probe)  # as load balancers' health checks ask
            assert (head.status_code, head.content) == (200, b""), probe
        assert web.post(u + "/", json={"inputs": "x"}).status_code == 401  # runs a model
        for method, path in (("TRACE", "/health"), ("TRACE", "/v1/embed"), ("PUT", "/v1/embed"),
                             ("DELETE", "/v1/models")):  # served nowhere: 405, keyed or not
            refused = web.request(method, u + path)
            assert refused.status_code == 405 and "allow" in refused.headers, (method, path)
        # the docs and the OpenAPI document too: all but the probes
        for page in ("/docs", "/redoc", "/openapi.json", "/metrics"):
            assert web.get(u + page).status_code == 401, page
            assert web.get(u + page, headers=auth).status_code == 200, page
        schema = web.get(u + "/openapi.json", headers=auth).json()
        assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
        public = {(method, path) for path, ops in schema["paths"].items()
                  for method, op in ops.items() if "security" not in op}
        assert public == {(m, p) for m in ("get", "head") for p in (
            "/health", "/ready", "/ping", "/", "/v2/health/live", "/v2/health/ready")}


def test_cors_lets_the_origins_named_call_from_a_browser(minilm_alone, url):
    page, other = "https://app.example", "https://elsewhere.example"
    with running_server(minilm_alone, api_key="sekret", cors_allow_origins=f" {page}, ") as u:
        # the browser's preflight carries no API key: answered before the key is asked for
        preflight = {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        res = web.options(u + "/v1/embed", headers={"Origin": page, **preflight})
        assert res.status_code == 200 and res.headers["access-control-allow-origin"] == page
        assert web.options(u + "/v1/embed", headers={"Origin": other, **preflight}
                             ).status_code == 400
        res = web.post(u + "/embed", json={"inputs": "x"}, headers={
            "Origin": page, "Authorization": "Bearer sekret"})
        assert res.status_code == 200 and res.headers["access-control-allow-origin"] == page
        # the page's script may read every timing header the answer has
        exposed = set(res.headers["access-control-expose-headers"].lower().split(", "))
        assert {h for h in res.headers if h.startswith("x-") or h == "server-timing"} <= exposed
        assert "retry-after" in exposed
        unauthorized = web.post(u + "/v1/embed", json={"inputs": "x"}, headers={"Origin": page})
        assert unauthorized.status_code == 401  # readable by the page, so it can say why
        assert unauthorized.headers["access-control-allow-origin"] == page
        res = web.post(u + "/v1/embed", json={"inputs": "x"}, headers={
            "Origin": other, "Authorization": "Bearer sekret"})
        assert "access-control-allow-origin" not in res.headers
    # by default no origin may
    res = web.post(url + "/v1/embed", json={"model": "minilm", "inputs": "x"},
                     headers={"Origin": page})
    assert res.status_code == 200 and "access-control-allow-origin" not in res.headers


def test_inputs_of_a_client_that_went_away_are_not_run(minilm_alone):
    with running_server(minilm_alone, max_batch_size=1) as u:
        before = _forward_passes(u, "minilm")

        async def scenario():
            async with httpx.AsyncClient(timeout=120) as client:
                # 48 forward passes of 256 tokens, one request each (a batch starts from
                # the request with the fewest inputs started: of those, the oldest)
                busy = asyncio.gather(*(client.post(u + "/v1/embed", json={
                    "inputs": "word " * 300}) for _ in range(48)))
                while await asyncio.to_thread(_metric, u, "distilserve_queue_depth",
                                              model="minilm") < 12:
                    assert not busy.done(), "the requests ran before a dozen were queued"
                    await asyncio.sleep(0.01)  # until they are queued, however slow this is
                for _ in range(6):  # queued behind a dozen of them, then gone
                    with pytest.raises(httpx.TimeoutException):
                        await client.post(u + "/v1/embed", json={"inputs": ["a", "b"]},
                                          timeout=0.02)
                return await busy

        assert {r.status_code for r in asyncio.run(scenario())} == {200}
        time.sleep(0.3)  # let the queue settle
        assert _forward_passes(u, "minilm") - before == 48
        assert web.post(u + "/v1/embed", json={"inputs": "still serving"}).status_code == 200


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_everything_from_the_service_itself(url, page):
    """No CDN: every script, stylesheet and icon the page references is served here."""
    html = web.get(url + page).text
    assets = re.findall(r'(?:src|href)\s*[:=]\s*["\']([^"\']+)["\']', html)
    assert any(a.endswith(".js") for a in assets), assets
    for asset in assets:
        assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
        response = web.get(url + asset)
        assert response.status_code == 200 and response.content, asset


def test_rerank_by_an_embedding_model_ranks_by_cosine(url):
    query = "How do cats show that they are happy?"
    docs = ["The stock market fell sharply on Monday.", "A content cat purrs and kneads.",
            "Rain is expected tomorrow.", "Cats purr when they are happy."]
    res = post(url, "/v1/rerank", {"model": "minilm", "query": query, "documents": docs,
                                   "return_documents": True}).json()
    ranked = [r["index"] for r in res["results"]]
    assert set(ranked[:2]) == {1, 3} and sorted(ranked) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in res["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(r["document"]["text"] == docs[r["index"]] for r in res["results"])
    emb = np.array(post(url, "/v1/embed", {"model": "minilm", "inputs": [query, *docs]})
                   .json()["embeddings"])
    cosines = emb[1:] @ emb[0]
    assert np.allclose([cosines[i] for i in ranked], scores, atol=1e-5)
    assert res["usage"]["total_tokens"] > len(docs)
    top = post(url, "/v1/rerank", {"model": "minilm", "query": query, "documents": docs,
                                   "top_n": 2}).json()["results"]
    assert [r["index"] for r in top] == ranked[:2] and "document" not in top[0]
    every = post(url, "/v1/rerank", {"model": "minilm", "query": query, "documents": docs,
                                     "top_n": 0}).json()["results"]  # vLLM's "all"
    assert [r["index"] for r in every] == ranked
    # documents as {"text": ...} objects, Jina's and Cohere's other form: the same ranking
    objects = post(url, "/v1/rerank", {"model": "minilm", "query": query, "documents": [
        {"text": d, "title": "ignored"} for d in docs]}).json()["results"]
    assert [(r["index"], r["relevance_score"]) for r in objects] == [
        (r["index"], r["relevance_score"]) for r in res["results"]]


def test_vllms_score_is_reranks_score_pair_by_pair(url):
    query, docs = "which is relevant?", ["the first document", "another one"]
    ranked = {r["index"]: r["relevance_score"] for r in post(url, "/v1/rerank", {
        "model": "cross", "query": query, "documents": docs}).json()["results"]}
    for route, names in (("/score", ("text_1", "text_2")), ("/v1/score", ("data_1", "data_2")),
                         ("/score", ("queries", "documents")), ("/score", ("queries", "items"))):
        res = post(url, route, {"model": "cross", names[0]: query, names[1]: docs})
        assert res.status_code == 200, res.text
        answer = res.json()
        assert (answer["object"], answer["model"], answer["id"][:6]) == ("list", "cross", "score-")
        assert [(d["index"], d["object"]) for d in answer["data"]] == [(0, "score"), (1, "score")]
        assert [d["score"] for d in answer["data"]] == pytest.approx([ranked[0], ranked[1]],
                                                                    abs=1e-6)
        assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    # N:N, each query with its document; a query's logit with use_activation false
    each = post(url, "/score", {"model": "cross", "text_1": [query, "a query"],
                                "text_2": docs}).json()["data"]
    single = post(url, "/score", {"model": "cross", "text_1": "a query",
                                  "text_2": docs[1]}).json()["data"]
    assert each[0]["score"] == pytest.approx(ranked[0], abs=1e-6)
    assert each[1]["score"] == pytest.approx(single[0]["score"], abs=1e-6)
    logit = post(url, "/score", {"model": "cross", "text_1": query, "text_2": docs[0],
                                 "use_activation": False}).json()["data"][0]["score"]
    assert 1 / (1 + np.exp(-logit)) == pytest.approx(ranked[0], abs=1e-6)
    # an embedding model: each pair's cosine
    vectors = np.array(post(url, "/v1/embed", {"model": "minilm", "inputs": [
        query, "a query", *docs]}).json()["embeddings"])
    cosines = post(url, "/score", {"model": "minilm", "queries": [query, "a query"],
                                   "documents": docs}).json()["data"]
    assert [d["score"] for d in cosines] == pytest.approx(
        [vectors[0] @ vectors[2], vectors[1] @ vectors[3]], abs=1e-5)
    refused = post(url, "/score", {"model": "cross", "text_1": ["a", "b"],
                                   "text_2": ["c", "d", "e"]})
    assert refused.status_code == 422 and "2 texts in data_1 and 3 in data_2: send one in " \
        "data_1, or one for each of data_2" in refused.json()["error"]["message"], refused.text


def test_truncate_prompt_tokens_cuts_a_pair_as_the_tokenizer_does(url, repository):
    """vLLM's truncate_prompt_tokens on /score and the rerank routes: a cross-encoder's
    pair cut to N tokens in all as transformers' tokenizer cuts it (longest_first), an
    embedding model's texts each to N."""
    tok = AutoTokenizer.from_pretrained(repository / "cross" / "checkpoint")
    query = "which of these documents is relevant to the question asked?"
    doc = "the first document is the most relevant one of them all, by far"

    def cut(text, n):  # its first n tokens' characters
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return text[:offsets["offset_mapping"][n - 1][1]]

    def ending(text, n):  # its last n tokens' characters (each word here is one token)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return text[offsets["offset_mapping"][-n][0]:]

    def scored(route, model, q, d, **cap):
        body = ({"text_1": q, "text_2": d} if route == "/score" else {"query": q,
                                                                      "documents": [d]})
        answer = post(url, route, {"model": model, **body, **cap})
        assert answer.status_code == 200, answer.text
        answer = answer.json()
        key = "data" if route == "/score" else "results"
        return answer[key][0]["score" if route == "/score" else "relevance_score"], \
            answer["usage"]["prompt_tokens"]

    cut_scores = []
    for k in (9, 14):
        sequences = tok(query, doc, truncation=True, max_length=k).sequence_ids()
        kept = sequences.count(0), sequences.count(1)
        for route in ("/score", "/rerank", "/v1/rerank"):
            score, tokens = scored(route, "cross", query, doc, truncate_prompt_tokens=k)
            expected, _ = scored(route, "cross", cut(query, kept[0]), cut(doc, kept[1]))
            assert score == pytest.approx(expected, abs=1e-6) and tokens == k
            # another split of the same k tokens scores otherwise: the split is the cut's
            other, _ = scored(route, "cross", cut(query, kept[0] - 1), cut(doc, kept[1] + 1))
            assert other != pytest.approx(score, abs=1e-6)
            cut_scores.append(score)
        tok.truncation_side = "left"
        sequences = tok(query, doc, truncation=True, max_length=k).sequence_ids()
        tok.truncation_side = "right"
        kept = sequences.count(0), sequences.count(1)
        score, _ = scored("/score", "cross", query, doc, truncate_prompt_tokens=k,
                          truncation_side="left")
        expected, _ = scored("/score", "cross", ending(query, kept[0]), ending(doc, kept[1]))
        assert score == pytest.approx(expected, abs=1e-6)
    # vLLM's max_tokens_per_query and max_tokens_per_doc, 0: not cut
    for route in ("/score", "/rerank"):
        capped, _ = scored(route, "cross", query, doc, max_tokens_per_query=3,
                           max_tokens_per_doc=5)
        assert capped == pytest.approx(scored(route, "cross", cut(query, 3), cut(doc, 5))[0],
                                       abs=1e-6)
        assert scored(route, "cross", query, doc, max_tokens_per_query=0,
                      max_tokens_per_doc=0) == scored(route, "cross", query, doc)
    whole = scored("/score", "cross", query, doc)
    assert all(score != pytest.approx(whole[0], abs=1e-6) for score in cut_scores)
    assert scored("/score", "cross", query, doc, truncate_prompt_tokens=-1) == whole
    assert scored("/score", "cross", query, doc, truncate_prompt_tokens=10**6) == whole
    # an embedding model: each text cut to what leaves it N tokens with [CLS] and [SEP]
    score, _ = scored("/score", "minilm", query, doc, truncate_prompt_tokens=6)
    assert score == pytest.approx(scored("/score", "minilm", cut(query, 4), cut(doc, 4))[0],
                                  abs=1e-5)
    refused = post(url, "/score", {"model": "cross", "text_1": query, "text_2": doc,
                                   "truncate_prompt_tokens": 4})
    assert refused.status_code == 422 and refused.json()["error"]["message"] == (
        "truncate_prompt_tokens 4 leaves a pair no token of each text: model 'cross' reads "
        "3 special tokens with each pair"), refused.text


def test_max_tokens_per_doc_cuts_each_document_before_it_is_scored(url):
    query, doc = "which is relevant?", "the first document is the most relevant one"
    cut = post(url, "/v1/tokenize", {"model": "cross", "inputs": doc,
                                     "add_special_tokens": False}).json()[0][2]["stop"]
    whole = post(url, "/v1/rerank", {"model": "cross", "query": query, "documents": [doc]})
    for route in ("/v1/rerank", "/rerank", "/v2/rerank"):
        capped = post(url, route, {"model": "cross", "query": query, "documents": [doc],
                                   "max_tokens_per_doc": 3, "return_documents": True}).json()
        short = post(url, "/v1/rerank", {"model": "cross", "query": query,
                                         "documents": [doc[:cut]]}).json()
        assert capped["results"][0]["relevance_score"] == pytest.approx(
            short["results"][0]["relevance_score"], abs=1e-6)
        assert capped["usage"] == short["usage"] != whole.json()["usage"]
        if route == "/v1/rerank":  # the document as sent
            assert capped["results"][0]["document"]["text"] == doc


def test_a_rerank_request_is_batched_like_any_other(url):
    before = _forward_passes(url, "minilm")
    docs = [f"document number {i} about a topic" for i in range(40)]
    res = post(url, "/v1/rerank", {"model": "minilm", "query": "topic", "documents": docs})
    assert res.status_code == 200 and len(res.json()["results"]) == 40
    assert _forward_passes(url, "minilm") - before == 2  # 41 texts, batches of at most 32


def test_rerank_by_a_cross_encoder_scores_each_pair(url):
    query, docs = "which is relevant?", ["the first document", "another one", "a third"]
    res = post(url, "/v1/rerank", {"model": "cross", "query": query, "documents": docs})
    assert res.status_code == 200, res.text
    pairs = post(url, "/v1/classify", {"model": "cross",
                                       "inputs": [[query, d] for d in docs]}).json()
    expected = {i: r[0]["score"] for i, r in enumerate(pairs["results"])}  # sigmoid
    for r in res.json()["results"]:
        assert abs(r["relevance_score"] - expected[r["index"]]) < 1e-6
    # raw_scores: the logit, in the same order
    raw = post(url, "/v1/rerank", {"model": "cross", "query": query, "documents": docs,
                                   "raw_scores": True}).json()["results"]
    assert [r["index"] for r in raw] == [r["index"] for r in res.json()["results"]]
    for r in raw:
        assert abs(1 / (1 + np.exp(-r["relevance_score"])) - expected[r["index"]]) < 1e-6
    # unnamed: the one cross-encoder (its manifest names the relevant label), not one of
    # the many embedding models
    unnamed = post(url, "/v1/rerank", {"query": query, "documents": docs}).json()
    assert unnamed["model"] == "cross"
    # two labels and none named: the second (positive) is relevance, its softmax
    two = name("bert", "classify", "onnx")
    ranked = post(url, "/v1/rerank", {"model": two, "query": query, "documents": docs}).json()

    def logits(document):  # the pair's, in the labels' order
        row = post(url, "/v1/classify", {"model": two, "inputs": [[query, document]],
                                         "function_to_apply": "none"}).json()["results"][0]
        return [next(r["score"] for r in row if r["label"] == label)
                for label in ("negative", "positive")]

    z = np.array([logits(d) for d in docs])
    softmax = np.exp(z[:, 1]) / np.exp(z).sum(axis=1)
    assert [r["index"] for r in ranked["results"]] == list(np.argsort(-softmax, kind="stable"))
    for r in ranked["results"]:
        assert abs(r["relevance_score"] - softmax[r["index"]]) < 1e-5
    # three labels and none named: no relevance to score
    refused = post(url, "/v1/rerank", {"model": "multilabel", "query": query,
                                       "documents": docs})
    assert refused.status_code == 400 and "none is named relevant" in refused.text


@pytest.mark.parametrize("route,body,words", [
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": ["a", LONG]},
     "document 1 has 602 tokens"),
    ("/v1/rerank", {"model": "minilm", "query": LONG, "documents": ["a"]}, "the query has"),
    ("/v1/rerank", {"model": "cross", "query": "q", "documents": ["a", LONG]},
     "document 1 (with the query) has"),
    ("/rerank", {"model": "minilm", "query": "q", "texts": [LONG]}, "document 0 has"),
    ("/similarity", {"model": "minilm", "inputs": {"source_sentence": "a", "sentences": [
        "b", LONG]}, "parameters": {"truncate": False}}, "sentence 1 has"),
    ("/v1/embed", {"model": "minilm", "inputs": ["a", LONG]}, "input 1 has"),
])
def test_an_input_too_long_is_named_as_the_client_sent_it(url, route, body, words):
    """A rerank's query and documents, and /similarity's sentences, are queued as one list
    of texts: the error named a text by its place there (document 1 was "input 2")."""
    if "parameters" not in body:
        body = {**body, "truncate": False}
    res = post(url, route, body)
    assert res.status_code == 413, res.text
    assert res.json()["error"]["message"].startswith(words)


def test_an_input_over_the_character_limit_is_named_as_the_client_sent_it(url):
    res = post(url, "/v1/rerank", {"model": "minilm", "query": "q",
                                   "documents": ["a", "b" * 3000]})
    assert res.status_code == 413
    assert res.json()["error"]["message"].startswith("document 1 has 3000 characters")


def test_tokenize_equals_the_hugging_face_tokenizer(url):
    tok = AutoTokenizer.from_pretrained(checkpoint.minilm_path())
    res = post(url, "/v1/tokenize", {"model": "minilm", "inputs": TRICKY})
    assert res.status_code == 200, res.text
    for text, tokens in zip(TRICKY, res.json()):
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert [t["id"] for t in tokens] == enc["input_ids"]
        assert [t["special"] for t in tokens] == [bool(x) for x in enc["special_tokens_mask"]]
        for t, (start, stop) in zip(tokens, enc["offset_mapping"]):
            if t["special"]:
                assert t["start"] is None and t["text"] in tok.all_special_tokens
            else:
                assert (t["start"], t["stop"]) == (start, stop)
                assert t["text"] == text[start:stop]
    bare = post(url, "/v1/tokenize", {"model": "minilm", "inputs": "Hello world",
                                      "add_special_tokens": False}).json()[0]
    assert [t["id"] for t in bare] == tok("Hello world", add_special_tokens=False)["input_ids"]
    # unnamed: any model, since every model served here has the same tokenizer
    unnamed = post(url, "/v1/tokenize", {"inputs": TRICKY}).json()
    assert unnamed == res.json()


def test_dimensions_are_the_first_components_renormalised(url):
    texts = ["A man is playing a guitar.", "Ein Mann spielt Gitarre."]
    raw = np.array(post(url, "/v1/embed", {"model": "minilm", "inputs": texts,
                                           "normalize": False}).json()["embeddings"])
    expected = raw[:, :128] / np.linalg.norm(raw[:, :128], axis=1, keepdims=True)
    oa = post(url, "/v1/embeddings", {"model": "minilm", "input": texts, "dimensions": 128})
    got = np.array([d["embedding"] for d in oa.json()["data"]])
    assert got.shape == (2, 128) and np.allclose(got, expected, atol=1e-5)
    native = post(url, "/v1/embed", {"model": "minilm", "inputs": texts, "dimensions": 128})
    assert np.allclose(native.json()["embeddings"], expected, atol=1e-5)
    cut = post(url, "/v1/embed", {"model": "minilm", "inputs": texts, "dimensions": 128,
                                  "normalize": False})  # was a 500: a strided array
    assert np.allclose(cut.json()["embeddings"], raw[:, :128], atol=1e-6)
    listed = {m["id"]: m for m in web.get(url + "/v1/models").json()["data"]}
    assert listed["minilm"]["dimensions"] == 384


def test_token_ids_embed_as_their_text_does(url):
    tok = AutoTokenizer.from_pretrained(checkpoint.minilm_path())
    texts = ["The cat sat on the mat.", TRICKY[0]]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    by_text = post(url, "/v1/embeddings", {"model": "minilm", "input": texts}).json()
    by_ids = post(url, "/v1/embeddings", {"model": "minilm", "input": ids}).json()
    one = post(url, "/v1/embeddings", {"model": "minilm", "input": ids[0]}).json()
    a = np.array([d["embedding"] for d in by_text["data"]])
    b = np.array([d["embedding"] for d in by_ids["data"]])
    assert np.abs(a - b).max() < 1e-5 and len(one["data"]) == 1
    assert np.abs(np.array(one["data"][0]["embedding"]) - a[0]).max() < 1e-5
    assert by_ids["usage"] == by_text["usage"]


def test_one_model_by_id(url):
    listed = {m["id"]: m for m in web.get(url + "/v1/models").json()["data"]}
    assert web.get(url + "/v1/models/minilm").json() == listed["minilm"]
    missing = web.get(url + "/v1/models/nope")
    assert missing.status_code == 404 and "unknown model 'nope'" in missing.json()["error"]["message"]


def test_prompts_and_cls_pooling_as_sentence_transformers_apply_them(url, repository):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(repository.parent / "bge-checkpoint"), device="cpu")
    texts = ["The cat sat on the mat.", "Where is the Eiffel Tower?"]

    def embed(**body):
        res = post(url, "/v1/embed", {"model": "bge", "inputs": texts, **body})
        assert res.status_code == 200, res.text
        return np.array(res.json()["embeddings"])

    # no prompt_name: the default prompt, as sentence-transformers' encode
    assert np.abs(embed() - reference.encode(texts)).max() < 1e-5
    assert np.abs(embed(prompt_name="query")
                  - reference.encode(texts, prompt_name="query")).max() < 1e-5
    # TEI's token ids, a whole input each: read back into text behind the prompt, as TEI
    ids = [[t["id"] for t in tokens] for tokens in post(url, "/tokenize", {
        "model": "bge", "inputs": texts}).json()]
    for body, prompt_name in (({}, None), ({"prompt_name": "query"}, "query")):
        tei = post(url, "/embed", {"model": "bge", "inputs": ids, **body})
        assert tei.status_code == 200, tei.text
        assert np.abs(np.array(tei.json()) - reference.encode(
            texts, prompt_name=prompt_name)).max() < 1e-5
    openai_style = post(url, "/v1/embeddings", {"model": "bge", "input": texts}).json()
    assert np.abs(np.array([d["embedding"] for d in openai_style["data"]])
                  - reference.encode(texts)).max() < 1e-5
    # rerank: the query and the documents prompted as encode_query and encode_document
    documents = ["The Eiffel Tower is in Paris.", "Cats like mats.", "Bananas are yellow."]
    ranked = post(url, "/v1/rerank", {"model": "bge", "query": texts[1],
                                      "documents": documents}).json()["results"]
    q, d = reference.encode_query([texts[1]]), reference.encode_document(documents)
    expected = (d @ q[0]).tolist()
    for result in ranked:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-5
    listed = web.get(url + "/v1/models/bge").json()
    assert (listed["pooling"], listed["prompts"], listed["default_prompt_name"]) == (
        "cls", BGE_PROMPTS, "passage")
    # /tokenize: a prompt only where named (TEI's prompt_name), its characters counted
    plain, prompted = (post(url, "/tokenize", {"model": "bge", "inputs": texts[0], **body}
                            ).json()[0] for body in ({}, {"prompt_name": "query"}))
    assert [t["id"] for t in plain] == reference.tokenizer(texts[0])["input_ids"]
    assert [t["id"] for t in prompted] == reference.tokenizer(
        BGE_PROMPTS["query"] + texts[0])["input_ids"]
    assert prompted[-2]["stop"] == len(BGE_PROMPTS["query"] + texts[0])
    # the limits are on what the client sent: the prompt's characters and the rerank
    # query do not count (max_input_chars 2000, max_inputs 64 here)
    assert post(url, "/v1/embed", {"model": "bge", "inputs": "x" * 2000}).status_code == 200
    full = post(url, "/v1/rerank", {"model": "bge", "query": "q", "documents": ["d"] * 64})
    assert full.status_code == 200 and len(full.json()["results"]) == 64, full.text
    # a prompt the model has not is a 422 that names those it has
    for model, words in (("bge", "has the prompts query, passage"), ("minilm", "has no prompts")):
        res = post(url, "/v1/embed", {"model": model, "inputs": "x", "prompt_name": "nope"})
        assert res.status_code == 422 and words in res.json()["error"]["message"], res.text
