"""How a model folder's backend is chosen and opened: the artifact's own, or, where ONNX
Runtime cannot run it as asked (a GPU without onnxruntime-gpu; fp16 or bf16 on the CPU),
its folder's checkpoint traced with TorchScript."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from distilserve.models.runtime.base import DTYPES, Backend, BackendError, check_device, choose_dtype

log = logging.getLogger("distilserve")


def open_backend(kind: str, folder: str | Path, artifact: str | None, threads: int = 0,
                 num_iterations: int | None = None, device: str = "cpu", dtype: str = "fp32",
                 allowed: Sequence[str] = DTYPES, checkpoint_instead: bool = False,
                 token_embeddings: bool = False, task: str | None = None,
                 quantized: bool = False, cpu_bf16: bool = True,
                 keep_loop: bool = False) -> Backend:
    """``kind`` is the manifest's backend: onnx, torchscript or torch. ``device`` and
    ``dtype`` may be ``auto``; ``allowed`` are the dtypes the model may run in (its
    family's, less those that failed the export's parity check); ``token_embeddings``: an
    embedding model exported to give its token vectors, and ``task``: the manifest's (a
    checkpoint run in its place, or traced at load, gives what the artifact gives: a
    masked-language model's checkpoint loaded without its task is an embedding model);
    ``cpu_bf16``: whether auto may choose bf16 on a CPU (its family's ``cpu_bf16``).

    With ``checkpoint_instead`` (the service), an ONNX model runs as asked where ONNX
    Runtime cannot run it so: from its folder's checkpoint, traced with TorchScript at
    load. That is on a GPU (cuda, or auto with one visible) where this onnxruntime has no
    CUDA execution provider, and on the CPU in fp16 or bf16 (ONNX Runtime computes in
    fp32), as ``auto`` chooses on a CPU with bf16 matrix units; not for an int8 artifact
    (``quantized``), which ONNX Runtime serves as exported. A recursive model exported with
    its loop kept (``keep_loop``) is scripted, its loop kept, rather than traced. Where
    ``auto`` asked for it and the checkpoint does not run (or torch is not installed), ONNX
    Runtime on the CPU in fp32."""
    folder = Path(folder)
    check_device(device)
    if kind == "onnx":
        from distilserve.models.runtime.onnx import FP32, OnnxBackend, has_cuda_provider

        failed = None
        if checkpoint_instead and _wants_gpu(device):
            if not has_cuda_provider():
                backend, failed = _checkpoint_instead(folder, threads, device, dtype, allowed,
                                                      token_embeddings, task, cpu_bf16,
                                                      NO_CUDA_PROVIDER, keep_loop)
                if backend is not None:
                    return backend
                device = "cpu"  # auto, and the checkpoint did not run on the GPU
        elif (checkpoint_instead and not quantized
              and choose_dtype(dtype, "cpu", allowed, cpu_bf16)[0] != "fp32"):
            backend, failed = _checkpoint_instead(folder, threads, "cpu", dtype, allowed,
                                                  token_embeddings, task, cpu_bf16, FP32,
                                                  keep_loop)
            if backend is not None:
                return backend
        onnx = OnnxBackend(folder / artifact, threads, num_iterations, device, dtype)
        if failed:  # (the log has the whole error, which may name server paths)
            onnx.dtype_reason = f"{FP32}: its checkpoint, run instead, did not ({failed}; logged)"
        return onnx
    if kind == "torchscript":
        from distilserve.models.runtime.torchscript import TorchScriptBackend

        return TorchScriptBackend(folder / artifact, threads, device, dtype, allowed,
                                  token_embeddings, task, cpu_bf16)
    if kind == "torch":
        from distilserve.models.runtime.torch import TorchBackend

        return TorchBackend(folder / (artifact or "checkpoint"), threads, device, dtype, allowed,
                            token_embeddings, task, cpu_bf16)
    raise ValueError(f"unknown backend {kind!r} (onnx, torchscript, torch)")


# the device files a GPU's driver makes (NVIDIA's; WSL's; AMD's, ROCm's torch.cuda)
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _wants_gpu(device: str) -> bool:
    if device == "auto":
        if sys.platform == "linux" and not any(map(os.path.exists, GPU_DEVICE_FILES)):
            return False  # no driver for torch to find a GPU with: torch is not imported
        import torch  # (its import: a second or more, and ~150 MB)

        return torch.cuda.is_available()
    return device.startswith("cuda")


NO_CUDA_PROVIDER = ("this onnxruntime has no CUDA execution provider (pip install "
                    "'distilserve[gpu]' for onnxruntime-gpu)")


def _checkpoint_instead(folder: Path, threads: int, device: str, dtype: str,
                        allowed: Sequence[str], token_embeddings: bool, task: str | None,
                        cpu_bf16: bool, why: str,
                        keep_loop: bool = False) -> tuple[Backend | None, str | None]:
    """An ONNX model's checkpoint traced with TorchScript on ``device`` in ``dtype``,
    where ONNX Runtime cannot run it so (``why``). Where that fails: (None, the error's
    type, the error logged), for ONNX Runtime on the CPU in fp32, if ``auto`` asked for
    what failed (device or dtype); a BackendError if it was asked for by name (the torch
    backends' own where they refuse the device or the dtype)."""
    on_gpu = device != "cpu"
    asked, wanted = (f"device {device}", device) if on_gpu else (f"dtype {dtype}", dtype)
    try:
        from distilserve.models.runtime.torchscript import TorchScriptBackend

        backend = TorchScriptBackend(folder / "checkpoint", threads, device, dtype, allowed,
                                     token_embeddings, task, cpu_bf16, keep_loop)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        if wanted != "auto":
            if isinstance(e, BackendError):
                raise
            raise BackendError(f"{asked}: {why}, and the model's checkpoint, which would run "
                               f"{'there' if on_gpu else 'so'} instead, did not: {error}"
                               ) from None
        log.warning("%s: ONNX Runtime on the CPU in fp32, not %s: %s, and the model's "
                    "checkpoint did not run %s: %s", folder.name,
                    "on the GPU" if on_gpu else f"in {choose_dtype(dtype, device, allowed, cpu_bf16)[0]}",
                    why, "there" if on_gpu else "so", error)
        return None, type(e).__name__
    log.info("%s: an ONNX model, run on %s in %s from its checkpoint, traced with TorchScript, "
             "as %s", folder.name, backend.device, backend.dtype, why)
    return backend, None
