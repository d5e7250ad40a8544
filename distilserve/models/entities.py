"""A token classifier's logits -> entity spans, as transformers' token-classification
pipeline groups them (its ``gather_pre_entities``, ``aggregate`` and ``group_entities``),
with one difference the contract asks for: ``word`` is the input's own text,
``text[start:end]``, rather than the tokenizer's lower-cased, accent-stripped decoding.
Pure functions, used by the service's NER route and the fine-tuning's evaluation alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass
class TokenInfo:
    """What the tokenizer said about one text: per token id, surface token, character
    offsets and whether it is a special token."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[int]
    unk_id: int
    word_aware: bool  # the tokenizer marks word continuations (WordPiece's "##")

    @staticmethod
    def marks_words(tokenizer) -> bool:
        """Whether a Rust tokenizer (tokenizers.Tokenizer) marks word continuations."""
        return bool(getattr(tokenizer.model, "continuing_subword_prefix", None))

    @classmethod
    def of(cls, encoding, unk_id: int, word_aware: bool) -> TokenInfo:
        """From a Rust tokenizer's Encoding (tokenizers.Encoding)."""
        return cls(ids=encoding.ids, tokens=encoding.tokens, offsets=encoding.offsets,
                   special=encoding.special_tokens_mask, unk_id=unk_id, word_aware=word_aware)


def _tag(label: str) -> tuple[str, str]:
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _pre_entities(text: str, info: TokenInfo, scores: np.ndarray) -> list[dict]:
    out = []
    for idx, token_scores in enumerate(scores):
        if info.special[idx]:
            continue
        start, end = info.offsets[idx]
        word = info.tokens[idx]
        if info.word_aware:
            is_subword = len(word) != len(text[start:end])
        else:
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        if info.ids[idx] == info.unk_id:
            is_subword = False
        out.append({"scores": token_scores, "start": start, "end": end, "index": idx,
                    "is_subword": is_subword})
    return out


def _word(group: list[dict], strategy: str, labels: list[str]) -> dict:
    if strategy == "first":
        scores = group[0]["scores"]
    elif strategy == "max":
        scores = max(group, key=lambda e: e["scores"].max())["scores"]
    else:  # average
        scores = np.nanmean(np.stack([e["scores"] for e in group]), axis=0)
    idx = int(scores.argmax())
    return {"entity": labels[idx], "score": float(scores[idx]), "start": group[0]["start"],
            "end": group[-1]["end"]}


def _words(pre: list[dict], strategy: str, labels: list[str]) -> list[dict]:
    words, group = [], []
    for entity in pre:
        if group and not entity["is_subword"]:
            words.append(_word(group, strategy, labels))
            group = []
        group.append(entity)
    if group:
        words.append(_word(group, strategy, labels))
    return words


def _group(entities: list[dict], text: str) -> list[dict]:
    groups, current = [], []

    def close():
        start, end = current[0]["start"], current[-1]["end"]
        groups.append({"entity_group": current[0]["entity"].split("-", 1)[-1],
                       "score": float(np.mean([e["score"] for e in current])),
                       "word": text[start:end], "start": start, "end": end})

    for entity in entities:
        if current:
            bi, tag = _tag(entity["entity"])
            if not (tag == _tag(current[-1]["entity"])[1] and bi != "B"):
                close()
                current = []
        current.append(entity)
    if current:
        close()
    return groups


def entities(text: str, info: TokenInfo, logits: np.ndarray, labels: list[str],
             strategy: str = "simple", ignore: tuple[str, ...] = ("O",)) -> list[dict]:
    """Token logits [T, C] of one text -> the pipeline's entities for ``strategy``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown aggregation_strategy {strategy!r}")
    scores = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    pre = _pre_entities(text, info, scores / scores.sum(-1, keepdims=True))
    if strategy in ("none", "simple"):
        tokens = []
        for p in pre:
            idx = int(p["scores"].argmax())
            tokens.append({"entity": labels[idx], "score": float(p["scores"][idx]),
                           "index": p["index"], "word": text[p["start"]:p["end"]],
                           "start": p["start"], "end": p["end"]})
    else:
        tokens = _words(pre, strategy, labels)
    if strategy == "none":
        return [t for t in tokens if t["entity"] not in ignore]
    return [g for g in _group(tokens, text) if g["entity_group"] not in ignore]


def overlapping(entities: list[dict]) -> list[dict]:
    """The entities of a text's overlapping windows, by start, where two overlap the longer
    kept (of two as long, the higher score), as the token-classification pipeline merges
    them."""
    kept: list[dict] = []
    for entity in sorted(entities, key=lambda e: e["start"]):
        last = kept[-1] if kept else None
        if last is None or not last["start"] <= entity["start"] < last["end"]:
            kept.append(entity)
        elif ((length := entity["end"] - entity["start"]) > last["end"] - last["start"]
              or length == last["end"] - last["start"] and entity["score"] > last["score"]):
            kept[-1] = entity
    return kept
