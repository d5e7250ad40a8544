"""Pure functions from model outputs to response items: pooling token vectors,
normalising, softmax/top-k, answer spans, a mask's
likeliest tokens. Tested without a server.

A token classifier's entities are distilserve/models/entities.py's (the training's
evaluation groups them too).
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable

import ml_dtypes
import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), taken as e^-log(1 + e^-x): no overflow where x is far below 0 (e^-x
    past the float's range made numpy warn at each such logit), the small values kept."""
    return np.exp(-np.logaddexp(0, -x))


def normalize(v: np.ndarray) -> np.ndarray:
    """Unit length along the last axis: one vector, or the rows of [N, D]. Where a length
    is out of float32's comfortable range, it is taken and divided by in float64: the
    squares of components past ~1e18 overflow float32, as CMOW's products do on long
    inputs (1e23 at 400 words), and such vectors had come back as zeros."""
    length = np.sqrt(np.einsum("...d,...d->...", v, v))[..., None]  # (einsum: no warning)
    if 1e-18 < length.min() and length.max() < 1e18:
        return v / length
    length = np.sqrt(np.einsum("...d,...d->...", v, v, dtype=np.float64))[..., None]
    return (v / np.maximum(length, 1e-12)).astype(v.dtype)


# each input's token vectors [T, D] (its padding left out) -> its embedding [D], as the
# exported graphs pool them (models/heads.pool)
POOLED = {
    "mean": lambda tokens: tokens.mean(0),
    "cls": lambda tokens: tokens[0],
    "max": lambda tokens: tokens.max(0),
    "mean_sqrt_len_tokens": lambda tokens: tokens.sum(0) / np.sqrt(len(tokens)),
    "weightedmean": lambda tokens: (np.arange(1, len(tokens) + 1, dtype=tokens.dtype)
                                    @ tokens) / (len(tokens) * (len(tokens) + 1) / 2),
}


def sentence_embeddings(outputs: list[np.ndarray], pooling: str | None) -> np.ndarray:
    """The inputs' embeddings [N, D] from an embedding model's outputs: pooled already
    (``pooling`` None), or each input's token vectors [T_i, D], pooled here (POOLED)."""
    if pooling is None:
        return np.stack(outputs)
    if pooling not in POOLED:
        raise ValueError(f"unknown pooling {pooling!r} ({', '.join(POOLED)})")
    return np.stack([POOLED[pooling](tokens) for tokens in outputs])


def sparse(vector: np.ndarray) -> list[dict]:
    """A SPLADE embedding's non-zero entries, {index, value}, in index order (TEI's
    /embed_sparse)."""
    indices = np.flatnonzero(vector)
    return [{"index": i, "value": v} for i, v in zip(indices.tolist(), vector[indices].tolist())]


def cosines(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Each document embedding's [N, D] cosine similarity with its query's, of one [1, D]
    for all or one each [N, D]."""
    return (normalize(documents) * normalize(queries)).sum(-1)


def ranked(scores: np.ndarray, documents: list[str], top_n: int | None,
           return_documents: bool) -> list[dict]:
    """Rerank results, highest score first (ties in input order), the best ``top_n`` (0 or
    None: all)."""
    order = np.argsort(-scores, kind="stable")[:top_n or None]
    return [{"index": int(i), "relevance_score": float(scores[i]),
             **({"document": {"text": documents[i]}} if return_documents else {})}
            for i in order]


# vLLM's embed_dtype: the numbers of a packed output (its base64 and bytes encodings)
PACKED = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def packed(v: np.ndarray, dtype: str = "float32", endianness: str = "little") -> bytes:
    """An output's numbers (any shape, row after row) as bytes, as vLLM packs them: each
    rounded to the nearest ``dtype`` (PACKED), in the byte order ``endianness`` (little,
    big, or native: this machine's)."""
    numbers = np.ascontiguousarray(v, dtype=np.float32).astype(PACKED[dtype])
    order = sys.byteorder if endianness == "native" else endianness
    if order != sys.byteorder and numbers.itemsize > 1:
        numbers = numbers.view(f"u{numbers.itemsize}").byteswap()
    return numbers.tobytes()


def embedding_payload(v: np.ndarray, encoding_format: str, dtype: str = "float32",
                      endianness: str = "little") -> np.ndarray | str:
    """OpenAI's encodings: float32 numbers (the array, for a JSON list), or base64 of their
    bytes, little-endian float32 unless vLLM's ``dtype`` and ``endianness`` say (packed)."""
    if encoding_format == "base64":
        return base64.b64encode(packed(v, dtype, endianness)).decode("ascii")
    return np.ascontiguousarray(v, dtype="<f4")


def packed_outputs(outputs: list[np.ndarray], dtype: str, endianness: str
                   ) -> tuple[bytes, list[dict]]:
    """vLLM's bytes encoding: the outputs packed one after another, and where each lies
    (its index, dtype, endianness, start and end byte, and shape)."""
    parts, items, at = [], [], 0
    for index, v in enumerate(outputs):
        parts.append(packed(v, dtype, endianness))
        items.append({"index": index, "embed_dtype": dtype, "endianness": endianness,
                      "start": at, "end": at + len(parts[-1]), "shape": list(np.shape(v))})
        at += len(parts[-1])
    return b"".join(parts), items


def cohere_embeddings(vectors: np.ndarray, types: list[str]) -> dict:
    """Unit embeddings [N, D] in each of Cohere's embedding types asked for: float; int8
    (each component times 127, rounded) and uint8 (shifted to 0..255); binary and ubinary
    (a bit per component, set where it is positive, packed 8 to a byte, signed by
    subtracting 128 for binary, as Cohere and sentence-transformers pack them); base64 (each
    embedding's float32 little-endian bytes)."""
    packed = np.packbits(vectors > 0, axis=-1) if {"binary", "ubinary"} & set(types) else None
    made = {"float": lambda: vectors,
            "int8": lambda: np.clip(np.round(vectors * 127), -128, 127).astype(np.int8),
            "uint8": lambda: np.clip(np.round((vectors + 1) * 127.5), 0, 255).astype(np.uint8),
            "binary": lambda: (packed.astype(np.int16) - 128).astype(np.int8),
            "ubinary": lambda: packed,
            "base64": lambda: [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                               for v in vectors]}
    return {kind: made[kind]() for kind in dict.fromkeys(types)}


def label_scores(logits: np.ndarray, labels: list[str], multi_label: bool = False,
                 function: str | None = None) -> np.ndarray:
    """One input's score per label (or each row's of a batch's [B, L]), in the labels'
    order, as transformers' text-classification pipeline's ``function_to_apply`` says:
    "softmax", "sigmoid" (each logit on its own), "none" (the logits); None, as the
    pipeline chooses: the sigmoid for a single label or labels that are independent (a
    multi-label model: problem_type multi_label_classification), else the softmax."""
    if function is None:
        function = "sigmoid" if len(labels) == 1 or multi_label else "softmax"
    return {"softmax": softmax, "sigmoid": sigmoid, "none": lambda x: x}[function](logits)


def best(scores: np.ndarray, labels: list[str], top_k: int | None) -> list[dict]:
    """The labels and their scores, highest first (ties in label order: the sort is
    stable), the best ``top_k``. Sorted in Python, which for a model's few labels is faster
    than numpy's argsort (on the event loop, once per input)."""
    values = scores.tolist()
    order = sorted(range(len(labels)), key=lambda i: -values[i])[: top_k or len(labels)]
    return [{"label": labels[i], "score": values[i]} for i in order]


def zero_shot(logits: np.ndarray, entailment: int, independent: bool,
              raw: bool = False) -> np.ndarray:
    """One text's score per candidate label, as transformers' zero-shot-classification
    pipeline gives it, from an NLI model's logits [L, C] for the text paired with each
    label's hypothesis: the softmax of the entailment logits over the labels; with
    ``independent`` labels (the pipeline's multi_label, and always for one label) each
    label's softmax of [contradiction, entailment], contradiction being the model's first
    label, or its last where entailment is the first, as the pipeline takes it. ``raw``:
    the entailment logits."""
    if raw:
        return logits[:, entailment]
    if independent or len(logits) == 1:
        contradiction = -1 if entailment == 0 else 0
        return softmax(logits[:, [contradiction, entailment]])[:, 1]
    return softmax(logits[:, entailment])


def answers(windows: list, context: str, cls_id: int | None, top_k: int,
            max_answer_len: int, impossible: bool, align_to_words: bool) -> list[dict]:
    """One (question, context) pair's best answers, as transformers' question-answering
    pipeline finds them, from each of its windows' start and end logits [T, 2] and
    encoding (the Rust tokenizer's; the context its second sequence): each {score, start,
    end, answer}, the answer the context's characters start:end, best first, ``top_k`` of
    them. Only the context's tokens may start or end one (and [CLS], scored 0: with
    ``impossible`` the empty answer is added, scored as [CLS] is at its least), at most
    ``max_answer_len`` tokens long; ``align_to_words`` widens a span to whole words. Spans
    of the same text (in any case) are one answer, their scores summed, as the pipeline
    does since transformers 4.46 (of each window's best 2k + 10 spans when aligned to
    words)."""
    found: dict[str, dict] = {}  # by the answer's text, lower-cased
    no_answer = 1_000_000.0
    for logits, encoding in windows:
        ids = np.asarray(encoding.ids)
        may = np.array([sequence == 1 for sequence in encoding.sequence_ids])  # [T]
        if cls_id is not None:
            may |= ids == cls_id
        start, end = (softmax(np.where(may, logits[:, i], -10000.0)) for i in (0, 1))  # [T]
        no_answer = min(no_answer, float(start[0] * end[0]))
        start[0] = end[0] = 0.0
        # every span's score, start <= end < start + max_answer_len: [T, T]
        spans = np.tril(np.triu(np.outer(start, end)), max_answer_len - 1)
        for s, e in _best_spans(spans, top_k * 2 + 10 if align_to_words else top_k):
            if may[s] and may[e]:
                first, last = _characters(encoding, s, e, align_to_words)
                text, score = context[first:last], float(spans[s, e])
                if (same := found.get(text.lower())) is not None:
                    same["score"] += score
                else:
                    found[text.lower()] = {"score": score, "start": first, "end": last,
                                           "answer": text}
    answered = list(found.values())
    if impossible:
        answered.append({"score": no_answer, "start": 0, "end": 0, "answer": ""})
    return sorted(answered, key=lambda a: a["score"], reverse=True)[:top_k]


def decode_masks(ids: np.ndarray, vectors: np.ndarray, mask_id: int,
                 decoder: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """A fill-mask batch's mask tokens through the language-model head's ``decoder`` (its
    vectors [N, E] -> logits [N, V]) in one product, from the batch's token ids [B, T] and
    vectors [B, T, E]: per input, the logits [M, V] of its M mask tokens, in order. One
    product for the batch rather than one per input: the decoder's weights are read once
    (a bert-base decoder is 94 MB, and one mask's product is bound by reading them)."""
    rows, columns = np.nonzero(ids == mask_id)  # row by row, in order
    logits = decoder(vectors[rows, columns].astype(np.float32))  # [sum M, V]
    return np.split(logits, np.cumsum(np.bincount(rows, minlength=len(ids)))[:-1])


def fill_mask(logits: np.ndarray, ids: list[int], mask_id: int, top_k: int,
              targets: list[int] | None, decode: Callable[[list[int], bool], str]
              ) -> list[list[dict]]:
    """One input's answer, as transformers' fill-mask pipeline gives it, from its token ids
    [T] and its mask tokens' logits [M, V] (``decode_masks``): per mask token, the
    ``top_k`` likeliest tokens (of ``targets`` alone, if given), each {score: its
    probability over the whole vocabulary, token, token_str, sequence: the input with this
    mask filled}; with one mask the sequence leaves the special tokens out, with several it
    keeps them (the other masks), as the pipeline does. ``decode(ids,
    skip_special_tokens)``: the tokenizer's text."""
    ids = np.asarray(ids)
    masks = np.flatnonzero(ids == mask_id)
    probs = softmax(logits)  # [M, V]
    if targets is not None:
        probs = probs[:, targets]  # [M, len(targets)]
    single, filled = len(masks) == 1, []
    for at, p in zip(masks, probs):
        found = []
        for j in largest(p, top_k):
            token = int(targets[j]) if targets is not None else int(j)
            sequence = ids.copy()
            sequence[at] = token
            found.append({"score": float(p[j]), "token": token,
                          "token_str": decode([token], False),
                          "sequence": decode(sequence.tolist(), single)})
        filled.append(found)
    return filled


def largest(x: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest of ``x`` [N], largest first, ties in index order
    (as a stable sort of all of ``x`` gives them), without sorting all of ``x``."""
    if k >= len(x):
        return np.argsort(-x, kind="stable")
    kth = np.partition(x, len(x) - k)[len(x) - k]  # the k-th largest value
    candidates = np.flatnonzero(x >= kth)  # the k largest, and any tied with the k-th
    return candidates[np.argsort(-x[candidates], kind="stable")][:k]


def _best_spans(spans: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` best (start, end) of a [T, T] table of scores, best first."""
    best = largest(spans.ravel(), k)
    return [(int(s), int(e)) for s, e in zip(*np.unravel_index(best, spans.shape))]


def _characters(encoding, first: int, last: int, align_to_words: bool) -> tuple[int, int]:
    """The context's characters from token ``first`` to token ``last``: from its first
    word's start to its last word's end (``align_to_words``), else the tokens' own."""
    if align_to_words:
        try:
            return (encoding.word_to_chars(encoding.token_to_word(first), 1)[0],
                    encoding.word_to_chars(encoding.token_to_word(last), 1)[1])
        except TypeError:  # a token of no word ([CLS])
            pass
    return encoding.offsets[first][0], encoding.offsets[last][1]
