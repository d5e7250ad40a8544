"""Export a checkpoint into a servable model folder and prove the artifact computes what
PyTorch computes.

    REPO/NAME/
      manifest.json     task, family, labels, max_length, pooling, backend, files,
                        parity figures, exporter versions
      checkpoint/       the checkpoint (config.json, model.safetensors, tokenizer files)
      model.onnx | model.ts | (nothing more for the torch backend)
      model.int8.onnx   with --quantize int8 (then the served artifact)

Recursive families (MiniALBERT, F-ALBERT) export their loop unrolled (traced: L copies of
the ops, the shared weights stored once) or kept (TorchScript by scripting; ONNX with a
``Loop`` node whose trip count is the run-time input ``num_iterations``). CMOW's products
are tree reductions whose step count is fixed by max_length, so one graph is right at
every length.

Everything is written into a temporary folder beside the output and moved into place only
after the parity check passed: a failed export leaves nothing servable behind.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from models import checkpoint, families, samples
from models.manifest import Manifest
from models.runtime import open_backend
from models.runtime.base import INPUT_NAMES

FORMATS = ("onnx", "torchscript", "torch")
# largest difference allowed, relative to the output's largest magnitude when that is
# over 1 (CMOW's matrix products reach 1e3-1e16 on long inputs; fp32 keeps ~7 digits)
TOLERANCE = 1e-4
# fp16 / bf16 against fp32 (PyTorch, the same inputs): embeddings' cosine at least this;
# classification and NER labels equal on the sample sentences
DTYPE_MIN_COSINE = 0.999
ARTIFACT = {"onnx": "model.onnx", "torchscript": "model.ts", "torch": None}


class ExportError(Exception):
    """An export that cannot be done or did not pass its parity check."""


class _RuntimeDepth(nn.Module):
    """A recursive model whose depth is a run-time input, so that ONNX keeps a Loop."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor, num_iterations: torch.Tensor) -> torch.Tensor:
        return self.model.forward_iterations(input_ids, attention_mask, token_type_ids,
                                             int(num_iterations))


def example_inputs(batch: int = 2, length: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, length), generator=g)
    return ids, torch.ones_like(ids), torch.zeros_like(ids)


def to_onnx(model: nn.Module, task: str, path: Path, loop: str = "unroll") -> None:
    """Writes an ONNX graph with dynamic batch and sequence axes."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes["output"] = {0: "batch", 1: "sequence"} if task == "ner" else {0: "batch"}
    args = example_inputs()
    names = list(INPUT_NAMES)
    if loop == "keep":
        model = torch.jit.script(_RuntimeDepth(model))
        args = (*args, torch.tensor(2))
        names.append("num_iterations")
    torch.onnx.export(model, args, str(path), input_names=names, output_names=["output"],
                      dynamic_axes=axes, opset_version=17, dynamo=False,
                      do_constant_folding=True)


def to_torchscript(model: nn.Module, path: Path, loop: str = "unroll") -> None:
    """Traced (the loop unrolled) or scripted (the loop kept) TorchScript."""
    if loop == "keep":
        module = torch.jit.script(model)
    else:
        module = torch.jit.trace(model, example_inputs(), check_trace=False)
    torch.jit.save(module, str(path))


def _nodes(graph: onnx.GraphProto):
    """Every node, including those inside Loop bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)


def quantize_int8(src: Path, dst: Path) -> list[str]:
    """ONNX Runtime dynamic int8, per channel (the defaults hurt embeddings: STACK.md).

    MatMuls whose weight narrows the width (K > N: the FFN's down-projection, which reads
    the GELU's long-tailed output) stay fp32. Measured on all-MiniLM-L6-v2 over 36 real
    sentences: quantising everything gave min cosine 0.9897 vs fp32 at 313 sentences/s,
    keeping those 6 MatMuls fp32 min 0.9939 at 261 (fp32: 184). Returns their names."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    keep = [n.name for n in _nodes(graph) if n.op_type == "MatMul" and n.input[1] in dims
            and len(dims[n.input[1]]) == 2 and dims[n.input[1]][0] > dims[n.input[1]][1]]
    quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                     nodes_to_exclude=keep, extra_options={"EnableSubgraph": True})
    return keep


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
        if task == "classify" and length > 4:
            types[0, length // 2:] = 1  # a text pair in the first row
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    batches = [random(1, 5, False, 1), random(3, 17, True, 2),
               random(3, max(6, max_length - 3), True, 3)]
    enc = tokenizer(samples.SENTENCES[:12], padding=True, truncation=True,
                    max_length=max_length, return_tensors="np")
    batches.append({k: enc[k].astype(np.int64) for k in INPUT_NAMES})
    return batches


def agreement(task: str, reference: np.ndarray, other: np.ndarray, mask: np.ndarray) -> dict:
    """How far an approximate artifact (int8) is from the exact one."""
    if task == "embed":
        a = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
        b = other / np.linalg.norm(other, axis=-1, keepdims=True)
        cos = (a * b).sum(-1)
        return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    same = reference.argmax(-1) == other.argmax(-1)
    if task == "ner":
        same = same[mask.astype(bool)]
    return {"argmax_agreement": float(same.mean())}


def dtype_parity(model: nn.Module, task: str, dtypes, batches: list[dict[str, np.ndarray]],
                 references: list[np.ndarray]) -> dict[str, dict]:
    """How each half-precision dtype the family runs in compares with fp32, in PyTorch on
    the CPU (torch runs fp16 and bf16 there), at the parity batches. Embeddings: the
    lowest cosine over every batch; classify / ner: argmax agreement on the sample
    sentences (the last batch; NER on its real tokens). A dtype that fails is recorded,
    and the service will not run the model in it."""
    from models.runtime.torch_device import TORCH_DTYPES

    out = {}
    for name in dtypes:
        if name == "fp32":
            continue
        half = copy.deepcopy(model).to(TORCH_DTYPES[name])
        with torch.no_grad():
            got = [half(*(torch.from_numpy(b[k]) for k in INPUT_NAMES)).float().numpy()
                   for b in batches]
        del half
        if task == "embed":
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


def _versions() -> dict[str, str]:
    import onnxruntime
    import transformers

    return {"torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "transformers": transformers.__version__}


def export(source: str | Path, output: str | Path, fmt: str = "onnx", loop: str = "unroll",
           quantize: str | None = None, task: str | None = None, max_length: int | None = None,
           progress: Callable[[str], None] = lambda step: None, force: bool = False,
           relevant_label: str | None = None) -> Manifest:
    """Exports the checkpoint at ``source`` into the model folder ``output``; returns the
    manifest. An existing ``output`` (perhaps being served) is refused unless ``force``,
    and then replaced only once the new folder is complete. Raises CheckpointError
    (unreadable checkpoint) or ExportError."""
    output = Path(output)
    if output.exists() and not force:
        raise ExportError(f"{output} already exists (a server may be serving it); pass "
                          "--force to replace it")
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if loop not in ("unroll", "keep"):
        raise ExportError(f"unknown loop form {loop!r} (unroll, keep)")
    if quantize not in (None, "int8") or (quantize and fmt != "onnx"):
        raise ExportError("--quantize int8 applies to --format onnx only")
    progress("loading the checkpoint")
    ckpt = checkpoint.load(source, task=task)
    if relevant_label is not None and (ckpt.task != "classify"
                                       or relevant_label not in ckpt.labels):
        raise ExportError(f"--relevant-label {relevant_label!r} must be one of a "
                          f"classification model's labels (this is a {ckpt.task} model"
                          + (f" with labels {ckpt.labels})" if ckpt.labels else ")"))
    if loop == "keep" and (ckpt.family not in families.RECURSIVE or fmt == "torch"):
        raise ExportError(f"--loop keep applies to the recursive families "
                          f"({', '.join(families.RECURSIVE)}) exported to onnx or torchscript, "
                          f"not to {ckpt.family} as {fmt}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ckpt.tokenizer_dir))
    max_length = min(max_length or ckpt.max_length, ckpt.max_length)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        manifest = _export_into(staging, ckpt, tokenizer, fmt, loop, quantize, max_length,
                                progress, relevant_label)
        progress("moving into place")
        replace(staging, output)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace(new: Path, output: Path) -> None:
    """Puts the complete folder ``new`` at ``output`` by two renames: ``output`` holds the
    old model until an instant before it holds the new one, and never a half-written one
    (a server's next load finds one or the other, or for that instant none)."""
    old = None
    if output.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
        output.rename(old / "model")
    new.rename(output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _export_into(folder: Path, ckpt: checkpoint.Checkpoint, tokenizer, fmt: str, loop: str,
                 quantize: str | None, max_length: int,
                 progress: Callable[[str], None], relevant_label: str | None = None) -> Manifest:
    checkpoint.save(ckpt, folder / "checkpoint")
    artifact = ARTIFACT[fmt]
    model = ckpt.model.eval()
    started = time.perf_counter()
    progress(f"exporting to {fmt}" + (f" (loop {loop})" if ckpt.family in families.RECURSIVE else ""))
    with torch.no_grad():
        if fmt == "onnx":
            to_onnx(model, ckpt.task, folder / artifact, loop)
        elif fmt == "torchscript":
            to_torchscript(model, folder / artifact, loop)
    depth = getattr(model, "num_iterations", None)
    served = artifact or "checkpoint"

    progress("checking parity against PyTorch")
    batches = parity_inputs(tokenizer, max_length, ckpt.task)
    backend = open_backend(fmt, folder, artifact, num_iterations=depth)
    worst, worst_scaled, shapes = 0.0, 0.0, []
    references = []
    for inputs in batches:
        with torch.no_grad():
            ref = model(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES)).numpy()
        references.append(ref)
        got = backend.run(inputs)
        if got.shape != ref.shape:
            raise ExportError(f"{fmt} output shape {got.shape} != PyTorch {ref.shape} "
                              f"for inputs {inputs['input_ids'].shape}")
        diff = float(np.abs(got - ref).max())
        worst = max(worst, diff)
        worst_scaled = max(worst_scaled, diff / max(1.0, float(np.abs(ref).max())))
        shapes.append(list(inputs["input_ids"].shape))
    parity = {"max_abs_diff": worst, "max_scaled_diff": worst_scaled, "tolerance": TOLERANCE,
              "shapes": shapes, "example_shape": list(example_inputs()[0].shape)}
    if not worst_scaled <= TOLERANCE:
        raise ExportError(f"{fmt} artifact differs from PyTorch by {worst:.3g} "
                          f"({worst_scaled:.3g} of the output's scale; tolerance "
                          f"{TOLERANCE}); nothing was written")

    progress("checking fp16 and bf16 against fp32")
    dtypes = {"fp32": {"passed": True}, **dtype_parity(
        model, ckpt.task, families.get(ckpt.family).dtypes, batches, references)}

    quantization = None
    if quantize:
        progress("quantizing to int8")
        fp32_nodes = quantize_int8(folder / artifact, folder / "model.int8.onnx")
        int8 = open_backend("onnx", folder, "model.int8.onnx", num_iterations=depth)
        real = batches[-1]
        quantized = int8.run(real)
        quantization = {"method": "onnxruntime quantize_dynamic, QInt8, per_channel",
                        "kept_fp32": fp32_nodes,
                        "max_abs_diff_vs_fp32": float(np.abs(quantized - references[-1]).max()),
                        **agreement(ckpt.task, references[-1], quantized,
                                    real["attention_mask"])}
        served = "model.int8.onnx"

    manifest = Manifest(
        task=ckpt.task, family=ckpt.family, labels=ckpt.labels,
        relevant_label=relevant_label, max_length=max_length,
        pooling=families.get(ckpt.family).pooling if ckpt.task == "embed" else None,
        dimensions=int(references[0].shape[-1]) if ckpt.task == "embed" else None,
        backend=fmt, loop=loop if ckpt.family in families.RECURSIVE else None,
        num_iterations=depth, artifact=served,
        files=sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        parity=parity, dtypes=dtypes, quantization=quantization,
        parameters=ckpt.num_parameters(),
        export_seconds=round(time.perf_counter() - started, 2), versions=_versions(),
        source=str(ckpt.path) if ckpt.path else None, checkpoint_extra=ckpt.extra)
    manifest.write(folder)
    return manifest
