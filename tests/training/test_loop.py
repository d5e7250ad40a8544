"""The optimisation loop that distillation and fine-tuning share."""

from __future__ import annotations

import pytest
import torch

from distilserve.training.loop import Diverged, optimise


def test_a_loss_that_is_not_finite_stops_the_loop_before_it_changes_a_weight():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    values, done = {0: 1.0, 1: 2.0, 2: float("nan"), 3: 1.0}, []

    def loss_of(item):
        return (weight * values[item]).sum(), {}

    with pytest.raises(Diverged, match="the loss is nan: the training diverged") as raised:
        optimise(range(4), loss_of, [weight], optimizer, schedule,
                 after=lambda i, item, loss, parts: done.append(item))
    assert (raised.value.item, done) == (2, [0, 1])
    assert torch.allclose(weight, torch.full((3,), 1 - 0.1 * (1.0 + 2.0)))  # two steps only


def test_gradients_whose_norm_is_not_finite_stop_the_loop_before_they_change_a_weight():
    """A finite loss (2e30) whose gradients' norm overflows float32 (1e30 each, their
    squares past its range); an infinite gradient clipped by such a norm is NaN, and so
    is each weight it steps."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    with pytest.raises(Diverged, match="^the gradients' norm is inf: the training diverged$"):
        optimise([0], lambda item: ((weight * 1e30).sum(), {}), [weight], optimizer,
                 schedule, clip=1.0)
    assert torch.equal(weight, torch.ones(2))
