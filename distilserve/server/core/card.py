"""A served model's card: what its folder's manifest says it is and does (task, family,
labels and which of them reranks or entails, prompts, pooling, lengths), and what every
request does to its outputs (``batch_postprocess``). Plain facts, read once at load."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from distilserve.models.io.manifest import FILE as MANIFEST
from distilserve.models.io.manifest import Manifest
from distilserve.models.tasks import PER_TOKEN
from distilserve.server.core import postprocess


def relevant_index(manifest: Manifest, labels: list[str]) -> int | None:
    """Which output of a classification model is relevance, for rerank: the single
    logit, the label the manifest names (``relevant_label``), or the second of two."""
    if manifest.task != "classify":
        return None
    named = manifest.relevant_label
    if named in labels:
        return labels.index(named)
    return 0 if len(labels) == 1 else 1 if len(labels) == 2 and named is None else None


@dataclass
class Card:
    name: str
    folder: Path
    manifest: Manifest
    task: str = field(init=False)
    family: str = field(init=False)
    labels: list[str] = field(init=False)
    relevant: int | None = field(init=False)  # the output that is relevance (rerank)
    # an NLI model's entailment label (the first whose name begins so, as transformers'
    # zero-shot-classification pipeline finds it): it classifies zero-shot
    entailment: int | None = field(init=False)
    multi_label: bool = field(init=False)  # a classifier's labels are independent
    # an embedding model's prompts by name, and the one put before unprompted inputs
    prompts: dict[str, str] = field(init=False)
    default_prompt: str = field(init=False)
    # the service pools an embedding model's token vectors (export --token-embeddings)
    pools: str | None = field(init=False)
    # [T, X] an input: NER's labels, QA's start and end, token vectors to pool (not
    # fill-mask's: its batch decodes its mask tokens, [M, V] an input)
    per_token: bool = field(init=False)
    # SPLADE's embeddings: a weight per vocabulary entry, mostly zero, ranked by dot product
    sparse: bool = field(init=False)
    max_length: int = field(init=False)
    created: int = field(init=False)  # OpenAI's "created": when it was exported (Unix s)
    # [B, X] -> [B, X]: what every request would do to its outputs, done by the batch
    # (None: nothing is)
    batch_postprocess: Callable[[np.ndarray], np.ndarray] | None = field(init=False)

    def __post_init__(self):
        m = self.manifest
        self.task, self.family, self.labels = m.task, m.family, m.labels
        self.relevant = relevant_index(m, self.labels)
        self.entailment = next((i for i, label in enumerate(self.labels)
                                if label.lower().startswith("entail")), None) \
            if m.task == "classify" else None
        self.multi_label = m.multi_label
        self.prompts = m.prompts
        self.default_prompt = m.prompts.get(m.default_prompt_name or "", "")
        self.pools = m.pooling if m.token_embeddings else None
        self.per_token = m.task in PER_TOKEN and m.task != "fill-mask" or self.pools is not None
        self.sparse = m.pooling == "splade"
        self.max_length = m.max_length
        self.created = int((self.folder / MANIFEST).stat().st_mtime)
        self.batch_postprocess = batch_postprocess(self)

    @property
    def dimensions(self) -> int | None:
        """An embedding model's width."""
        return self.manifest.dimensions

    def describe(self, runs: dict, iterations: dict | None = None,
                 token_ids: str | None = None, mask_token: str | None = None) -> dict:
        """The model as /v1/models lists it: the card's facts, with where and how its runner
        runs it (``runs``: backend, device, dtype and why; CUDA graphs, int8), the
        iterations a request may ask of a recursive model, the vocabulary of token-id
        inputs, a fill-mask model's mask token."""
        info = {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "distilserve", "task": self.task, "family": self.family,
                "backend": runs["backend"], "max_length": self.max_length,
                "device": runs["device"], "dtype": runs["dtype"],
                "dtype_reason": runs["dtype_reason"]}
        for key in ("loop", "pooling", "dimensions", "parameters"):
            if getattr(self.manifest, key) is not None:
                info[key] = getattr(self.manifest, key)
        if iterations is not None:
            info["iterations"] = iterations
        if self.pools:
            info["token_embeddings"] = True
        if token_ids is not None:
            info["token_ids"] = token_ids
        if self.prompts:
            info["prompts"] = self.prompts
            info["default_prompt_name"] = self.manifest.default_prompt_name
        info.update({k: runs[k] for k in ("cuda_graph_tokens", "quantization") if k in runs})
        if self.task in ("classify", "ner"):
            info["labels"] = self.labels
        if mask_token is not None:
            info["mask_token"] = mask_token
        if self.multi_label:
            info["multi_label"] = True
        if self.entailment is not None:  # an NLI model: /v1/classify's candidate_labels
            info["zero_shot"] = True
        return info


def batch_postprocess(card: Card) -> Callable[[np.ndarray], np.ndarray] | None:
    """What every request to the model does to its outputs unless it asks otherwise, for a
    whole batch [B, X] at once: a dense embedding model's unit vectors (not with
    ``dimensions`` or ``normalize: false``), a classifier's scores (its labels' softmax or
    sigmoid, as transformers' pipeline chooses; not with ``function_to_apply``). None for
    other models."""
    if card.task == "embed" and card.pools is None and not card.sparse:
        return postprocess.normalize
    if card.task == "classify":
        return functools.partial(postprocess.label_scores, labels=card.labels,
                                 multi_label=card.multi_label)
    return None
