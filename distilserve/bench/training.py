"""One model's fine-tuning step measured, as the papers fine-tune: forward, a
classification head's cross-entropy, backward, an AdamW step, on random token ids and
labels at a fixed batch and length. Run by ``distilserve.bench.worker`` in a process of
its own (``"mode": "training"``). fp16 and bf16 are mixed precision, as fine-tuning runs
them (Hugging Face's Trainer with ``fp16``/``bf16``): the forward pass under
``torch.autocast``, the weights, gradients and AdamW state in fp32, and fp16's loss scaled
by a ``GradScaler``.

Memory is told apart: the parameters' own bytes (gradients take as many, AdamW's state
twice as many), the activations the backward pass keeps (the bytes of the tensors saved
for it, counted once each, parameters left out: the part that shrinks with fewer layer
reuses), and the step's peak: on a GPU ``torch.cuda.max_memory_allocated`` over the
loaded model, on the CPU the growth of the process's peak resident memory over what it
held once the model was loaded (the kernel's peak reset there, ``/proc/self/clear_refs``).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from distilserve.bench.memory import peak_rss_mb, status_mb

LABELS = ["a", "b"]


def _reset_peak_rss() -> bool:
    """Resets this process's peak resident memory (VmHWM) to what it holds now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def saved_for_backward_bytes(model, inputs: tuple, labels: torch.Tensor,
                             autocast=None) -> int:
    """The bytes of the tensors one forward pass keeps for its backward pass (each storage
    once; the parameters, which are kept whatever the depth, left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            autocast or contextlib.nullcontext():
        loss = F.cross_entropy(model(*inputs), labels)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def measure(spec: dict) -> dict:
    from distilserve.models.io import checkpoint
    from distilserve.models.runtime.torch_device import TORCH_DTYPES, resolve_device

    device = resolve_device(spec.get("device", "cpu"))
    dtype = TORCH_DTYPES[spec.get("dtype", "fp32")]
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    model, _, _ = checkpoint.fresh_model(spec["family"], spec["preset"], "classify", LABELS,
                                         overrides=spec.get("overrides") or {})
    model = model.to(device).train()
    parameters = sum(p.numel() for p in model.parameters())
    parameter_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    size, length = spec["batch_size"], spec["length"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (size, length), generator=g).to(device)
    inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    labels = torch.randint(0, len(LABELS), (size,), generator=g).to(device)

    mixed = dtype != torch.float32
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=mixed)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(*inputs), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.synchronize(device)
        loaded_mb = torch.cuda.memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    else:  # the peak reset first: what is resident after it is at most the peak from then
        reset = _reset_peak_rss()
        loaded_mb = status_mb("VmRSS") or 0.0
    step()  # the first: AdamW's state is made, kernels chosen
    times = []
    for _ in range(spec["steps"]):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    if gpu:
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mb = peak_rss_mb() if reset else float("nan")
    activations_mb = saved_for_backward_bytes(model, inputs, labels, autocast()) / 2**20
    seconds = statistics.median(times)
    return {"mode": "training", "sentences_per_s": size / seconds,
            "sentences_per_s_min": size / max(times), "sentences_per_s_max": size / min(times),
            "step_ms": seconds * 1000, "parameters": parameters,
            "reuses": getattr(model, "num_iterations", None),
            "parameter_mb": parameter_mb, "activations_mb": activations_mb,
            "loaded_mb": loaded_mb, "peak_memory_mb": peak_mb, "mixed_precision": mixed,
            "step_memory_mb": peak_mb - loaded_mb,
            "memory": ("torch.cuda.max_memory_allocated over the loaded model" if gpu else
                       "peak RSS growth over the loaded model"),
            **({"gpu": torch.cuda.get_device_name(device)} if gpu else {})}
