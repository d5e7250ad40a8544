"""How close a student's embeddings are to its teacher's, on held-out sentences: Spearman
correlation between the two sides' cosine similarities of all sentence pairs, and top-k
nearest-neighbour overlap."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    return r


def fidelity(teacher_emb: np.ndarray, student_emb: np.ndarray, k: int = 10) -> dict:
    """Spearman between pairwise cosine similarities, and top-k neighbour overlap."""
    def cos(e):
        e = e / np.linalg.norm(e, axis=1, keepdims=True).clip(1e-12)
        return e @ e.T

    t, s = cos(teacher_emb), cos(student_emb)
    upper = np.triu_indices(len(t), 1)
    spearman = float(np.corrcoef(_ranks(t[upper]), _ranks(s[upper]))[0, 1])
    np.fill_diagonal(t, -np.inf)
    np.fill_diagonal(s, -np.inf)
    nt, ns = np.argsort(-t, 1)[:, :k], np.argsort(-s, 1)[:, :k]
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(nt, ns)]))
    return {"spearman": spearman, f"top{k}_overlap": overlap, "sentences": len(t)}


def embed_all(model: nn.Module, tokenizer, texts: list[str], max_length: int,
              depth: int | None = None) -> np.ndarray:
    """The texts' embeddings [N, D]; ``depth``: a recursive model's iterations (None: its
    own)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            enc = tokenizer(texts[i:i + 64], padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
            inputs = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            out.append((model(*inputs) if depth is None
                        else model.forward_iterations(*inputs, depth)).numpy())
    return np.concatenate(out)


def fidelity_by_depth(model: nn.Module, teacher_emb: np.ndarray, tokenizer, texts: list[str],
                      max_length: int) -> dict[str, dict]:
    """A recursive model's fidelity at each depth, 1 to its own: depth -> fidelity."""
    return {str(depth): fidelity(teacher_emb, embed_all(model, tokenizer, texts, max_length,
                                                        depth))
            for depth in range(1, model.num_iterations + 1)}
