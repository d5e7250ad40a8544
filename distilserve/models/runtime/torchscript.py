"""TorchScript backend (traced: loop unrolled; scripted: loop kept), on any device and
dtype.

A scripted graph follows its inputs' dtypes. A traced graph has the dtype it was traced
in written into it (mask casts, the mask's lowest value): run in fp16 or bf16 on a GPU it
mixed fp32 masks into half-precision attention and gave NaN. So for fp16 / bf16 a traced
artifact is traced again at load, from the model folder's checkpoint, on the device, in
that dtype.

``path`` may also be a model folder's checkpoint folder, traced here (scripted, its loop
kept, for a recursive model exported so: ``keep_loop``): an ONNX model on a GPU where
onnxruntime has no CUDA execution provider, or in fp16 or bf16 (``open_backend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from distilserve.models.runtime.base import DTYPES
from distilserve.models.runtime.torch_device import TorchRuntime


class TorchScriptBackend(TorchRuntime):
    name = "torchscript"

    def __init__(self, path: Path, threads: int = 0, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES, token_embeddings: bool = False,
                 task: str | None = None, cpu_bf16: bool = True, keep_loop: bool = False):
        super().__init__(threads, device, dtype, allowed, cpu_bf16)
        # a checkpoint traced here gives what the artifact gives (see open_backend)
        self.token_embeddings, self.task, self.keep_loop = token_embeddings, task, keep_loop
        if path.is_dir():
            module = self._trace(path)
        else:
            module = torch.jit.load(str(path), map_location=self.place.device)
            if self.dtype != "fp32" and "prim::Loop" not in str(module.inlined_graph):
                module = self._trace(path.parent / "checkpoint")  # traced in fp32: again
        self.forward = module.to(self.place.dtype).eval()
        if "prim::Loop" in str(self.forward.inlined_graph):  # scripted: the loop kept
            self.recursive(self.forward)

    def _trace(self, folder: Path):
        """The checkpoint in ``folder`` traced on the device, in the dtype (scripted with
        ``keep_loop``)."""
        from distilserve.models.io import checkpoint
        from distilserve.models.runtime.tracing import trace

        model = checkpoint.load(folder, self.task, token_embeddings=self.token_embeddings).model
        model = model.to(self.place.device, self.place.dtype).eval()
        if self.keep_loop:
            return torch.jit.script(model)
        with torch.no_grad():
            return trace(model, self.place.device)
