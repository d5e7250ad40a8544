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

On the CPU a checkpoint traced here (not a scripted loop, nor an artifact run as
exported) is frozen (its weights become constants) and run with oneDNN Graph's fusion: a
matmul with the bias, activation or addition after it as one oneDNN kernel, on the CPU's
matrix units in bf16 (``FusedOnTheCpu``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from distilserve.models.runtime.base import DTYPES, BackendError
from distilserve.models.runtime.torch_device import TorchRuntime

# the memory the compiled shapes of a model fused on the CPU may take, in bytes
FUSED_BYTES = 512 << 20


class TorchScriptBackend(TorchRuntime):
    name = "torchscript"

    def __init__(self, path: Path, threads: int = 0, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES, token_embeddings: bool = False,
                 task: str | None = None, cpu_bf16: bool = True, keep_loop: bool = False):
        super().__init__(threads, device, dtype, allowed, cpu_bf16)
        # a checkpoint traced here gives what the artifact gives (see open_backend)
        self.token_embeddings, self.task, self.keep_loop = token_embeddings, task, keep_loop
        fusion = None  # a traced checkpoint's (max_length, matmul weights' bytes)
        if path.is_dir():
            module, fusion = self._trace(path)
        else:
            try:
                module = torch.jit.load(str(path), map_location=self.place.device)
            except (RuntimeError, ValueError) as e:  # missing, or not TorchScript's archive
                # (torch's first sentence: the rest is advice on checkpoints in general)
                raise BackendError(f"{path.name} does not load as TorchScript: "
                                   f"{str(e).split('. ')[0]}") from None
            if self.dtype != "fp32" and "prim::Loop" not in str(module.inlined_graph):
                module, fusion = self._trace(path.parent / "checkpoint")  # traced in fp32: again
        self.forward = module.to(self.place.dtype).eval()
        if "prim::Loop" in str(self.forward.inlined_graph):  # scripted: the loop kept
            self.recursive(self.forward)
        elif fusion and not self.place.cuda and torch.backends.mkldnn.is_available():
            self.forward = FusedOnTheCpu(self.forward, *fusion)

    def batch_width(self, tokens: int) -> int:
        if isinstance(self.forward, FusedOnTheCpu):
            return self.forward.shape(1, tokens)[1]
        return tokens

    def _trace(self, folder: Path) -> tuple[torch.jit.ScriptModule, tuple[int, int] | None]:
        """The checkpoint in ``folder`` traced on the device, in the dtype (scripted with
        ``keep_loop``), and, traced, its longest input and its matmul weights' bytes."""
        from distilserve.models.io import checkpoint
        from distilserve.models.runtime.tracing import trace

        loaded = checkpoint.load(folder, self.task, token_embeddings=self.token_embeddings)
        model = loaded.model.to(self.place.device, self.place.dtype).eval()
        if self.keep_loop:
            return torch.jit.script(model), None
        weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                      if p.dim() == 2 and "embeddings." not in name)
        with torch.no_grad():
            return trace(model, self.place.device), (loaded.max_length, weights)


class FusedOnTheCpu:
    """A traced model run on the CPU with oneDNN Graph's fusion, which compiles a graph for
    one input shape: TorchScript keeps one such graph per shape in a chain that every run
    walks, so here each batch shape has a frozen copy of its own. A batch is rounded up
    (its rows to a power of two up to 8 and to a multiple of 8 past it, its tokens to a
    multiple of 16, within ``max_length``) so that few shapes occur, and its rows and
    tokens are cut back from the output. Each compiled shape keeps its own copy of the
    weights in oneDNN's layout: shapes get copies while they fit in ``budget`` bytes of
    the process's memory, and any other shape runs the frozen model without fusion.
    Fusion is a process-wide switch of TorchScript's, read when a graph is compiled: it
    is on for these copies' runs alone, as scripted loops do not run fused."""

    def __init__(self, module: torch.jit.ScriptModule, max_length: int, weight_bytes: int,
                 budget: int = FUSED_BYTES):
        self.module, self.max_length = module, max_length
        self.plain = torch.jit.freeze(module)
        # a compiled shape holds the weights in oneDNN's layout and its working memory:
        # counted as one and a half times the weights
        self.most = budget // max(1, weight_bytes * 3 // 2)
        self.fused: dict[tuple[int, int], torch.jit.ScriptModule] = {}

    def shape(self, rows: int, tokens: int) -> tuple[int, int]:
        """The shape a batch of ``rows`` x ``tokens`` runs at."""
        rows = 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8
        return rows, max(tokens, min(-(-tokens // 16) * 16, self.max_length))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        rows, tokens = inputs[0].shape  # [B, T]
        shape = self.shape(rows, tokens)
        fused = self.fused.get(shape)
        if fused is None:
            if len(self.fused) >= self.most:
                return self.plain(*inputs)
            fused = self.fused[shape] = torch.jit.freeze(self.module)
        padded = [torch.nn.functional.pad(x, (0, shape[1] - tokens, 0, shape[0] - rows))
                  for x in inputs]  # [B', T'], zeros: padding tokens, masked out
        was = torch.jit.onednn_fusion_enabled()
        torch.jit.enable_onednn_fusion(True)
        try:
            out = fused(*padded)  # [B', X] or [B', T', X]
        finally:
            torch.jit.enable_onednn_fusion(was)
        return out[:rows, :tokens] if out.dim() == 3 else out[:rows]
