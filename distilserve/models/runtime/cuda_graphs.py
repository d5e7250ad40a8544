"""CUDA graphs for the PyTorch backends on a GPU (``DISTILSERVE_CUDA_GRAPH_TOKENS``).

A compact encoder's forward pass is a few hundred small kernels, and launching them costs
the CPU more time than the GPU takes to run them: a lone sentence's time is nearly all
launches (loadtests/RESULTS.md has the measurement). A CUDA graph
records a batch shape's kernels once and replays them with one launch. Its shapes are
fixed, so a batch is padded up to the smallest of the given shapes that holds it (the
engine gives the GPU warm-up's powers of two, up to a number of padded tokens: the
warm-up captures them all before traffic), the padding rows and tokens masked out as any
padding is. Large batches are left out: they keep the GPU busy longer than their
launches take, and padding them would cost arithmetic.

A graph reads its inputs from, and writes its output to, buffers of its own: a batch's
inputs are copied into its shape's input buffer, and what ``run`` returns is a view of
the output buffer, overwritten by the next batch of that shape. On one CUDA stream that
next batch runs after every copy queued before it, so the copy of an output to the host
(``Placement.launch``) is taken first. The graphs share one memory pool, captured largest
first (the warm-up's order), since they never run at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

log = logging.getLogger("distilserve")

Shape = tuple[int, int]  # [B, T]


class CudaCapture:
    """Records CUDA graphs on the current GPU, all in one memory pool and from one side
    stream (the pool's memory is shared only between captures on the same stream)."""

    def __init__(self):
        self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()

    def __call__(self, run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """``run()`` recorded: (replay, its output buffer). It runs three times first
        (TorchScript profiles and compiles a new shape, cuBLAS picks its kernels: none of
        that may happen while recording). Other threads may use the GPU meanwhile (another
        model, a batch being collected): only this thread's calls are checked."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(3):
                run()
        current = torch.cuda.current_stream()
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                                  capture_error_mode="thread_local"):
                out = run()
        except Exception:
            # a failed recording raises again from torch's capture_end, which leaves the
            # side stream current (and the pool recording): the stream is put back, and
            # the caller records nothing more (Graphs)
            torch.cuda.set_stream(current)
            raise
        return graph.replay, out


class Graphs:
    """``forward`` (three int64 [B, T] tensors -> float [B, ...]) replayed from CUDA graphs
    for the batches that fit one of ``shapes`` of at most ``max_tokens`` B x T (None: any),
    each captured at its first batch. A capture that fails (a forward pass that reads a
    tensor on the host, say, or memory running out) ends the capturing: the shapes
    captured until then stay, and batches that none of them holds run without a graph."""

    def __init__(self, forward: Callable[..., torch.Tensor], shapes: Sequence[Shape],
                 capture: Callable[[Callable[[], torch.Tensor]],
                                   tuple[Callable[[], None], torch.Tensor]],
                 max_tokens: int | None = None):
        self.forward, self.capture = forward, capture
        self.shapes = sorted((s for s in shapes if max_tokens is None or s[0] * s[1] <= max_tokens),
                             key=lambda s: (s[0] * s[1], s))  # smallest first
        self.graphs: dict[Shape, tuple[torch.Tensor, Callable[[], None], torch.Tensor]] = {}

    def shape(self, batch: int, length: int) -> Shape | None:
        """The smallest of the shapes that holds a [batch, length] batch; None if none does."""
        return next((s for s in self.shapes if s[0] >= batch and s[1] >= length), None)

    def run(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """``inputs`` [3, b, t] (input ids, attention mask, token types) on the device ->
        the output of those b rows ([b, ...]; per token [b, t, ...]), or None when no graph
        takes the batch (the caller runs ``forward`` itself)."""
        b, t = inputs.shape[1:]
        shape = self.shape(b, t)
        graph = None if shape is None else self.graphs.get(shape) or self._capture(shape, inputs)
        if graph is None:
            return None
        buffer, replay, out = graph
        buffer.zero_()  # padding: token 0, masked out, in every row past b and column past t
        buffer[:, :b, :t].copy_(inputs)
        replay()
        return out[:b, :t] if out.dim() == 3 else out[:b]

    def _capture(self, shape: Shape, like: torch.Tensor):
        buffer = torch.zeros((3, *shape), dtype=like.dtype, device=like.device)  # [3, B, T]
        try:
            replay, out = self.capture(lambda: self.forward(*buffer.unbind(0)).float())
        except Exception as e:  # e.g. a model that waits for the GPU: it runs as it is
            self.shapes = [s for s in self.shapes if s in self.graphs]
            cause = e.__cause__ or e.__context__  # what failed first, within the recording
            log.warning("no CUDA graph for batches of %d x %d, nor for any shape not yet "
                        "captured (%d captured): they run without one: %s%s", *shape,
                        len(self.graphs), _line(e),
                        f" (after {_line(cause)})" if cause is not None else "")
            return None
        self.graphs[shape] = buffer, replay, out
        return self.graphs[shape]


def _line(e: BaseException) -> str:
    """An exception's type and first line (CUDA's errors go on with advice)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
