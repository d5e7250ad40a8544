"""Does an artifact compute what PyTorch computes? The inputs it is checked at (shapes
other than the export example, padding, real sentences), the checks of the artifact and of
fp16 / bf16 against fp32, and how far an approximate artifact (int8) is."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from distilserve.models import samples
from distilserve.models.runtime.base import INPUT_NAMES
from distilserve.models.tasks import PAIRED

# largest difference allowed, relative to the output's largest magnitude when that is
# over 1 (CMOW's matrix products reach 1e3-1e16 on long inputs; fp32 keeps ~7 digits)
TOLERANCE = 1e-4
# fp16 / bf16 against fp32 (PyTorch, the same inputs): embeddings' cosine at least this;
# classification and NER labels equal on the sample sentences
DTYPE_MIN_COSINE = 0.999


def parity_inputs(tokenizer, max_length: int, task: str) -> list[dict[str, np.ndarray]]:
    """Batches of shapes other than the export example, with padding, and real text."""
    def random(batch: int, length: int, pad: bool, seed: int) -> dict[str, np.ndarray]:
        g = np.random.default_rng(seed)
        ids = g.integers(1000, 30000, (batch, length), dtype=np.int64)
        mask = np.ones_like(ids)
        if pad and batch > 1:
            mask[1, length // 3:] = 0
            ids[1, length // 3:] = 0
        types = np.zeros_like(ids)
        if task in PAIRED and length > 4:
            types[0, length // 2:] = 1  # a text pair in the first row
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    batches = [random(1, 5, False, 1), random(3, 17, True, 2),
               random(3, max(6, max_length - 3), True, 3)]
    enc = tokenizer(samples.SENTENCES[:12], padding=True, truncation=True,
                    max_length=max_length, return_tensors="np")
    batches.append({k: enc[k].astype(np.int64) for k in INPUT_NAMES})
    return batches


def reference(model: nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """PyTorch's output for a batch."""
    with torch.no_grad():
        return model(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES)).numpy()


def compare(model: nn.Module, backend, batches: list[dict[str, np.ndarray]]) -> tuple[
        dict, list[np.ndarray]]:
    """The artifact (through its runtime backend) against PyTorch at every batch: the
    largest difference, also relative to the output's scale, and PyTorch's outputs (the
    references the later checks reuse). An input whose outputs in PyTorch hold NaN or
    infinity (CMOW's products past float32's range, on a long input) is left out of the
    comparison, as the service refuses it. Raises ValueError on a shape mismatch, on the
    artifact's outputs not finite where PyTorch's are, and where no input is left."""
    worst, worst_scaled, shapes, references, compared = 0.0, 0.0, [], [], 0
    for inputs in batches:
        shape = tuple(inputs["input_ids"].shape)
        ref = reference(model, inputs)
        references.append(ref)
        got = backend.run(inputs)
        if got.shape != ref.shape:
            raise ValueError(f"{backend.name} output shape {got.shape} != PyTorch {ref.shape} "
                             f"for inputs {shape}")
        finite = np.isfinite(ref).reshape(len(ref), -1).all(1)  # [B]: the inputs compared
        if not np.isfinite(got[finite]).all():
            raise ValueError(f"{backend.name} outputs hold NaN or infinity at inputs of shape "
                             f"{shape}, where PyTorch's are finite")
        compared += int(finite.sum())
        if finite.any():
            diff = float(np.abs(got[finite] - ref[finite]).max())
            worst = max(worst, diff)
            worst_scaled = max(worst_scaled, diff / max(1.0, float(np.abs(ref[finite]).max())))
        shapes.append(list(shape))
    if not compared:
        raise ValueError("PyTorch's own outputs hold NaN or infinity at every sample input: "
                         f"nothing to check the {backend.name} artifact against")
    return {"max_abs_diff": worst, "max_scaled_diff": worst_scaled, "tolerance": TOLERANCE,
            "shapes": shapes}, references


def agreement(task: str, reference: np.ndarray, other: np.ndarray, mask: np.ndarray) -> dict:
    """How far an approximate artifact (int8) is from the exact one: embeddings' cosines,
    or how often the labels agree; per token (NER, token embeddings), the real tokens';
    question answering: how often the best start and the best end agree."""
    if task == "qa":  # [B, T, 2]: over the real tokens
        masked = [np.where(mask[:, :, None].astype(bool), x, -np.inf) for x in (reference,
                                                                               other)]
        same = masked[0].argmax(1) == masked[1].argmax(1)  # [B, 2]
        return {"argmax_agreement": float(same.mean())}
    if reference.ndim == 3:  # [B, T, X]: the real tokens' rows, [N, X]
        real = mask.astype(bool)
        reference, other = reference[real], other[real]
    if task in ("embed", "fill-mask"):  # vectors (fill-mask's: before its decoder)
        a = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
        b = other / np.linalg.norm(other, axis=-1, keepdims=True)
        cos = (a * b).sum(-1)
        return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    same = reference.argmax(-1) == other.argmax(-1)
    return {"argmax_agreement": float(same.mean())}


class Fp16LinearsInFp32(TorchFunctionMode):
    """Computes fp16 linear layers as a GPU's fp16 GEMM does: the fp16 values multiplied
    and summed in fp32, the result rounded to fp16 once. The same numbers as torch's own
    fp16 GEMM on the CPU up to the order of the sums, without its cost on a CPU that has no
    fp16 matrix instructions."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.linear or args[0].dtype != torch.float16:
            return func(*args, **kwargs)
        up = lambda t: t.float() if isinstance(t, torch.Tensor) else t  # noqa: E731
        return func(*map(up, args), **{k: up(v) for k, v in kwargs.items()}).half()


def dtype_parity(model: nn.Module, task: str, dtypes, batches: list[dict[str, np.ndarray]],
                 references: list[np.ndarray]) -> dict[str, dict]:
    """How each half-precision dtype the family runs in compares with fp32, in PyTorch on
    the CPU (torch runs fp16 and bf16 there; fp16's linear layers as a GPU computes them,
    ``Fp16LinearsInFp32``), at the parity batches. Embeddings: the
    lowest cosine over every batch; classify / ner: argmax agreement on the sample
    sentences (the last batch; NER on its real tokens). A dtype that fails is recorded,
    and the service will not run the model in it."""
    from distilserve.models.runtime.torch_device import TORCH_DTYPES

    out = {}
    for name in dtypes:
        if name == "fp32":
            continue
        half = copy.deepcopy(model).to(TORCH_DTYPES[name])
        with torch.no_grad(), Fp16LinearsInFp32():
            got = [half(*(torch.from_numpy(b[k]) for k in INPUT_NAMES)).float().numpy()
                   for b in batches]
        del half
        if task in ("embed", "fill-mask"):
            cos = min(agreement(task, r, g, b["attention_mask"])["min_cosine"]
                      for r, g, b in zip(references, got, batches))
            result = {"min_cosine": cos, "passed": bool(cos >= DTYPE_MIN_COSINE),
                      "tolerance": f"min cosine vs fp32 >= {DTYPE_MIN_COSINE}"}
        else:
            same = agreement(task, references[-1], got[-1],
                             batches[-1]["attention_mask"])["argmax_agreement"]
            result = {"argmax_agreement": same, "passed": same == 1.0,
                      "tolerance": "labels equal to fp32's on the sample sentences"}
        scale = max(1.0, max(float(np.abs(r).max()) for r in references))
        result["max_scaled_diff"] = max(float(np.abs(g - r).max())
                                        for r, g in zip(references, got)) / scale
        out[name] = result
    return out
