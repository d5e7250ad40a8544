"""The artifacts: ONNX graphs and TorchScript modules of a family's model, with dynamic
batch and sequence axes. Recursive families (MiniALBERT, F-ALBERT) unroll their loop
(traced: L copies of the ops, the shared weights stored once) or keep it (TorchScript by
scripting; ONNX with a ``Loop`` node whose trip count is the run-time input
``num_iterations``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from distilserve.models.runtime.base import INPUT_NAMES
from distilserve.models.runtime.tracing import example_inputs, quiet_tracing, trace


class _RuntimeDepth(nn.Module):
    """A recursive model whose depth is a run-time input, so that ONNX keeps a Loop."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor, num_iterations: torch.Tensor) -> torch.Tensor:
        return self.model.forward_iterations(input_ids, attention_mask, token_type_ids,
                                             int(num_iterations))


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
    with quiet_tracing():
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
