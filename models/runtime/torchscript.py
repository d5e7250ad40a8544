"""TorchScript backend (traced: loop unrolled; scripted: loop kept)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.runtime.base import INPUT_NAMES, Backend


class TorchScriptBackend(Backend):
    name = "torchscript"

    def __init__(self, path: Path, threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.module = torch.jit.load(str(path), map_location="cpu").eval()

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return self.module(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES)).numpy()
