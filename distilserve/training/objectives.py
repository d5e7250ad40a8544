"""The distillation objectives the families' students learn by (distilserve/training/distill.py
says which family uses which): tensors in, a scalar loss out."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from distilserve.models import heads


def same_heads(student: torch.Tensor, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention maps [B, H, T, T] comparable head by head; with different head counts,
    each side's map averaged over its heads ([B, 1, T, T]: still a distribution per row)."""
    if student.shape[1] == teacher.shape[1]:
        return student, teacher
    return student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)


def attention_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per query row, averaged over heads and real query tokens."""
    student, teacher = same_heads(student, teacher)
    kl = (teacher * (teacher.clamp_min(1e-12).log() - student.clamp_min(1e-12).log())).sum(-1)
    rows = mask[:, None, :].to(kl.dtype).expand_as(kl)  # [B, H, T]
    return (kl * rows).sum() / rows.sum()


def hidden_cosine(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - cosine of hidden states, averaged over real tokens."""
    cos = F.cosine_similarity(student, teacher, dim=-1)
    m = mask.to(cos.dtype)
    return ((1 - cos) * m).sum() / m.sum()


def output_cosine(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - cosine of the mean-pooled last hidden states (the served embeddings), averaged
    over the batch: the sentence-level output loss that stands in for the MLM output."""
    return (1 - F.cosine_similarity(heads.mean_pool(student, mask),
                                    heads.mean_pool(teacher, mask), dim=-1)).mean()


def relational(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MSE between the token cosine-similarity matrices (F-ALBERT's relational knowledge)."""
    def sims(h):
        h = F.normalize(h, dim=-1)
        return h @ h.transpose(1, 2)  # [B, T, T]

    pair = (mask[:, :, None] * mask[:, None, :]).to(student.dtype)
    return (((sims(student) - sims(teacher)) ** 2) * pair).sum() / pair.sum()
