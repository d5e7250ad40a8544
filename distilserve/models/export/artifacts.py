"""The artifacts: ONNX graphs and TorchScript modules of a family's model, with dynamic
batch and sequence axes. Recursive families (MiniALBERT, F-ALBERT) unroll their loop
(traced: L copies of the ops, the shared weights stored once) or keep it (TorchScript by
scripting; ONNX with a ``Loop`` node whose trip count is the run-time input
``num_iterations``)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from distilserve.models.runtime.base import INPUT_NAMES


class _RuntimeDepth(nn.Module):
    """A recursive model whose depth is a run-time input, so that ONNX keeps a Loop."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor, num_iterations: torch.Tensor) -> torch.Tensor:
        return self.model.forward_iterations(input_ids, attention_mask, token_type_ids,
                                             int(num_iterations))


def example_inputs(batch: int = 2, length: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, length), generator=g)
    return ids, torch.ones_like(ids), torch.zeros_like(ids)


def trace(model: nn.Module, device: torch.device | None = None) -> torch.jit.ScriptModule:
    """The model traced on ``example_inputs`` (on ``device``): its loop, if any, unrolled."""
    with _tracing():
        return torch.jit.trace(model, tuple(t.to(device) for t in example_inputs()),
                               check_trace=False)


@contextlib.contextmanager
def _tracing():
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


def to_onnx(model: nn.Module, path: Path, loop: str = "unroll", per_token: bool = False) -> None:
    """Writes an ONNX graph with dynamic batch and sequence axes (the output's too where
    it has one, ``per_token``: NER logits, token embeddings)."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes["output"] = {0: "batch", 1: "sequence"} if per_token else {0: "batch"}
    args = example_inputs()
    names = list(INPUT_NAMES)
    if loop == "keep":
        model = torch.jit.script(_RuntimeDepth(model))
        args = (*args, torch.tensor(2))
        names.append("num_iterations")
    with _tracing():
        torch.onnx.export(model, args, str(path), input_names=names, output_names=["output"],
                          dynamic_axes=axes, opset_version=17, dynamo=False,
                          do_constant_folding=True)


def to_torchscript(model: nn.Module, path: Path, loop: str = "unroll") -> None:
    """Traced (the loop unrolled) or scripted (the loop kept) TorchScript."""
    if loop == "keep":
        module = torch.jit.script(model)
    else:
        module = trace(model)
    torch.jit.save(module, str(path))
