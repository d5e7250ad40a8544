"""TorchScript backend (traced: loop unrolled; scripted: loop kept), on any device and
dtype (the module's parameters are cast; traced graphs keep their float32 mask casts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from models.runtime.base import DTYPES
from models.runtime.torch_device import TorchRuntime


class TorchScriptBackend(TorchRuntime):
    name = "torchscript"

    def __init__(self, path: Path, threads: int = 0, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES):
        super().__init__(threads, device, dtype, allowed)
        module = torch.jit.load(str(path), map_location=self.place.device)
        self.forward = module.to(self.place.dtype).eval()
