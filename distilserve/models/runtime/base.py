"""The interface every runtime backend implements, and how a backend is chosen.

A backend runs one model on one device in one compute dtype: int64 arrays [B, T] in,
the task's output as float32 out, whatever it computed in ([B, D] embeddings or, exported
with --token-embeddings, [B, T, D] token vectors; [B, C] or [B, T, C] logits).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from distilserve.models.runtime.matrix_units import KNOWN, bf16_units

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
DTYPES = ("fp32", "fp16", "bf16")
DEVICES_HELP = "cpu, cuda, cuda:N or auto"


class BackendError(Exception):
    """A device or dtype that this backend cannot give; the message says why."""


class Backend(ABC):
    """Runs one model: int64 arrays [B, T] by name (input_ids, attention_mask,
    token_type_ids) in, the task's output array (float32) out. A recursive model whose
    depth may vary (``depth``) also takes ``num_iterations``, an int64 scalar: the times
    its shared layer runs for that batch (1 to ``depth``; absent: ``depth``)."""

    name: str = ""
    device: str = "cpu"  # where it runs: cpu, cuda:0, ...
    dtype: str = "fp32"  # what it computes in
    dtype_reason: str = ""  # why that dtype (choose_dtype)
    asynchronous: bool = False  # launch returns before the work is done (a GPU)
    # it computes on the CPU through PyTorch's thread pool (OpenMP), which keeps a team of
    # threads for each thread that calls it (the service runs all such models on one)
    openmp: bool = False
    # a recursive model's trained depth, where a batch may run it fewer times (its loop
    # kept: ONNX's Loop, scripted TorchScript, the checkpoint itself); None: fixed
    depth: int | None = None

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...

    def launch(self, inputs: dict[str, np.ndarray]) -> Any:
        """Starts a batch; ``collect`` of what it returns gives the outputs. An
        asynchronous backend returns at once, so the caller can prepare the next batch
        while the device works; a caller has at most two batches started and not yet
        collected (the GPU backends stage inputs in two buffers, in turn)."""
        return self.run(inputs)

    def collect(self, launched: Any) -> np.ndarray:
        return launched

    def batch_width(self, tokens: int) -> int:
        """The length a batch whose longest input has ``tokens`` tokens runs at: ``tokens``,
        or more where this backend rounds its batches' lengths up."""
        return tokens

    def use_graphs(self, shapes: Sequence[tuple[int, int]], max_tokens: int | None = None) -> bool:
        """Runs the batches that fit one of ``shapes`` [B, T] of at most ``max_tokens``
        B x T (padded up to it) from CUDA graphs, each captured at its first batch; False
        where this backend cannot (it is not a PyTorch backend on a GPU), and nothing
        changes."""
        return False


def check_device(device: str) -> str:
    """``device`` if it is one of cpu, cuda, cuda:N, auto; else BackendError."""
    kind, _, index = device.partition(":")
    if kind in ("cpu", "auto") and not index or kind == "cuda" and (not index or index.isdigit()):
        return device
    raise BackendError(f"unknown device {device!r} ({DEVICES_HELP})")


def choose_dtype(requested: str, device: str, allowed: Sequence[str],
                 cpu_bf16: bool = True) -> tuple[str, str]:
    """The compute dtype and why: ``auto`` is, on a GPU, the first of fp16, bf16 that the
    model allows, and on the CPU bf16 where the processor has bf16 matrix units
    (distilserve/models/runtime/matrix_units.py), the model allows it and its family gains from it
    (``cpu_bf16``: Family.cpu_bf16); fp32 otherwise. An explicit dtype must be allowed."""
    if requested == "auto":
        if device != "cpu":
            chosen = next((d for d in ("fp16", "bf16") if d in allowed), None)
            if chosen is None:
                return "fp32", "auto: fp32 on a GPU, the model runs in neither fp16 nor bf16"
            return chosen, f"auto: {chosen}, the first of fp16, bf16 that the model allows on a GPU"
        units = bf16_units()
        if units is None:
            return "fp32", f"auto: fp32, this CPU has no bf16 matrix units ({KNOWN})"
        if not cpu_bf16:
            return "fp32", (f"auto: fp32; this CPU's {units} would run bf16, which is "
                            "slower for this family (not large matrix products)")
        if "bf16" not in allowed:
            return "fp32", (f"auto: fp32; this CPU's {units} would run bf16, which the "
                            f"model does not ({', '.join(allowed)}: its family's, less "
                            "those its export's parity check failed)")
        return "bf16", f"auto: bf16, on this CPU's {units}"
    if requested not in DTYPES:
        raise BackendError(f"unknown dtype {requested!r} (auto, {', '.join(DTYPES)})")
    if requested not in allowed:
        raise BackendError(f"dtype {requested} is not one this model runs in "
                           f"({', '.join(allowed)})")
    return requested, "asked for (DISTILSERVE_DTYPE, or the model's manifest)"
