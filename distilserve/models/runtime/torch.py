"""PyTorch eager backend: the checkpoint itself, in-process, on any device and dtype."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from distilserve.models.io import checkpoint
from distilserve.models.runtime.base import DTYPES
from distilserve.models.runtime.torch_device import TorchRuntime


class TorchBackend(TorchRuntime):
    name = "torch"

    def __init__(self, path: Path, threads: int = 0, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES, token_embeddings: bool = False,
                 task: str | None = None, cpu_bf16: bool = True):
        super().__init__(threads, device, dtype, allowed, cpu_bf16)
        model = checkpoint.load(path, task, token_embeddings=token_embeddings).model
        self.forward = model.to(self.place.device, self.place.dtype)
        self.recursive(self.forward)
