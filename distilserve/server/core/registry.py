"""The served models, and one way to pick a model for a capability: the one named, checked
that it can, or, unnamed, the one served model that can. What each capability needs of
a model is decided here and nowhere else.

``svc`` is the service (distilserve/server/service.py): its ``engines`` by name, its
``aliases()``, ``failures``, ``unloaded()``, ``ready``, ``draining`` and ``settings``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from distilserve.server.core.refusals import Refusal

TASKS = ("embed", "classify", "ner", "qa", "fill-mask")


def cross_encoder(engine) -> bool:
    """A classifier made to score relevance: one logit, or a label named relevant
    (``distilserve export --relevant-label``). Picked by an unnamed rerank, and what TEI
    describes as a reranker."""
    return engine.task == "classify" and (
        len(engine.labels) == 1 or engine.manifest.relevant_label in engine.labels)


def reranks(engine) -> bool:
    """What a rerank that names the model accepts: an embedding model, or a classifier
    with a relevance output (a cross-encoder, or two labels' second)."""
    return engine.task == "embed" or (engine.task == "classify" and engine.relevant is not None)


def gives_token_embeddings(engine) -> bool:
    return engine.task == "embed" and engine.pools is not None


def gives_sparse_embeddings(engine) -> bool:
    return engine.task == "embed" and engine.sparse


def classifies_zero_shot(engine) -> bool:
    """An NLI model: a classifier with an entailment label."""
    return engine.task == "classify" and engine.entailment is not None


@dataclass(frozen=True)
class Capability:
    task: str | None  # the task a named model must do (None: any)
    # the served models an unnamed request may get, tier by tier: (who, several of them)
    tiers: tuple[tuple[Callable[[object], bool], str], ...]
    does: str  # "no served model {does}"
    # a named model of the right task that its predicate refuses: the refusal's message
    why_not: Callable[[object, str], str | None] = lambda engine, name: None


def _task(task: str) -> Capability:
    return Capability(task, ((lambda e: e.task == task, f"models do {task}"),), f"does {task}")


def _why_not_reranker(engine, name: str) -> str | None:
    if reranks(engine):
        return None
    if engine.task != "classify":
        return (f"model {name!r} does {engine.task}; rerank needs an embedding model or a "
                "classification model (a cross-encoder)")
    return (f"model {name!r} has labels {engine.labels} and none is named relevant "
            "(distilserve export --relevant-label), so it cannot score relevance")


CAPABILITIES = {
    **{task: _task(task) for task in TASKS},
    "rerank": Capability(
        None, ((cross_encoder, "cross-encoder models can rerank"),
               (lambda e: e.task == "embed", "embedding models can rerank")),
        "can rerank", _why_not_reranker),
    "zero-shot": Capability(
        "classify", ((classifies_zero_shot, "models classify zero-shot"),),
        "classifies zero-shot (an NLI model, with an entailment label)",
        lambda e, name: None if classifies_zero_shot(e) else (
            f"model {name!r} has the labels {', '.join(e.labels)} and none is entailment: "
            "zero-shot classification takes an NLI model (entailment, neutral, "
            "contradiction)")),
    "token embeddings": Capability(
        "embed", ((gives_token_embeddings, "models give token embeddings"),),
        "gives token embeddings (distilserve export --token-embeddings)",
        lambda e, name: None if gives_token_embeddings(e) else (
            f"model {name!r} pools its token vectors inside its exported graph, so they "
            "never leave it: export it with distilserve export --token-embeddings for them")),
    "sparse embeddings": Capability(
        "embed", ((gives_sparse_embeddings, "models give sparse embeddings"),),
        "gives sparse embeddings (SPLADE's: distilserve export --pooling splade)",
        lambda e, name: None if gives_sparse_embeddings(e) else (
            f"model {name!r} is not a SPLADE model (a masked-language model exported with "
            "distilserve export --pooling splade)")),
}


def serving(svc):
    """The service, when it takes requests (unavailable while loading or shutting down)."""
    if svc.draining:
        raise Refusal("unavailable", "the service is shutting down", retry_after=5)
    if not svc.ready:
        raise Refusal("unavailable", f"not ready ({svc.status}); retry shortly (GET /ready "
                      "says when)", retry_after=2)
    return svc


def unready(svc) -> str | None:
    """Why the service is not ready, or None once every model folder has been loaded and
    warmed or has failed and at least one is served (with DISTILSERVE_REQUIRE_ALL_MODELS,
    none failed), until it shuts down."""
    if svc.draining:
        return "shutting down"
    if not svc.ready:
        return svc.status
    if svc.failures and svc.settings.require_all_models:
        return "models failed to load (DISTILSERVE_REQUIRE_ALL_MODELS): " + "; ".join(
            f"{name}: {why}" for name, why in sorted(svc.failures.items()))
    return svc.nothing_to_serve()


def named(svc, name: str):
    """The served model of that name (or alias), whatever it does; not found saying why it
    is not served (it failed to load, or is not loaded) and naming the ones served."""
    engine = svc.engines.get(name)
    if engine is None and (alias := svc.aliases().get(name)) is not None:
        engine = svc.engines.get(alias)
    if engine is None:
        served = ", ".join(sorted(svc.engines)) or "none"
        if name in svc.failures:
            why = f"model {name!r} is not served: it failed to load ({svc.failures[name]})"
        elif name in svc.unloaded():
            why = f"model {name!r} is not loaded " + (
                f"(load it: POST /v2/repository/models/{name}/load)"
                if svc.settings.model_control == "explicit" else "yet; retry shortly"
                if svc.settings.poll_seconds else "(its folder came after the repository "
                "was read: restart the service, or set DISTILSERVE_POLL_SECONDS)")
        else:
            why = f"unknown model {name!r}"
        raise Refusal("not_found", f"{why}; served: {served}")
    return engine


def pick(svc, capability: str, name: str | None = None):
    """The model for ``capability`` (one of CAPABILITIES): the one named, if it can; else
    the one served model that can, tier by tier (a rerank: the one cross-encoder, else the
    one embedding model)."""
    svc, able = serving(svc), CAPABILITIES[capability]
    if name is not None:
        engine = named(svc, name)
        if able.task is not None and engine.task != able.task:
            raise Refusal("wrong_task", f"model {name!r} does {engine.task}, not {able.task}")
        if (why := able.why_not(engine, name)) is not None:
            raise Refusal("wrong_task", why)
        return engine
    for can, several in able.tiers:
        these = [e for e in svc.engines.values() if can(e)]
        if len(these) == 1:
            return these[0]
        if these:
            raise Refusal("ambiguous", f"several {several} ({', '.join(e.name for e in these)})"
                          ": name one in 'model'")
    raise Refusal("not_found", f"no served model {able.does}")


def pick_root(svc, name: str | None = None):
    """The model of TEI's root (POST /), where TEI serves its one model: the one named,
    else the only one served, else the one embedding model."""
    svc = serving(svc)
    if name is not None:
        return named(svc, name)
    if len(svc.engines) == 1:
        return next(iter(svc.engines.values()))
    return pick(svc, "embed")


def pick_any(svc, name: str):
    """The served model of that name, whatever its task."""
    return named(serving(svc), name)


def pick_tokenizer(svc, name: str | None = None):
    """Any model; unnamed: any one, when every served model tokenises alike."""
    if name is not None:
        return pick_any(svc, name)
    engines = list(serving(svc).engines.values())
    if not engines:
        raise Refusal("not_found", "no model is served")
    if len({e.text.digest for e in engines}) > 1:
        raise Refusal("ambiguous", "the served models tokenise differently "
                      f"({', '.join(e.name for e in engines)}): name one in 'model'")
    return engines[0]
