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
after the parity check passed: a failed export leaves nothing servable behind. Here: the
steps in order; artifacts.py writes the graphs, parity.py checks them (and fp16/bf16),
quantize.py makes the int8 model.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from distilserve.models import bert, families
from distilserve.models.export.artifacts import to_onnx, to_torchscript
from distilserve.models.export.parity import (
    TOLERANCE,
    agreement,
    compare,
    dtype_parity,
    parity_inputs,
    reference,
)
from distilserve.models.export.quantize import quantize_int8
from distilserve.models.io import checkpoint
from distilserve.models.io.folders import replacing
from distilserve.models.io.manifest import DECODER, Manifest, TokenizerFacts
from distilserve.models.runtime import open_backend
from distilserve.models.runtime.tracing import example_inputs, trace
from distilserve.models.tasks import PER_TOKEN, least_max_length

__all__ = ["ARTIFACT", "FORMATS", "ExportError", "example_inputs", "export", "trace"]

FORMATS = ("onnx", "torchscript", "torch")
ARTIFACT = {"onnx": "model.onnx", "torchscript": "model.ts", "torch": None}


class ExportError(Exception):
    """An export that cannot be done or did not pass its parity check."""


def _versions() -> dict[str, str]:
    import onnxruntime
    import transformers

    return {"torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "transformers": transformers.__version__}


def export(source: str | Path, output: str | Path, fmt: str = "onnx", loop: str = "unroll",
           quantize: str | None = None, task: str | None = None, max_length: int | None = None,
           progress: Callable[[str], None] = lambda step: None, force: bool = False,
           relevant_label: str | None = None, pooling: str | None = None,
           token_embeddings: bool = False, aliases: list[str] | None = None,
           check: bool = True) -> Manifest:
    """Exports the checkpoint at ``source`` into the model folder ``output``; returns the
    manifest. An existing ``output`` (perhaps being served) is refused unless ``force``,
    and then replaced only once the new folder is complete. ``max_length`` (at most its
    position embeddings') defaults to the length the checkpoint was trained for
    (sentence-transformers' max_seq_length) where its files say, else its position
    embeddings'; ``pooling`` (mean, cls, splade) overrides its sentence-transformers
    files' for an embedding model;
    ``token_embeddings``: the artifact gives an embedding model's token vectors [B, T, D],
    which the service pools (TEI's /embed_all serves them); ``aliases``: names the model
    answers to besides its folder's (an OpenAI model name a client sends); ``check``: compare
    the artifact with PyTorch and fp16 and bf16 with fp32 (without: the manifest records
    neither, and the service runs the model in any dtype its family runs in). Raises
    CheckpointError (unreadable checkpoint) or ExportError."""
    output = Path(output)
    if output.exists() and not force:
        raise ExportError(f"{output} already exists (a server may be serving it); pass "
                          "--force to replace it")
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if loop not in ("unroll", "keep"):
        raise ExportError(f"unknown loop form {loop!r} (unroll, keep)")
    if max_length is not None and max_length < 1:
        raise ExportError(f"--max-length must be a number of tokens, at least 1, not "
                          f"{max_length}")
    if quantize not in (None, "int8") or (quantize and fmt != "onnx"):
        raise ExportError("--quantize int8 applies to --format onnx only")
    progress("loading the checkpoint")
    ckpt = checkpoint.load(source, task=task, pooling=pooling, token_embeddings=token_embeddings)
    if pooling is not None and ckpt.task != "embed":
        raise ExportError(f"--pooling applies to embedding models, not to this {ckpt.task} "
                          "model")
    if relevant_label is not None and (ckpt.task != "classify"
                                       or relevant_label not in ckpt.labels):
        raise ExportError(f"--relevant-label {relevant_label!r} must be one of a "
                          f"classification model's labels (this model's task is {ckpt.task}"
                          + (f", its labels {ckpt.labels})" if ckpt.labels else ")"))
    if loop == "keep" and (ckpt.family not in families.RECURSIVE or fmt == "torch"):
        raise ExportError(f"--loop keep applies to the recursive families "
                          f"({', '.join(families.RECURSIVE)}) exported to onnx or torchscript, "
                          f"not to {ckpt.family} as {fmt}")
    tokenizer = checkpoint.fast_tokenizer(ckpt.tokenizer_dir)
    _check_vocabulary(ckpt, len(tokenizer), Path(source))
    if max_length is not None and max_length > ckpt.max_length:
        raise ExportError(f"--max-length {max_length} is more than the model takes: its "
                          f"position embeddings cover {ckpt.max_length} tokens "
                          "(max_position_embeddings)")
    max_length = max_length or ckpt.default_length
    least = least_max_length(tokenizer.backend_tokenizer, ckpt.task)
    if max_length < least:
        raise ExportError(f"--max-length {max_length} leaves no token of text beside the "
                          f"special tokens around each input (task {ckpt.task}): at least "
                          f"{least}")
    # said before anything is written: a caller that stops the export there (the embedded
    # default's build, when the service stops) is left no folder made after its clean-up
    progress(f"exporting to {fmt}" + (f" (loop {loop})" if ckpt.family in families.RECURSIVE else ""))
    with replacing(output) as staging:
        manifest = _export_into(staging, ckpt, tokenizer, fmt, loop, quantize, max_length,
                                progress, relevant_label, token_embeddings, aliases, check)
        progress("moving into place")
        _as_the_umask_makes(staging)
    return manifest


def _check_vocabulary(ckpt: checkpoint.Checkpoint, tokens: int, source: Path) -> None:
    """Refuses a tokenizer whose ids run past the model's embedding table (each such id
    would fail in the model): a checkpoint with another model's tokenizer, or one with
    none of its own given bert-base-uncased's."""
    rows = ckpt.model.config.vocab_size  # the token embedding table's, as loaded
    if tokens <= rows:
        return
    whose = (f"{source} has no tokenizer of its own, and bert-base-uncased's"
             if Path(ckpt.tokenizer_dir) == checkpoint.default_tokenizer_dir()
             else f"{ckpt.tokenizer_dir}: its tokenizer")
    raise ExportError(f"{whose} has {tokens} tokens, but the model's embedding table has "
                      f"{rows} rows (vocab_size): ids {rows}-{tokens - 1} would fail; give "
                      "the checkpoint the tokenizer it was trained with")


def _as_the_umask_makes(folder: Path) -> None:
    """Gives the files and folders in ``folder`` the modes the umask gives (``folder``'s
    own, made by mkdir): some writers make theirs 0600 (safetensors' files)."""
    folders = stat.S_IMODE(folder.stat().st_mode)
    for path in folder.rglob("*"):
        path.chmod(folders if path.is_dir() else folders & 0o666)


def _tokenizer_facts(folder: Path) -> TokenizerFacts | None:
    """What the service takes from the saved checkpoint's transformers tokenizer (special
    tokens, how it decodes), where its tokenizer.json read by tokenizers alone is the
    tokenizer transformers loads from it (so the service needs no transformers); None
    where transformers changes it (a tokenizer_config.json that overrides it)."""
    saved = checkpoint.fast_tokenizer(folder)
    file = folder / "tokenizer.json"
    alone = Tokenizer.from_file(str(file)).to_str() if file.is_file() else None
    return TokenizerFacts.of(saved) if alone == saved.backend_tokenizer.to_str() else None


def _export_into(folder: Path, ckpt: checkpoint.Checkpoint, tokenizer, fmt: str, loop: str,
                 quantize: str | None, max_length: int,
                 progress: Callable[[str], None], relevant_label: str | None = None,
                 token_embeddings: bool = False, aliases: list[str] | None = None,
                 check: bool = True) -> Manifest:
    checkpoint.save(ckpt, folder / "checkpoint")
    artifact = ARTIFACT[fmt]
    model = ckpt.model.eval()
    started = time.perf_counter()
    with torch.no_grad():
        if fmt == "onnx":
            to_onnx(model, folder / artifact, loop,
                    per_token=ckpt.task in PER_TOKEN or token_embeddings)
        elif fmt == "torchscript":
            to_torchscript(model, folder / artifact, loop)
    depth = getattr(model, "num_iterations", None)
    served = artifact or "checkpoint"

    batches = parity_inputs(tokenizer, max_length, ckpt.task)
    parity = dtypes = None
    if check:
        progress("checking parity against PyTorch")
        backend = open_backend(fmt, folder, artifact, num_iterations=depth,
                               token_embeddings=token_embeddings, task=ckpt.task)
        try:
            parity, references = compare(model, backend, batches)
        except ValueError as e:  # a shape PyTorch does not give, or outputs not finite
            raise ExportError(f"{e}; nothing was written") from None
        parity["example_shape"] = list(example_inputs()[0].shape)
        if not parity["max_scaled_diff"] <= TOLERANCE:
            raise ExportError(f"{fmt} artifact differs from PyTorch by "
                              f"{parity['max_abs_diff']:.3g} ({parity['max_scaled_diff']:.3g} "
                              f"of the output's scale; tolerance {TOLERANCE}); nothing was "
                              "written")
        progress("checking fp16 and bf16 against fp32")
        dtypes = {"fp32": {"passed": True}, **dtype_parity(
            model, ckpt.task, families.get(ckpt.family).dtypes, batches, references)}
    else:  # PyTorch's outputs for the sample sentences alone (their width; int8's reference)
        references = [reference(model, batches[-1])]

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

    if ckpt.task == "fill-mask":  # the vocabulary projection, run by the service
        save_file({k: v.contiguous() for k, v in bert.decoder(model).items()},
                  str(folder / DECODER))

    manifest = Manifest(
        task=ckpt.task, family=ckpt.family, labels=ckpt.labels,
        relevant_label=relevant_label, multi_label=ckpt.multi_label, max_length=max_length,
        aliases=list(aliases or []),
        pooling=ckpt.pooling, token_embeddings=token_embeddings,
        prompts=ckpt.pipeline.prompts if ckpt.pipeline else {},
        default_prompt_name=ckpt.pipeline.default_prompt_name if ckpt.pipeline else None,
        dimensions=int(references[-1].shape[-1]) if ckpt.task == "embed" else None,
        backend=fmt, loop=loop if ckpt.family in families.RECURSIVE else None,
        num_iterations=depth, artifact=served,
        files=sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        parity=parity, dtypes=dtypes, quantization=quantization,
        parameters=ckpt.num_parameters(),
        export_seconds=round(time.perf_counter() - started, 2), versions=_versions(),
        source=str(ckpt.path) if ckpt.path else None, checkpoint_extra=ckpt.extra,
        tokenizer=_tokenizer_facts(folder / "checkpoint"))
    manifest.write(folder)
    return manifest
