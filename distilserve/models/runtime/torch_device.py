"""What the two PyTorch backends share: placing a model on a device in a dtype, moving a
batch there and its output back, without waiting for the GPU until the output is wanted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distilserve.models.runtime.base import DTYPES, INPUT_NAMES, Backend, BackendError, choose_dtype
from distilserve.models.runtime.cuda_graphs import CudaCapture, Graphs

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """cpu, cuda, cuda:N or auto (a GPU when one is visible) -> a torch device, or a
    BackendError when a GPU is asked for and none is visible."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendError(f"device {device} asked for, but no GPU is visible to "
                               "PyTorch (torch.cuda.is_available() is False)")
        d = torch.device(device)
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise BackendError(f"device {device} asked for, but only "
                               f"{torch.cuda.device_count()} GPU(s) are visible")
        return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    return torch.device("cpu")


class Placement:
    """A device and dtype. On a GPU: inputs go through two pinned staging buffers, used in
    turn (a batch is prepared while the one before it may still be copying; a buffer is
    used again only once its batch is collected: Backend.launch), in one non-blocking
    copy per batch; the batch runs from a CUDA graph where ``graphs`` has one for it
    (distilserve/models/runtime/cuda_graphs.py); outputs come back by a non-blocking copy and an
    event, so that nothing waits for the GPU until the outputs are wanted."""

    def __init__(self, device: str, dtype: str, allowed: Sequence[str], cpu_bf16: bool = True):
        self.device = resolve_device(device)
        self.dtype_name, self.dtype_reason = choose_dtype(dtype, self.device.type, allowed,
                                                          cpu_bf16)
        self.dtype = TORCH_DTYPES[self.dtype_name]
        self.cuda = self.device.type == "cuda"
        self.staging = [torch.empty(0, dtype=torch.int64)] * 2
        self.turn = 0
        self.graphs: Graphs | None = None

    def inputs(self, arrays: dict[str, np.ndarray]) -> torch.Tensor:
        """The three int64 [B, T] arrays as one [3, B, T] tensor on the GPU."""
        shape = arrays["input_ids"].shape
        n = 3 * arrays["input_ids"].size
        self.turn ^= 1
        if self.staging[self.turn].numel() < n:  # grows to the largest batch, then stays
            self.staging[self.turn] = torch.empty(
                max(n, 2 * self.staging[self.turn].numel()), dtype=torch.int64).pin_memory()
        host = self.staging[self.turn][:n].view(3, *shape)
        np.stack([arrays[k] for k in INPUT_NAMES], out=host.numpy())
        return host.to(self.device, non_blocking=True)

    def launch(self, forward, arrays: dict[str, np.ndarray], graphs: bool = True):
        """Runs ``forward`` on the batch (from a CUDA graph where ``graphs`` and one holds
        it); on a GPU returns before it is done."""
        with torch.inference_mode():
            if not self.cuda:
                return forward(*(torch.from_numpy(arrays[k]) for k in INPUT_NAMES)).float().numpy()
            with torch.cuda.device(self.device):  # streams and events: the model's GPU's
                inputs = self.inputs(arrays)  # [3, B, T]
                out = self.graphs.run(inputs) if self.graphs and graphs else None
                if out is None:
                    out = forward(*inputs.unbind(0)).float()
                host = out.to("cpu", non_blocking=True)  # into pinned memory
                done = torch.cuda.Event()
                done.record()
                return host, done

    def collect(self, launched) -> np.ndarray:
        """The outputs as float32 on the host (one synchronisation per batch)."""
        if not self.cuda:
            return launched
        host, done = launched
        done.synchronize()
        return host.numpy()


def linear(weight: np.ndarray, bias: np.ndarray, device: str, dtype: str):
    """``x @ weight.T + bias`` computed on ``device`` in ``dtype`` (fp32, fp16, bf16):
    ``weight`` [V, E] and ``bias`` [V] are placed there once, and the function returned
    takes x [N, E] and gives [N, V], float32 numpy both. A fill-mask model's decoder where
    the model runs on a GPU, where a large vocabulary's product is cheap and the host's
    is not (a bert-base decoder is 94 MB of float32, read for every product)."""
    place = torch.device(device)
    w = torch.from_numpy(weight).to(place, TORCH_DTYPES[dtype])  # [V, E]
    b = torch.from_numpy(bias).to(place, TORCH_DTYPES[dtype])  # [V]

    def product(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(x)).to(place, w.dtype)  # [N, E]
            return torch.addmm(b, x, w.T).float().cpu().numpy()  # [N, V]

    return product


class TorchRuntime(Backend):
    """A PyTorch module as a backend: subclasses set ``self.forward`` (on ``self.place``'s
    device, in its dtype) and, for a recursive model whose depth may vary, ``self.depth``
    and ``self.iterate`` (its ``forward_iterations``: the inputs, then the depth)."""

    def __init__(self, threads: int = 0, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES, cpu_bf16: bool = True):
        if threads:
            torch.set_num_threads(threads)
        self.place = Placement(device, dtype, allowed, cpu_bf16)
        self.device, self.dtype = str(self.place.device), self.place.dtype_name
        self.dtype_reason = self.place.dtype_reason
        self.asynchronous = self.place.cuda
        self.openmp = not self.place.cuda
        self.forward = self.iterate = None

    def recursive(self, module) -> None:
        """Runs ``module`` at any depth up to its own where it can (a recursive model, its
        loop not unrolled: its ``forward_iterations``)."""
        if hasattr(module, "forward_iterations") and hasattr(module, "num_iterations"):
            self.depth, self.iterate = int(module.num_iterations), module.forward_iterations

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.collect(self.launch(inputs))

    def use_graphs(self, shapes: Sequence[tuple[int, int]], max_tokens: int | None = None) -> bool:
        if not self.place.cuda:
            return False
        with torch.cuda.device(self.place.device):
            self.place.graphs = Graphs(self.forward, shapes, CudaCapture(), max_tokens)
        return True

    def launch(self, inputs: dict[str, np.ndarray]):
        depth = inputs.get("num_iterations")
        if depth is None or int(depth) == self.depth:
            return self.place.launch(self.forward, inputs)
        n = int(depth)  # another depth than the one the CUDA graphs were captured at
        return self.place.launch(lambda *x: self.iterate(*x, n), inputs, graphs=False)

    def collect(self, launched) -> np.ndarray:
        return self.place.collect(launched)
