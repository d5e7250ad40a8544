"""End to end: zero-shot classification (an NLI model scoring candidate labels) at
/v1/classify equals transformers' zero-shot-classification pipeline; huggingface_hub's
zero_shot_classification and token_classification work against the service's root."""

from __future__ import annotations

import json

import huggingface_hub
import huggingface_hub.constants
import huggingface_hub.errors
import huggingface_hub.utils
import numpy as np
import pytest
from transformers import pipeline

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server

TEXTS = ["The new phone's battery lasts two days.", "Parliament passed the budget today."]
LABELS = ["technology", "politics", "sports"]
# label orders of published NLI models: typeform/distilbert-base-uncased-mnli's, and the
# cross-encoder/nli-* models' (where transformers takes contradiction to be the first)
ORDERS = {"nli": ["entailment", "neutral", "contradiction"],
          "nli-cross": ["contradiction", "entailment", "neutral"]}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("nli")
    return {name: str(checkpoint.save(checkpoint.new("bert", "tiny", "classify", labels,
                                                     seed=i + 3), root / name))
            for i, (name, labels) in enumerate(ORDERS.items())}


@pytest.fixture(scope="module")
def url(exports, checkpoints, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("zero-shot")
    for name, folder in checkpoints.items():
        exports(folder, repo / name, "onnx", check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "sentiment", "onnx", check=False)
    with running_server(repo, max_inputs=8) as url:
        yield url


def classify(url, **body):
    # (JSON with escapes: a lone surrogate is sent as one)
    return web.post(url + "/v1/classify", content=json.dumps(body), timeout=60,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("model", list(ORDERS))
@pytest.mark.parametrize("options", [
    {}, {"multi_label": True}, {"hypothesis_template": "This text is about {}."}])
def test_zero_shot_equals_the_transformers_pipeline(url, checkpoints, model, options):
    pipe = pipeline("zero-shot-classification", model=checkpoints[model], device="cpu")
    res = classify(url, model=model, inputs=TEXTS, candidate_labels=LABELS, **options)
    assert res.status_code == 200, res.text
    for ours, theirs in zip(res.json()["results"], pipe(TEXTS, LABELS, **options)):
        assert [r["label"] for r in ours] == theirs["labels"]
        np.testing.assert_allclose([r["score"] for r in ours], theirs["scores"], atol=1e-5)
    # one label is scored on its own (entailment against contradiction), as there
    (one,) = classify(url, model=model, inputs=TEXTS[0],
                      candidate_labels=["technology"]).json()["results"]
    assert one[0]["score"] == pytest.approx(pipe(TEXTS[0], ["technology"])["scores"][0],
                                            abs=1e-5)


def test_the_models_list_says_which_classify_zero_shot(url):
    models = {m["id"]: m for m in web.get(url + "/v1/models").json()["data"]}
    assert models["nli"]["zero_shot"] and models["nli-cross"]["zero_shot"]
    assert "zero_shot" not in models["sentiment"]


def test_zero_shot_top_k_and_raw_scores(url, checkpoints):
    full = classify(url, model="nli", inputs=TEXTS[0], candidate_labels=LABELS).json()
    best = classify(url, model="nli", inputs=TEXTS[0], candidate_labels=LABELS, top_k=1).json()
    assert best["results"][0] == full["results"][0][:1]
    raw = classify(url, model="nli", inputs=TEXTS[0], candidate_labels=LABELS,
                   raw_scores=True).json()["results"][0]
    # the entailment logits: their softmax is the scores
    logits = {r["label"]: r["score"] for r in raw}
    e = np.exp([logits[label] for label in LABELS])
    np.testing.assert_allclose(sorted(e / e.sum(), reverse=True),
                               [r["score"] for r in full["results"][0]], atol=1e-5)


@pytest.mark.parametrize("body, status, message", [
    ({"model": "sentiment"}, 400, "model 'sentiment' has the labels negative, positive and "
     "none is entailment"),
    ({}, 400, "several models classify zero-shot (nli, nli-cross)"),
    ({"model": "nli", "inputs": [["a", "b"]]}, 422, "takes texts, not pairs"),
    ({"model": "nli", "hypothesis_template": "This is it."}, 422,
     "hypothesis_template: it holds no {}"),
    ({"model": "nli", "candidate_labels": []}, 422, "candidate_labels"),
    ({"model": "nli", "candidate_labels": ["\ud800"]}, 422, "candidate_labels: label 0 is "
     "not valid Unicode"),
    ({"model": "nli", "inputs": TEXTS + ["third"]}, 413, "9 (text, candidate label) pairs; "
     "at most 8"),
    # each text is queued with each label: this was "input 3", the fourth pair
    ({"model": "nli", "inputs": ["short", "a " * 200], "truncate": False}, 413,
     f"input 1 with candidate label {LABELS[0]!r} has 208 tokens"),
])
def test_zero_shot_errors(url, body, status, message):
    res = classify(url, **{"inputs": TEXTS[0], "candidate_labels": LABELS, **body})
    assert res.status_code == status, res.text
    assert message in res.json()["error"]["message"]


def test_the_root_answers_the_hugging_face_inference_apis_zero_shot_body(url, checkpoints):
    """As the Inference API answers it: per text, its sequence and the labels with their
    scores, best first (a dict for a text, a list for a list); the model named, or the
    one NLI model."""
    body = {"inputs": TEXTS[0], "parameters": {"candidate_labels": LABELS,
                                               "multi_label": False}}
    res = web.post(url + "/", json={"model": "nli-cross", **body}, timeout=60)
    assert res.status_code == 200, res.text
    theirs = pipeline("zero-shot-classification", model=checkpoints["nli-cross"],
                      device="cpu")(TEXTS[0], LABELS)
    assert res.json()["sequence"] == TEXTS[0] and res.json()["labels"] == theirs["labels"]
    np.testing.assert_allclose(res.json()["scores"], theirs["scores"], atol=1e-5)
    batch = web.post(url + "/", json={"model": "nli-cross", **body, "inputs": TEXTS})
    assert [a["sequence"] for a in batch.json()] == TEXTS and batch.json()[0] == res.json()
    unnamed = web.post(url + "/", json=body)  # two NLI models: name one
    assert unnamed.status_code == 400 and "several models" in unnamed.text
    bad = web.post(url + "/", json={"model": "nli", "inputs": "x", "parameters": {
        "candidate_labels": LABELS, "hypothesis_template": "no slot"}})
    assert bad.status_code == 422 and "parameters: hypothesis_template" in bad.text


def test_huggingface_hubs_zero_shot_and_token_classification(exports, checkpoints, tiny_checkpoints,
                                                             tmp_path, monkeypatch):
    """Each against a service of that one model, as huggingface_hub's InferenceClient
    posts to the URL it is given."""
    exports(checkpoints["nli"], tmp_path / "zero" / "nli", "onnx", check=False)
    exports(tiny_checkpoints["bert", "ner"], tmp_path / "ner" / "tagger", "onnx", check=False)
    text = "Angela Merkel visited Paris with Volkswagen."
    with running_server(tmp_path / "zero") as zero, running_server(tmp_path / "ner") as ner:
        expected = classify(zero, inputs=text, candidate_labels=LABELS,
                            multi_label=True).json()["results"][0]
        entities = web.post(ner + "/v1/ner", json={
            "inputs": text, "aggregation_strategy": "first"}).json()["results"][0]
        # the suite sets HF_HUB_OFFLINE (nothing downloads), under which huggingface_hub's
        # sessions refuse every request, these to loopback too
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        huggingface_hub.utils.reset_sessions()
        try:
            got = huggingface_hub.InferenceClient(model=zero).zero_shot_classification(
                text, LABELS, multi_label=True)
            tokens = huggingface_hub.InferenceClient(model=ner).token_classification(
                text, aggregation_strategy="first")
            ignored = huggingface_hub.InferenceClient(model=ner).token_classification(
                text, aggregation_strategy="first",
                ignore_labels=[entities[0]["entity_group"]])
        finally:
            monkeypatch.undo()
            huggingface_hub.utils.reset_sessions()
    assert [(g.label, g.score) for g in got] == [
        (r["label"], pytest.approx(r["score"], abs=1e-6)) for r in expected]
    assert [(t.entity_group, t.start, t.end, t.word) for t in tokens] == [
        (e["entity_group"], e["start"], e["end"], e["word"]) for e in entities]
    assert entities and all(t.entity_group != entities[0]["entity_group"] for t in ignored)
