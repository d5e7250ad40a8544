"""End to end: every combination of a route's options is answered (200), for each kind of
model that route serves: the options are each tested elsewhere, but a 500 hid in one
pair of them (/v1/embed with dimensions and normalize false: a strided array that the
JSON writer refused)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from distilserve.models.io import checkpoint
from tests.conftest import running_server

TEXTS = ["The cat sat on the mat.", "Dogs bark at night in the town of Springfield."]
# route -> (the body, each option's values: every combination is sent)
ROUTES = {
    "/v1/embeddings": ({"input": TEXTS}, {
        "model": ["pooled", "tokens", "splade"], "encoding_format": ["float", "base64"],
        "dimensions": [None, 8, 32]}),
    "/v1/embed": ({"inputs": TEXTS}, {
        "model": ["pooled", "tokens", "splade"], "normalize": [True, False], "dimensions": [None, 8],
        "truncate": [True, False], "truncation_direction": ["right", "Left"]}),
    "/embed": ({"inputs": TEXTS[0]}, {
        "model": ["pooled", "tokens", "splade"], "normalize": [True, False], "dimensions": [None, 8]}),
    "/embed_all": ({"inputs": TEXTS}, {
        "truncate": [True, False], "truncation_direction": ["right", "left"]}),
    "/embed_sparse": ({"inputs": TEXTS}, {
        "truncate": [True, False], "truncation_direction": ["right", "left"]}),
    "/similarity": ({"inputs": {"source_sentence": "a cat", "sentences": TEXTS}}, {
        "model": ["pooled", "tokens", "splade"]}),
    "/v1/rerank": ({"query": "a cat", "documents": TEXTS}, {
        "model": ["pooled", "tokens", "splade", "cross"], "top_n": [None, 1],
        "return_documents": [True, False], "raw_scores": [True, False]}),
    "/rerank": ({"query": "a cat", "texts": TEXTS}, {
        "model": ["pooled", "tokens", "splade", "cross"], "return_text": [True, False],
        "raw_scores": [True, False]}),
    "/v1/classify": ({"inputs": [TEXTS, TEXTS[0]]}, {  # a pair and a text
        "model": ["sentiment", "cross"], "top_k": [None, 1], "raw_scores": [True, False],
        "truncation_direction": ["right", "left"]}),
    "/predict": ({"inputs": [TEXTS]}, {"model": ["sentiment", "cross"],
                                       "raw_scores": [True, False]}),
    "/classify": ({"input": TEXTS}, {"raw_scores": [True, False]}),
    "/v1/ner": ({"inputs": TEXTS}, {
        "aggregation_strategy": ["none", "simple", "first", "average", "max"],
        "truncation_direction": ["right", "left"], "ignore_labels": [None, [], ["PER"]]}),
    "/v1/ner strided": ({"inputs": TEXTS}, {  # (aggregation "none" is refused a stride)
        "aggregation_strategy": ["simple", "first", "average", "max"], "stride": [0, 2],
        "ignore_labels": [None, []], "truncate": [True, False]}),
    "/v1/classify zero-shot": ({"inputs": TEXTS, "candidate_labels": ["pets", "towns"]}, {
        "top_k": [None, 1], "raw_scores": [True, False], "multi_label": [True, False],
        "hypothesis_template": [None, "It is about {}."], "truncate": [True, False]}),
    "/v1/qa": ({"inputs": [{"question": "Who sat?", "context": TEXTS[0]}] * 2}, {
        "top_k": [1, 3], "max_answer_len": [1, 15], "handle_impossible_answer": [True, False],
        "align_to_words": [True, False], "max_seq_len": [None, 24],
        "doc_stride": [None, 4]}),
    "/": ({"inputs": TEXTS}, {"model": ["pooled", "tokens", "splade", "sentiment", "tagger"]}),
    "/ qa": ({"inputs": {"question": "Who sat?", "context": TEXTS[0]}, "model": "squad"}, {
        "parameters": [None, {"top_k": 2, "handle_impossible_answer": True,
                              "max_question_len": 64, "align_to_words": False,
                              "max_seq_len": 16, "doc_stride": 2}]}),
    "/ zero-shot": ({"inputs": TEXTS[0], "model": "nli"}, {"parameters": [
        {"candidate_labels": ["pets"]}, {"candidate_labels": ["pets", "towns"],
                                         "multi_label": True, "hypothesis_template": None}]}),
    "/ ner": ({"inputs": TEXTS, "model": "tagger"}, {"parameters": [
        None, {}, {"aggregation_strategy": "first", "ignore_labels": ["PER"], "stride": None},
        {"aggregation_strategy": "max", "ignore_labels": [], "stride": 2}]}),
    "/v1/tokenize": ({"inputs": TEXTS}, {"add_special_tokens": [True, False]}),
}


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, splade_checkpoint, tmp_path_factory):
    repo = tmp_path_factory.mktemp("combinations")
    exports(tiny_checkpoints["bert", "embed"], repo / "pooled", "onnx", check=False)
    exports(tiny_checkpoints["bert", "embed"], repo / "tokens", "torch",
            token_embeddings=True, check=False)
    exports(splade_checkpoint, repo / "splade", "onnx", check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "sentiment", "onnx", check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cross-checkpoint")
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    exports(tiny_checkpoints["bert", "ner"], repo / "tagger", "onnx", check=False)
    nli = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["entailment", "neutral",
                                                                      "contradiction"]),
                          repo.parent / "nli-checkpoint")
    exports(nli, repo / "nli", "onnx", check=False)
    squad = checkpoint.save(checkpoint.new("bert", "tiny", "qa"), repo.parent / "squad")
    exports(squad, repo / "squad", "onnx", check=False)
    with running_server(repo) as url:
        yield url


@pytest.mark.parametrize("route", ROUTES)
def test_every_combination_of_a_routes_options_is_answered(url, route):
    body, options = ROUTES[route]
    refused = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for values in itertools.product(*options.values()):
            chosen = {k: v for k, v in zip(options, values) if v is not None}
            if route in ("/classify", "/v1/classify zero-shot"):  # unnamed would be two
                chosen["model"] = "sentiment" if route == "/classify" else "nli"
            response = http.post(route.split()[0], json={**body, **chosen})
            if response.status_code != 200:
                refused.append((chosen, response.status_code, response.text[:200]))
    assert not refused
