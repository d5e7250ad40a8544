"""A model traced with TorchScript, as the export writes it and as the TorchScript backend
traces a checkpoint again at load (in fp16 or bf16, on a GPU: the dtype is written into
a traced graph)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable

import torch
from torch import nn


def example_inputs(batch: int = 2, length: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, length), generator=g)
    return ids, torch.ones_like(ids), torch.zeros_like(ids)


def trace(model: nn.Module, device: torch.device | None = None) -> torch.jit.ScriptModule:
    """The model traced on ``example_inputs`` (on ``device``): its loop, if any, unrolled."""
    with quiet_tracing():
        return torch.jit.trace(model, tuple(t.to(device) for t in example_inputs()),
                               check_trace=False)


@contextlib.contextmanager
def quiet_tracing():
    """transformers' mask code warns, when traced, that a tensor it makes becomes a
    constant of the graph: that constant is in the dtype traced in, which is why a traced
    artifact is traced again at load in fp16 or bf16 (distilserve/models/runtime/torchscript.py). The
    warning says nothing more, so it is left out; any other warning is not. So is the log
    line of its models' ``loss_function``, which tracing reads as it reads every attribute
    ("loss_type=None ... Using the default loss: ForCausalLMLoss": no loss is computed)."""
    with leaving_out(logging.getLogger("transformers.modeling_utils"), _no_loss_type), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning,
                                module=r"transformers\.")
        yield


def _no_loss_type(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("`loss_type=")


@contextlib.contextmanager
def leaving_out(logger: logging.Logger, keep: Callable[[logging.LogRecord], bool]):
    """Within the block, the records logged to ``logger`` itself for which ``keep`` is
    false are left out (a library's line that says nothing to this project's users)."""
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
