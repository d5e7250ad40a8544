"""What every family puts on top of its encoder: pooling and the task output.

Tasks: ``embed`` -> sentence embedding [B, D] (or, exported with --token-embeddings,
the token vectors [B, T, D], pooled by the service; or SPLADE's sparse embedding [B, V]
from a masked-language model's logits); ``classify`` -> logits [B, C];
``ner`` -> per-token logits [B, T, C]; ``qa`` (extractive question answering, the
transformers families') -> each token's start and end logits [B, T, 2]; ``fill-mask``
(a masked-language model of the transformers families) -> each token's vector through
the language-model head up to its decoder [B, T, E]: the decoder, the projection onto
the vocabulary, runs in the service on the mask tokens' vectors alone (the [B, T, V]
logits would be 30522 numbers a token). Normalisation and softmax happen after the model,
in the server's postprocessing, so that exported graphs carry raw numbers.
"""

from __future__ import annotations

import torch
from torch import nn

from distilserve.models.tasks import LABELLED

# Hugging Face architecture suffix <-> task, for config.json's "architectures".
ARCHITECTURE_SUFFIX = {"embed": "Model", "classify": "ForSequenceClassification",
                       "ner": "ForTokenClassification", "qa": "ForQuestionAnswering",
                       "fill-mask": "ForMaskedLM"}


def task_of_architecture(name: str) -> str:
    """The task of a checkpoint whose config.json names ``name``: a masked-language model
    (``...ForMaskedLM``, as published base models are: bert-base-uncased,
    distilbert-base-uncased) is an embedding model unless exported with --task fill-mask."""
    for task, suffix in ARCHITECTURE_SUFFIX.items():
        if task not in ("embed", "fill-mask") and name.endswith(suffix):
            return task
    return "embed"


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the real tokens' vectors: [B, T, D], [B, T] -> [B, D]."""
    mask = attention_mask.to(hidden.dtype)[:, :, None]  # [B, T, 1]
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, how: str) -> torch.Tensor:
    """A sentence embedding from token vectors, [B, T, D] -> [B, D], as sentence-transformers'
    Pooling computes it over the real tokens: ``mean``; ``cls``, the first token's (the
    [CLS] token's); ``max`` of each component; ``mean_sqrt_len_tokens``, their sum over the
    square root of their count; ``weightedmean``, weighted by position (1, 2, ...). And
    ``none``: the token vectors themselves, [B, T, D] (exported with --token-embeddings)."""
    if how == "none":
        return hidden
    if how == "cls":
        return hidden[:, 0]
    if how == "mean":
        return mean_pool(hidden, attention_mask)
    mask = attention_mask.to(hidden.dtype)[:, :, None]  # [B, T, 1]
    if how == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).amax(1)
    if how == "mean_sqrt_len_tokens":
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9).sqrt()
    if how == "weightedmean":
        weights = mask.cumsum(1) * mask  # [B, T, 1]: 1, 2, ... the real tokens, 0 padding
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    # (TorchScript scripts this for a kept loop: a literal message, not POOLINGS joined)
    raise ValueError("unknown pooling " + how + " (mean, cls, max, mean_sqrt_len_tokens, "
                     "weightedmean, none)")


def splade(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """SPLADE's sparse embedding from a masked-language model's logits [B, T, V] -> [B, V]:
    the largest log(1 + relu(logit)) of each vocabulary entry over the real tokens (as
    sentence-transformers' SpladePooling, "max" and "relu"; zero where no token gives it
    a positive logit). Both functions only grow, so they apply to the largest logit
    [B, V] rather than to every one [B, T, V]: the same numbers, in fewer operations."""
    mask = attention_mask.to(logits.dtype)[:, :, None]  # [B, T, 1]
    return torch.log1p(torch.relu((logits * mask).amax(1)))


class Dense(nn.Module):
    """sentence-transformers' Dense module after the pooling: activation(linear(x)),
    [B, D] -> [B, D'] (its state dict's names: linear.weight, linear.bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, activation: str):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = getattr(nn, activation)()  # Tanh, Identity, ReLU, GELU, Sigmoid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


def default_labels(task: str, num_labels: int | None = None) -> list[str]:
    if task not in LABELLED:
        return []
    if task == "ner":
        return ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"][: num_labels or 7]
    return [f"LABEL_{i}" for i in range(num_labels or 2)]
