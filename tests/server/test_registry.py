"""The registry picks a model for a capability one way, for every protocol: against
stand-in engines and a stand-in service (no server, no export)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distilserve.server.core import registry
from distilserve.server.core.card import relevant_index
from distilserve.server.core.refusals import Refusal
from distilserve.server.errors import ApiError


def engine(name: str, task: str, labels=(), relevant_label=None, **extra):
    manifest = SimpleNamespace(task=task, relevant_label=relevant_label)
    labels = list(labels)
    return SimpleNamespace(
        name=name, task=task, labels=labels, manifest=manifest,
        relevant=relevant_index(manifest, labels),
        entailment=next((i for i, x in enumerate(labels) if x.startswith("entail")), None),
        pools=extra.get("pools"), sparse=extra.get("sparse", False),
        text=SimpleNamespace(digest=extra.get("digest", "wordpiece")))


def service(*engines, ready=True, draining=False, status="ready"):
    return SimpleNamespace(engines={e.name: e for e in engines}, aliases=lambda: {},
                           failures={}, unloaded=lambda: set(), ready=ready,
                           draining=draining, status=status,
                           settings=SimpleNamespace(model_control="none", poll_seconds=0,
                                                    require_all_models=False),
                           nothing_to_serve=lambda: None)


EMBED = engine("embed", "embed")
ONE_LOGIT = engine("score", "classify", ["score"])  # a cross-encoder exported as it was
TWO_LABELS = engine("sentiment", "classify", ["negative", "positive"])
NAMED = engine("cross", "classify", ["irrelevant", "relevant"], relevant_label="relevant")
THREE = engine("topics", "classify", ["a", "b", "c"])
NER = engine("ner", "ner", ["O", "B-PER"])


@pytest.mark.parametrize("model, cross_encoder, reranks", [
    (ONE_LOGIT, True, True), (NAMED, True, True), (TWO_LABELS, False, True),
    (THREE, False, False), (EMBED, False, True), (NER, False, False)])
def test_one_answer_to_what_reranks(model, cross_encoder, reranks):
    """Unnamed rerank and TEI's description ask ``cross_encoder``; a rerank naming the
    model and TEI gRPC's health ask ``reranks``: each answer holds for every protocol."""
    assert registry.cross_encoder(model) is cross_encoder
    assert registry.reranks(model) is reranks
    svc = service(model)
    if reranks:
        assert registry.pick(svc, "rerank", model.name) is model
    else:
        with pytest.raises(Refusal) as refused:
            registry.pick(svc, "rerank", model.name)
        assert refused.value.reason == "wrong_task"
    if cross_encoder or model is EMBED:
        assert registry.pick(svc, "rerank") is model
    else:
        with pytest.raises(Refusal, match="no served model can rerank"):
            registry.pick(svc, "rerank")


def test_an_unnamed_rerank_takes_the_cross_encoder_before_the_embedding_model():
    assert registry.pick(service(EMBED, ONE_LOGIT, TWO_LABELS), "rerank") is ONE_LOGIT
    assert registry.pick(service(EMBED, TWO_LABELS), "rerank") is EMBED
    with pytest.raises(Refusal, match=r"several cross-encoder models can rerank \(score, "
                       r"cross\): name one in 'model'") as refused:
        registry.pick(service(EMBED, ONE_LOGIT, NAMED), "rerank")
    assert refused.value.reason == "ambiguous"


def test_a_task_by_name_or_the_one_that_does_it():
    svc = service(EMBED, TWO_LABELS, NER)
    assert registry.pick(svc, "embed") is EMBED
    assert registry.pick(svc, "classify", "sentiment") is TWO_LABELS
    with pytest.raises(Refusal, match="model 'ner' does ner, not classify"):
        registry.pick(svc, "classify", "ner")
    with pytest.raises(Refusal, match="no served model does qa"):
        registry.pick(svc, "qa")
    with pytest.raises(Refusal, match=r"several models do classify \(sentiment, topics\)"):
        registry.pick(service(TWO_LABELS, THREE), "classify")
    with pytest.raises(Refusal, match="unknown model 'nope'; served: embed, ner, sentiment"):
        registry.pick(svc, "embed", "nope")


def test_what_an_embedding_model_gives_and_zero_shot():
    tokens = engine("tokens", "embed", pools="mean")
    splade = engine("splade", "embed", sparse=True)
    nli = engine("nli", "classify", ["entailment", "neutral", "contradiction"])
    svc = service(EMBED, tokens, splade, nli, TWO_LABELS)
    assert registry.pick(svc, "token embeddings") is tokens
    assert registry.pick(svc, "sparse embeddings") is splade
    assert registry.pick(svc, "zero-shot") is nli
    with pytest.raises(Refusal, match="export it with distilserve export --token-embeddings"):
        registry.pick(svc, "token embeddings", "embed")
    with pytest.raises(Refusal, match="model 'sentiment' has the labels negative, positive "
                       "and none is entailment"):
        registry.pick(svc, "zero-shot", "sentiment")
    with pytest.raises(Refusal, match="does classify, not embed"):
        registry.pick(svc, "sparse embeddings", "nli")


def test_the_root_and_the_tokenizer():
    assert registry.pick_root(service(NER)) is NER  # TEI's one model, whatever it does
    assert registry.pick_root(service(NER, EMBED)) is EMBED
    assert registry.pick_tokenizer(service(NER, EMBED)) in (NER, EMBED)
    other = engine("bpe", "embed", digest="bpe")
    with pytest.raises(Refusal, match="the served models tokenise differently"):
        registry.pick_tokenizer(service(EMBED, other))
    assert registry.pick_tokenizer(service(EMBED, other), "bpe") is other


@pytest.mark.parametrize("ready, draining, retry", [(False, False, 2), (True, True, 5)])
def test_no_pick_while_loading_or_shutting_down(ready, draining, retry):
    with pytest.raises(Refusal) as refused:
        registry.pick(service(EMBED, ready=ready, draining=draining,
                              status="loading embed (1 of 1)"), "embed", "embed")
    assert (refused.value.reason, refused.value.retry_after) == ("unavailable", retry)
    assert refused.value.message.startswith(  # what is being done meanwhile
        "not ready (loading embed (1 of 1))" if not ready else "the service is shutting down")


def test_one_answer_to_whether_the_service_is_ready():
    """/ready, gRPC's health checks and the protocol's ServerReady all ask ``unready``."""
    assert registry.unready(service(EMBED)) is None
    assert registry.unready(service(EMBED, ready=False, status="loading embed")) == \
        "loading embed"
    assert registry.unready(service(EMBED, draining=True)) == "shutting down"
    failed = service(EMBED)
    failed.failures, failed.nothing_to_serve = {"bad": "no manifest"}, lambda: None
    assert registry.unready(failed) is None  # served, one failure listed
    failed.settings.require_all_models = True
    assert registry.unready(failed) == ("models failed to load "
                                        "(DISTILSERVE_REQUIRE_ALL_MODELS): bad: no manifest")
    empty = service()
    empty.nothing_to_serve = lambda: "no model to serve"
    assert registry.unready(empty) == "no model to serve"


@pytest.mark.parametrize("reason, status, kind", [
    ("not_found", 404, "model_not_found"), ("wrong_task", 400, "wrong_task"),
    ("ambiguous", 400, "invalid_request"), ("unavailable", 503, "unavailable")])
def test_http_says_each_refusal_once(reason, status, kind):
    error = ApiError.of(Refusal(reason, "why", retry_after=3 if reason == "unavailable" else None))
    assert (error.status, error.kind, error.message) == (status, kind, "why")
    assert error.headers == ({"Retry-After": "3"} if reason == "unavailable" else None)
    assert ApiError.of(error) is error


def refusal(pick, *args) -> tuple[int, str]:
    """The refusal of ``pick(*args)`` as HTTP says it: (status, message)."""
    with pytest.raises(Refusal) as e:
        pick(*args)
    error = ApiError.of(e.value)
    return error.status, error.message


def test_an_unnamed_model_is_the_one_that_can_else_the_refusal_says_why():
    pooled, tokens, more = (engine(name, "embed", pools=pools)
                            for name, pools in (("a", None), ("b", "mean"), ("c", "cls")))
    splade = engine("s", "embed", sparse=True)
    both = service(pooled, tokens, splade)
    assert registry.pick(both, "token embeddings") is tokens
    assert registry.pick(both, "token embeddings", "b") is tokens
    assert registry.pick(both, "sparse embeddings") is splade
    assert refusal(registry.pick, both, "embed") == (
        400, "several models do embed (a, b, s): name one in 'model'")
    assert refusal(registry.pick, both, "ner") == (404, "no served model does ner")
    assert refusal(registry.pick, service(pooled), "token embeddings") == (
        404, "no served model gives token embeddings (distilserve export --token-embeddings)")
    assert refusal(registry.pick, service(tokens, more), "token embeddings") == (
        400, "several models give token embeddings (b, c): name one in 'model'")
    status, message = refusal(registry.pick, both, "token embeddings", "a")
    assert status == 400 and "export it with distilserve export --token-embeddings" in message
    assert refusal(registry.pick, both, "sparse embeddings", "b") == (
        400, "model 'b' is not a SPLADE model (a masked-language model exported with "
        "distilserve export --pooling splade)")


def test_zero_shot_takes_the_nli_model_named_or_the_only_one():
    nli = engine("nli", "classify", ["contradiction", "entailment", "neutral"])
    sentiment, embedder = engine("sentiment", "classify", ["negative", "positive"]), \
        engine("e", "embed")
    assert registry.pick(service(nli, sentiment, embedder), "zero-shot") is nli
    assert registry.pick(service(nli, sentiment), "zero-shot", "nli") is nli
    assert refusal(registry.pick, service(sentiment), "zero-shot") == (
        404, "no served model classifies zero-shot (an NLI model, with an entailment label)")
    assert refusal(registry.pick, service(nli, sentiment), "zero-shot", "sentiment") == (
        400, "model 'sentiment' has the labels negative, positive and none is entailment: "
        "zero-shot classification takes an NLI model (entailment, neutral, contradiction)")
    assert refusal(registry.pick, service(nli, embedder), "zero-shot", "e")[0] == 400
    other = engine("nli2", "classify", nli.labels)
    assert refusal(registry.pick, service(nli, other), "zero-shot") == (
        400, "several models classify zero-shot (nli, nli2): name one in 'model'")


def test_every_reason_the_core_refuses_for_has_its_http_status():
    from distilserve.server.core.refusals import REASONS
    from distilserve.server.errors import HTTP

    assert set(HTTP) == set(REASONS)
