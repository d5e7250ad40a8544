"""PyTorch eager backend: the checkpoint itself, in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models import checkpoint
from models.runtime.base import INPUT_NAMES, Backend


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, path: Path, threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.model = checkpoint.load(path).model

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return self.model(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES)).numpy()
