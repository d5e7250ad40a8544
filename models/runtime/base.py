"""The interface every runtime backend implements, and how a backend is chosen."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class Backend(ABC):
    """Runs one model: int64 arrays [B, T] by name (input_ids, attention_mask,
    token_type_ids) in, the task's output array out."""

    name: str = ""

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...


def open_backend(kind: str, folder: str | Path, artifact: str | None, threads: int = 0,
                 num_iterations: int | None = None) -> Backend:
    """``kind`` is the manifest's backend: onnx, torchscript or torch."""
    folder = Path(folder)
    if kind == "onnx":
        from models.runtime.onnx import OnnxBackend

        return OnnxBackend(folder / artifact, threads, num_iterations)
    if kind == "torchscript":
        from models.runtime.torchscript import TorchScriptBackend

        return TorchScriptBackend(folder / artifact, threads)
    if kind == "torch":
        from models.runtime.torch import TorchBackend

        return TorchBackend(folder / (artifact or "checkpoint"), threads)
    raise ValueError(f"unknown backend {kind!r} (onnx, torchscript, torch)")
