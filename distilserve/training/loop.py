"""The optimisation loop that fine-tuning (distilserve/training/finetune.py) and distillation
(distilserve/training/distill.py) share."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class Diverged(ValueError):
    """A step's loss or its gradients' norm is NaN or infinite: the training diverged.
    ``item``: the item of ``steps`` it was at; ``what``: which, with its value."""

    def __init__(self, item, what: str, message: str | None = None):
        super().__init__(message or f"{what}: the training diverged")
        self.item, self.what = item, what


def optimise(steps: Iterable, loss_of: Callable, params: list, optimizer, schedule,
             clip: float | None = None, after: Callable | None = None) -> None:
    """One optimiser step per item of ``steps``: ``loss, parts = loss_of(item)`` (parts:
    named loss terms for the record), backward, the gradient norm clipped to ``clip``,
    the optimiser's and the schedule's steps; then ``after(i, item, loss, parts)``. A
    loss, or where clipped a gradients' norm, that is not finite raises Diverged before
    its step changes any weight."""
    for i, item in enumerate(steps):
        loss, parts = loss_of(item)
        if not bool(torch.isfinite(loss)):
            raise Diverged(item, f"the loss is {loss.item()}")
        loss.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if not bool(torch.isfinite(norm)):
                raise Diverged(item, f"the gradients' norm is {norm.item()}")
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if after is not None:
            after(i, item, loss, parts)
