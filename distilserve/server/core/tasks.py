"""One pipeline per task, whatever protocol asked: the model picked (core/registry.py), the
request checked (core/inference.py), its inputs run, and each answer finished from the
outputs. Each takes a Call and plain values, and returns the model, the answers (plain
Python and numpy values) and the run (its Result: the timing headers' figures). The
embedding pipeline is core/inference.embedded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from distilserve.models import entities as spans
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import (
    Call,
    capped,
    check_answer_size,
    check_limits,
    check_token_ids,
    embedded,
    infer,
    numbered,
    pair_cuts,
    read_foreign,
    with_prompt,
    within,
)
from distilserve.server.core.refusals import Refusal

WINDOW, STRIDE = 384, 128  # question answering's most tokens of a window, and of its overlap


# classification ---------------------------------------------------------------------------
async def logits(call: Call, model: str | None, texts: list, truncation: str | None,
                 iterations: int | None = None) -> tuple:
    """The classification model and its run on ``texts`` (texts or pairs; each output an
    input's logits [C])."""
    engine = registry.pick(call.service, "classify", model)
    check_limits(call, texts)
    return engine, await infer(call, engine, texts, truncation, iterations=iterations)


async def classify(call: Call, model: str | None, texts: list, truncation: str | None,
                   function: str | None = None, top_k: int | None = None,
                   iterations: int | None = None) -> tuple:
    """The classification model, each input's labels and scores (highest first, the best
    ``top_k``; ``function``: the function applied to the logits, None the model's own) and
    the run."""
    engine, result = await logits(call, model, texts, truncation, iterations)
    scores = result.postprocessed  # the model's own function, applied by their batch
    if function is not None:
        scores = [postprocess.label_scores(each, engine.labels, engine.multi_label, function)
                  for each in result.outputs]
    return engine, [postprocess.best(each, engine.labels, top_k) for each in scores], result


async def zero_shot(call: Call, model: str | None, texts: list[str], labels: list[str],
                    hypotheses: list[str], truncation: str | None, multi_label: bool = False,
                    raw_scores: bool = False, top_k: int | None = None,
                    iterations: int | None = None) -> tuple:
    """The NLI model, each text's candidate ``labels`` and their scores (highest first, the
    best ``top_k``), and the run: transformers' zero-shot-classification pipeline, the
    model run on every (text, a label's hypothesis) pair (the pairs are the request's
    inputs for its limits)."""
    engine = registry.pick(call.service, "zero-shot", model)
    pairs = [(text, hypothesis) for text in texts for hypothesis in hypotheses]

    def named(k: int) -> str:  # (the pairs: each text with each label, in turn)
        return f"input {k // len(labels)} with candidate label {labels[k % len(labels)]!r}"

    check_limits(call, pairs, what="(text, candidate label) pairs", named=named)
    result = await infer(call, engine, pairs, truncation, named=named, iterations=iterations)
    scores = np.stack(result.outputs).reshape(len(texts), len(labels), -1)  # [N, L, C]
    return engine, [postprocess.best(postprocess.zero_shot(
        each, engine.entailment, multi_label, raw_scores), labels, top_k)
        for each in scores], result


# reranking -----------------------------------------------------------------------------
def _first(engine, *names: str) -> str | None:
    """The first of ``names`` that is one of the model's prompts."""
    return next((name for name in names if name in engine.prompts), None)


async def score(call: Call, model: str | None, queries: list[str], documents: list[str],
                truncation: str | None, raw_scores: bool = False,
                named: Callable[[int], str] = numbered, iterations: int | None = None,
                most: int | None = None, what: str = "documents", total: int | None = None,
                query_most: int | None = None) -> tuple:
    """The reranking model, each document's relevance [N] to the query (one ``queries``,
    for every document) or to its own (one each), and the run: a cross-encoder's relevant
    label's score (its logit with ``raw_scores``), or the cosine of an embedding model's
    embeddings (a SPLADE model's dot product). ``named``: what the client calls the text
    at an index of the queries, then the documents; ``most``: each document first cut to
    so many tokens of text (capped; None or 0: not), at the side ``truncation`` says (None:
    its end), ``query_most`` each query; ``what``: the documents, in the request's limit;
    ``total``: vLLM's truncate_prompt_tokens, what the model reads of each input at most
    (an embedding model: of each text, its prompt counted; a cross-encoder: of each pair,
    cut as the tokenizer's longest_first truncation cuts it), -1 or None its max_length."""
    engine = registry.pick(call.service, "rerank", model)
    q = len(queries)
    # the documents counted (not the queries), each text's characters as sent
    check_limits(call, [*queries, *documents], len(documents), what, named)
    side = truncation or "right"
    documents = await capped(engine, documents, most or None, side, "max_tokens_per_doc",
                             lambda k: named(q + k))
    queries = await capped(engine, queries, query_most or None, side, "max_tokens_per_query",
                           named)
    if engine.task == "embed":  # prompted as sentence-transformers' encode_query/_document
        asks, finds = _first(engine, "query"), _first(engine, "document", "passage", "corpus")
        limit = "truncate_prompt_tokens"
        queries = await within(engine, queries, total, limit, asks, side)
        documents = await within(engine, documents, total, limit, finds, side)
        texts = with_prompt(engine, queries, asks) + with_prompt(engine, documents, finds)
        result = await infer(call, engine, texts, truncation, named=named,
                             iterations=iterations)
        # [Q + N, D]: the queries, then the documents
        vectors = postprocess.sentence_embeddings(result.outputs, engine.pools)
        asked, found = vectors[:q], vectors[q:]
        if engine.sparse:  # SPLADE ranks by dot product
            return engine, (found * asked).sum(-1), result
        return engine, postprocess.cosines(asked, found), result
    pairs = list(zip(queries * len(documents) if q == 1 else queries, documents))
    pairs = await pair_cuts(engine, pairs, total, "truncate_prompt_tokens", side)
    result = await infer(call, engine, pairs, truncation,
                         named=lambda k: f"{named(q + k)} (with {named(0 if q == 1 else k)})",
                         iterations=iterations)
    # [N]: the relevant label's score as classify gives it (the batch's label scores,
    # scored on the model's thread: Engine.batch_postprocess), or its logit (raw_scores)
    rows = result.outputs if raw_scores else result.postprocessed
    return engine, np.stack(rows)[:, engine.relevant], result


# token classification --------------------------------------------------------------------
def _windows(engine, stride: int) -> tuple[int, int]:
    """Windows of the model's max_length tokens, each ``stride`` over the one before
    (refused unless that leaves each window something new)."""
    if stride >= engine.text.room:
        raise Refusal("invalid", f"stride {stride}: model {engine.name!r} reads windows "
                      f"of {engine.text.room} tokens of text (its max_length, "
                      f"{engine.max_length}, less its special tokens); stride must be less")
    return engine.max_length, stride


def entities(engine, text: str, output, strategy: str, ignore: tuple[str, ...]) -> list[dict]:
    """One text's token logits [T, C] and its encoding, or a list of its windows' -> the
    pipeline's entities (those of the windows merged where they overlap)."""
    if isinstance(output, list):
        found = [e for window in output for e in entities(engine, text, window, strategy,
                                                          ignore)]
        return spans.overlapping(found) if len(output) > 1 else found
    logits, encoding = output
    info = spans.TokenInfo.of(encoding, engine.text.unk_id, engine.text.word_aware)
    return spans.entities(text, info, np.asarray(logits), engine.labels, strategy, ignore)


async def recognise(call: Call, model: str | None, texts: list[str], truncation: str | None,
                    strategy: str, ignore: tuple[str, ...], stride: int | None = None,
                    iterations: int | None = None) -> tuple:
    """The NER model, each text's entities (transformers' token-classification pipeline's,
    aggregated by ``strategy``, the labels ``ignore`` left out; with ``stride``, a long
    text read whole in overlapping windows) and the run."""
    engine = registry.pick(call.service, "ner", model)
    check_limits(call, texts)
    if stride is None:
        result = await infer(call, engine, texts, truncation, iterations=iterations)
    else:
        result = await infer(call, engine, texts, None, _windows(engine, stride),
                             iterations=iterations)
    found = await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [entities(engine, text, output, strategy, ignore)
                 for text, output in zip(texts, result.outputs)])
    return engine, found, result


# fill-mask -------------------------------------------------------------------------------
async def fill(call: Call, model: str | None, texts: list[str], truncation: str | None,
               top_k: int, targets: list[str] | None = None,
               iterations: int | None = None) -> tuple:
    """The fill-mask model, per text and per mask token its likeliest tokens (of
    ``targets`` only, where given), and the run."""
    engine = registry.pick(call.service, "fill-mask", model)
    check_limits(call, texts)
    mask = engine.text.mask_token
    for i, text in enumerate(texts):
        if mask not in text:
            raise Refusal("invalid", f"input {i} has no {mask}: the mask token of model "
                          f"{engine.name!r}, which fill-mask fills", input=f"input {i}")
    ids = None
    if targets is not None:
        ids = engine.text.target_ids(targets)
        if not ids:
            raise Refusal("invalid", "targets: none has a token in the vocabulary of model "
                          f"{engine.name!r}")
    # each answer holds its input's tokens (the sequence with the mask filled)
    masks = sum(min(text.count(mask), engine.max_length) for text in texts)
    k = min(top_k, engine.text.vocab_size if ids is None else len(ids))
    check_answer_size(engine, masks * k, engine.max_length, "tokens",
                      f"answers ({masks} masks x top_k {k})")
    result = await infer(call, engine, texts, truncation, iterations=iterations)

    def each(i: int, logits, encoding) -> list[list[dict]]:
        if engine.text.mask_id not in encoding.ids:
            raise Refusal("invalid", f"input {i}: its {mask} was cut, past the max_length "
                          f"of model {engine.name!r} ({engine.max_length} tokens)",
                          input=f"input {i}")
        return postprocess.fill_mask(logits, encoding.ids, engine.text.mask_id, top_k, ids,
                                     engine.text.text_of)

    return engine, await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [each(i, logits, encoding)
                 for i, (logits, encoding) in enumerate(result.outputs)]), result


# question answering ------------------------------------------------------------------------
def _check_questions(engine, pairs: list[tuple[str, str]], size: int, stride: int) -> None:
    """Refused for a question that leaves its context no room past the windows' overlap: a
    question is never cut."""
    for i, encoding in enumerate(engine.text.tokenize([q for q, _ in pairs], None)):
        room = size - len(encoding.ids) - 1  # [CLS] question [SEP] ... [SEP]
        if room <= stride:
            raise Refusal("input_too_long", f"input {i}: its question is "
                          f"{len(encoding.ids)} tokens with [CLS] and [SEP], which leaves "
                          f"{max(room, 0)} of a {size}-token window (max_seq_len) to its "
                          f"context, not more than the windows' overlap, {stride} "
                          "(doc_stride): a question is never cut", input=f"input {i}")


async def answer(call: Call, model: str | None, pairs: list[tuple[str, str]], top_k: int,
                 max_answer_len: int, handle_impossible_answer: bool, align_to_words: bool,
                 max_seq_len: int | None = None, doc_stride: int | None = None,
                 iterations: int | None = None) -> tuple:
    """The question-answering model, each (question, context) pair's answers (best first),
    and the run: transformers' question-answering pipeline, a long context read in
    overlapping windows of ``max_seq_len`` tokens, ``doc_stride`` over each other."""
    engine = registry.pick(call.service, "qa", model)
    check_limits(call, pairs)
    for i, (question, context) in enumerate(pairs):
        if not question or not context:  # (the pipeline's refusal too)
            raise Refusal("invalid", f"input {i}: its {'context' if question else 'question'}"
                          " is empty", input=f"input {i}")
    size = max_seq_len or min(engine.max_length, WINDOW)
    if size > engine.max_length:
        raise Refusal("invalid", f"max_seq_len {size} is more than the max_length of "
                      f"model {engine.name!r}, {engine.max_length}")
    stride = min(STRIDE, size // 2) if doc_stride is None else doc_stride
    check_answer_size(engine, len(pairs) * top_k, min(max_answer_len, size), "tokens",
                      f"answers ({len(pairs)} inputs x top_k {top_k})")
    await asyncio.to_thread(_check_questions, engine, pairs, size, stride)
    result = await infer(call, engine, pairs, None, (size, stride), iterations=iterations)
    return engine, await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [postprocess.answers([(np.asarray(logits), encoding)
                                      for logits, encoding in windows], context,
                                     engine.text.cls_id, top_k, max_answer_len,
                                     handle_impossible_answer, align_to_words)
                 for windows, (_, context) in zip(result.outputs, pairs)]), result


# what an embedding model gives besides its embeddings ------------------------------------
async def token_vectors(call: Call, model: str | None, texts: list, truncation: str | None,
                        prompt_name: str | None = None) -> tuple:
    """Each input's token vectors [T_i, D] (an embedding model exported with
    --token-embeddings), and the run."""
    engine = registry.pick(call.service, "token embeddings", model)
    check_limits(call, texts)
    check_answer_size(engine, len(texts), engine.max_length * engine.dimensions,
                      f"numbers: {engine.max_length} tokens of {engine.dimensions}")
    result = await infer(call, engine, with_prompt(engine, texts, prompt_name), truncation)
    return engine, result.outputs, result


async def sparse_vectors(call: Call, model: str | None, texts: list, truncation: str | None,
                         prompt_name: str | None = None) -> tuple:
    """Each input's SPLADE embedding as its non-zero entries, {index, value}, and the run."""
    engine = registry.pick(call.service, "sparse embeddings", model)
    check_limits(call, texts)
    check_answer_size(engine, len(texts), 2 * engine.dimensions)  # index and value
    result = await infer(call, engine, with_prompt(engine, texts, prompt_name), truncation)
    return engine, [postprocess.sparse(v) for v in result.outputs], result


# each input's output as numbers ---------------------------------------------------------
# what each kind of output needs of a model (registry.CAPABILITIES), and the kind a model
# gives unasked, by its task
OUTPUTS = {"embed": "embed", "classify": "classify", "token_embed": "token embeddings",
           "token_classify": "ner"}
OWN_OUTPUT = {"embed": "embed", "classify": "classify", "ner": "token_classify"}


async def pooled(call: Call, model: str | None, kind: str | None, texts: list,
                 truncation: str, truncate_prompt_tokens: int | None = None,
                 activation: bool = True, dimensions: int | None = None,
                 iterations: int | None = None) -> tuple:
    """The model, each input's output as an array, and the run (vLLM's pooling): ``kind``
    "embed", its embedding [D] (of unit length with ``activation``; its first
    ``dimensions``); "classify", its labels' scores [C] (the model's softmax or sigmoid
    with ``activation``, else its logits); "token_embed", its tokens' vectors [T, D] (each
    of unit length with ``activation``); "token_classify", its tokens' label scores [T, C]
    (their softmax with ``activation``); None, the kind of the model named (else of the one
    served, else of the one embedding model). Token ids are read in the vocabulary the
    model reads them in; ``truncate_prompt_tokens``: as embedded's."""
    if kind is None:
        engine = registry.pick_root(call.service, model)
        if (kind := OWN_OUTPUT.get(engine.task)) is None:
            raise Refusal("wrong_task", f"model {engine.name!r} does {engine.task}; pooling "
                          "takes an embedding, classification or NER model")
        model = engine.name
    if kind == "embed":
        engine, vectors, result = await embedded(
            call, model, texts, dimensions, truncation=truncation, normalize=activation,
            foreign_ids=True, iterations=iterations,
            truncate_prompt_tokens=truncate_prompt_tokens)
        return engine, list(vectors), result
    if dimensions is not None:
        raise Refusal("invalid", f"dimensions: {kind} outputs are given whole; only "
                      "embeddings (task embed) are cut")
    engine = registry.pick(call.service, OUTPUTS[kind], model)
    texts = read_foreign(engine, texts)
    check_limits(call, texts)
    if kind.startswith("token_"):
        width = engine.dimensions if kind == "token_embed" else len(engine.labels)
        check_answer_size(engine, len(texts), engine.max_length * width,
                          f"numbers: {engine.max_length} tokens of {width}")
    texts = await within(engine, texts, truncate_prompt_tokens, "truncate_prompt_tokens",
                         side=truncation)
    result = await infer(call, engine, with_prompt(engine, texts, None), truncation,
                         iterations=iterations)
    if kind == "classify":
        return engine, result.postprocessed if activation else result.outputs, result
    if kind == "token_classify":  # (each output its logits [T, C] and its encoding)
        rows = [logits for logits, _ in result.outputs]
        return engine, [postprocess.softmax(r) for r in rows] if activation else rows, result
    return engine, [postprocess.normalize(v) if activation else v for v in result.outputs], \
        result


# tokenisation ----------------------------------------------------------------------------
async def tokens(call: Call, model: str | None, texts: list[str], add_special_tokens: bool,
                 prompt_name: str | None = None) -> list[list[dict]]:
    """Each text's tokens with their character offsets (behind the prompt named, if any)."""
    engine = registry.pick_tokenizer(call.service, model)
    check_limits(call, texts)
    if prompt_name is not None:
        texts = with_prompt(engine, texts, prompt_name)
    return await asyncio.to_thread(engine.text.tokens, texts, add_special_tokens)


async def decode(call: Call, model: str | None, ids: list[list[int]],
                 skip_special_tokens: bool) -> list[str]:
    """Each list of token ids as text."""
    engine = registry.pick_tokenizer(call.service, model)
    check_limits(call, ids)
    check_token_ids(engine, ids)
    return await asyncio.to_thread(engine.text.decode, ids, skip_special_tokens)

