"""The optimisation loop that fine-tuning (distilserve/training/finetune.py) and distillation
(distilserve/training/distill.py) share."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def optimise(steps: Iterable, loss_of: Callable, params: list, optimizer, schedule,
             clip: float | None = None, after: Callable | None = None) -> None:
    """One optimiser step per item of ``steps``: ``loss, parts = loss_of(item)`` (parts:
    named loss terms for the record), backward, the gradient norm clipped to ``clip``,
    the optimiser's and the schedule's steps; then ``after(i, item, loss, parts)``."""
    for i, item in enumerate(steps):
        loss, parts = loss_of(item)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if after is not None:
            after(i, item, loss, parts)
