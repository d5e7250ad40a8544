"""Bidirectional CMOW/CBOW-Hybrid ("Cross-Architecture Distillation Using Bidirectional CMOW
Embeddings", an ICLR 2022 submission on OpenReview): matrix embeddings, no attention at all.

Each token j has a forward matrix X_j (d x d, d = ``root_mat_size`` = 20), a backward
matrix Y_j (d x d) and a vector x_j (``embedding_size`` = 400 = d * d):

    cbow    = x_1 + ... + x_n                                   [B, 400]
    cmow_fw = X_1 X_2 ... X_n                                   [B, 20, 20]
    cmow_bw = Y_n ... Y_2 Y_1                                   [B, 20, 20]
    pooled  = cbow || flatten(cmow_fw) || flatten(cmow_bw)      [B, 1200]

Per token t (token classification): prefix sum/product forward and suffix sum/product
backward, concatenated: [B, T, 1600]. Text pairs (classification) are encoded
separately, split by token type, and combined as a || b || |a - b| (DiffCat, the order of
the reference code): [B, 3600].

Two defects of the reference code are avoided: padding acts as the identity matrix and
the zero vector, so padding never changes a result; and the products over the sequence
are tree reductions with a step count fixed by ``max_position_embeddings`` (not by the
example), so a traced or exported graph is right at every length. Matrix products are
associative, so the tree equals the sequential product (``sequential_product``). The
products grow with length (norm ~1e3 at 60 tokens, ~1e16 at 250), past fp16's range: it
runs in fp32 and bf16 (its entry in distilserve/models/families.py).

A distilled student (``distilserve/training/distill.py``) keeps the learned map from its pooled
encoding to the teacher's width, ``projection`` (``projection_size`` > 0): its embeddings
are then ``projection(pooled)`` [B, 384], in the teacher's space; the reference code has
no such layer.

Key names are the reference seq2mat code's: ``transformer.embeddings.matrix_embedding.
embedding.weight``, ``transformer.embeddings.backward_matrix_embedding.embedding.weight``,
``transformer.embeddings.vector_embedding.weight`` (each [vocab, 400]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class CmowConfig:
    vocab_size: int = 30522
    root_mat_size: int = 20  # d: matrices are d x d
    embedding_size: int = 400  # the CBOW vector; d * d in the hybrid
    bidirectional: bool = True
    mode: str = "hybrid"
    max_position_embeddings: int = 512  # longest sequence; sets the tree's step count
    initializer_range: float = 0.1  # matrices start at I + N(0, range^2)
    projection_size: int = 0  # > 0: embeddings are the pooled encoding mapped to this width
    model_type: str = "seq2mat"

    def __post_init__(self):
        if self.mode != "hybrid" or not self.bidirectional:
            raise ValueError("only the bidirectional CMOW/CBOW-Hybrid is implemented "
                             f"(got mode={self.mode!r}, bidirectional={self.bidirectional})")

    @property
    def pooled_size(self) -> int:
        return self.embedding_size + 2 * self.root_mat_size ** 2

    @property
    def token_size(self) -> int:
        return 2 * (self.embedding_size + self.root_mat_size ** 2)


PRESETS = {
    "cmow-hybrid-bidi": dict(),
    "tiny": dict(root_mat_size=4, embedding_size=16, max_position_embeddings=128),
}


def tree_product(x: torch.Tensor, steps: int, eye: torch.Tensor) -> torch.Tensor:
    """x_1 @ x_2 @ ... @ x_n in ``steps`` rounds of pairwise products: [B, n, d, d] ->
    [B, d, d]. Each round appends an identity (an odd tail pairs with it) and multiplies
    neighbours; n <= 2**steps. The round count does not depend on n. ``eye`` is the d x d
    identity on x's device and dtype."""
    identity = torch.zeros_like(x[:, :1]) + eye  # [B, 1, d, d]
    for _ in range(steps):
        x = torch.cat([x, identity], 1)  # [B, n+1, d, d]
        pairs = x.shape[1] // 2  # ceil(n / 2)
        x = x[:, 0:2 * pairs:2] @ x[:, 1:2 * pairs:2]  # [B, ceil(n/2), d, d]
    return x[:, 0]


def prefix_products(x: torch.Tensor, steps: int, eye: torch.Tensor) -> torch.Tensor:
    """P_t = x_1 @ ... @ x_t for every t (a Hillis-Steele scan): [B, n, d, d] -> same."""
    identity = torch.zeros_like(x[:, :1]) + eye  # [B, 1, d, d]
    n = x.shape[1]
    shift = 1
    for _ in range(steps):
        before = torch.cat([identity.expand(-1, shift, -1, -1), x], 1)[:, :n]  # P_{t-shift}
        x = before @ x
        shift *= 2
    return x


def sequential_product(x: torch.Tensor) -> torch.Tensor:
    """The reference: x_1 @ x_2 @ ... @ x_n one step at a time. [B, n, d, d] -> [B, d, d]."""
    out = x[:, 0]
    for t in range(1, x.shape[1]):
        out = out @ x[:, t]
    return out


class MatrixEmbedding(nn.Module):
    """A [vocab, d*d] table read as d x d matrices (the reference's key layout)."""

    def __init__(self, vocab_size: int, d: int, std: float):
        super().__init__()
        self.d = d
        self.embedding = nn.Embedding(vocab_size, d * d)
        # the identity, moved and cast with the model (not in checkpoints); torch.eye in
        # forward would be traced with the device it was traced on
        self.register_buffer("eye", torch.eye(d), persistent=False)
        with torch.no_grad():  # identity + noise, so long products neither vanish nor explode
            self.embedding.weight.normal_(0.0, std).add_(torch.eye(d).flatten())

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids [B, T], mask [B, T] -> [B, T, d, d], the identity where mask is 0."""
        b, t = input_ids.shape
        m = self.embedding(input_ids).view(b, t, self.d, self.d)
        keep = mask.to(m.dtype)[:, :, None, None]
        return m * keep + self.eye * (1.0 - keep)


class _Embeddings(nn.Module):
    def __init__(self, c: CmowConfig):
        super().__init__()
        self.matrix_embedding = MatrixEmbedding(c.vocab_size, c.root_mat_size,
                                                c.initializer_range)
        self.backward_matrix_embedding = MatrixEmbedding(c.vocab_size, c.root_mat_size,
                                                         c.initializer_range)
        self.vector_embedding = nn.Embedding(c.vocab_size, c.embedding_size)
        nn.init.normal_(self.vector_embedding.weight, 0.0, c.initializer_range)


class _Transformer(nn.Module):
    """Named after the reference's key prefix; there is no attention in it."""

    def __init__(self, c: CmowConfig):
        super().__init__()
        self.embeddings = _Embeddings(c)


class Cmow(nn.Module):
    """Bidirectional CMOW/CBOW-Hybrid with one task output (see distilserve/models/heads.py)."""

    def __init__(self, config: CmowConfig, task: str = "embed", num_labels: int = 0):
        super().__init__()
        self.config = config
        self.task = task
        self.steps = math.ceil(math.log2(config.max_position_embeddings))
        self.transformer = _Transformer(config)
        self.projection = (nn.Linear(config.pooled_size, config.projection_size)
                           if config.projection_size else nn.Identity())
        features = {"embed": 0, "classify": 3 * config.pooled_size, "ner": config.token_size}
        self.classifier = (nn.Linear(features[task], num_labels) if task != "embed"
                           else nn.Identity())

    def encode(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The pooled encoding of the tokens where mask is 1: [B, T] -> [B, 1200]."""
        e = self.transformer.embeddings
        vectors = e.vector_embedding(input_ids)  # [B, T, 400]
        cbow = (vectors * mask.to(vectors.dtype)[:, :, None]).sum(1)  # [B, 400]
        eye = e.matrix_embedding.eye
        fw = tree_product(e.matrix_embedding(input_ids, mask), self.steps, eye)  # [B, d, d]
        bw = tree_product(e.backward_matrix_embedding(input_ids, mask).flip(1), self.steps, eye)
        return torch.cat([cbow, fw.flatten(1), bw.flatten(1)], 1)

    def encode_tokens(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token encodings, prefix forward and suffix backward: [B, T] -> [B, T, 1600]."""
        e = self.transformer.embeddings
        vectors = e.vector_embedding(input_ids)
        vectors = vectors * mask.to(vectors.dtype)[:, :, None]  # [B, T, 400]
        eye = e.matrix_embedding.eye
        fw = prefix_products(e.matrix_embedding(input_ids, mask), self.steps, eye)  # [B,T,d,d]
        bw = prefix_products(e.backward_matrix_embedding(input_ids, mask).flip(1),
                             self.steps, eye).flip(1)  # Y_n ... Y_t at t
        cbow_fw = vectors.cumsum(1)
        cbow_bw = vectors.flip(1).cumsum(1).flip(1)
        return torch.cat([cbow_fw, fw.flatten(2), cbow_bw, bw.flatten(2)], 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        if self.task == "embed":
            return self.projection(self.encode(input_ids, attention_mask))  # [B, 1200 or P]
        if self.task == "classify":  # DiffCat of the two segments (b is empty for one text)
            first = attention_mask * (token_type_ids == 0).to(attention_mask.dtype)
            a = self.encode(input_ids, first)
            b = self.encode(input_ids, attention_mask * token_type_ids)
            return self.classifier(torch.cat([a, b, (a - b).abs()], 1))  # [B, C]
        return self.classifier(self.encode_tokens(input_ids, attention_mask))  # [B, T, C]


