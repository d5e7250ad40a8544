"""``distilserve bench``: every paper-size model the project builds x backend x loop form,
measured as the CMOW paper did (random token ids, batches of 256 x 64, no gradients),
each in its own process; plus the machine's fp32 GEMM rate, FLOPs per sentence and
efficiency. Results append to ``results.jsonl`` as they come (a rerun skips what is
there: resumable); ``results.json``, ``REPORT.md`` and the charts are written at the end.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from distilserve.bench.gemm import compute_dtype, gemm_rates, gpu_gemm_rates, reference_rates
from distilserve.models.runtime.cores import available_cores

BACKENDS = ("torch", "torchscript", "onnx", "onnx-int8")


@dataclass(frozen=True)
class Row:
    name: str
    family: str
    preset: str
    overrides: tuple = ()  # config changes on top of the preset, as (key, value) pairs
    source: str = ""  # an existing checkpoint (a distilled student) instead of a preset


PAPER_ROWS = [
    Row("BERT-base", "bert", "bert-base"),
    Row("DistilBERT", "distilbert", "distilbert"),
    Row("MobileBERT", "bert", "mobilebert"),
    Row("TinyBERT-4L", "bert", "tinybert-4l"),
    Row("MiniLM-L6", "bert", "minilm-l6"),
    Row("MiniALBERT-128", "minialbert", "minialbert-128"),
    Row("MiniALBERT-128 no adapter", "minialbert", "minialbert-128", (("use_adapter", False),)),
    Row("MiniALBERT-312", "minialbert", "minialbert-312"),
    Row("MiniALBERT-312 no adapter", "minialbert", "minialbert-312", (("use_adapter", False),)),
    Row("MiniALBERT-768", "minialbert", "minialbert-768"),
    Row("MiniALBERT-768 no adapter", "minialbert", "minialbert-768-noadapter"),
    Row("ALBERT-base", "falbert", "albert-base"),
    Row("LR-ALBERT", "falbert", "lr-albert"),
    Row("F-ALBERT", "falbert", "falbert"),
    Row("Bidi. CMOW/CBOW-Hybrid", "cmow", "cmow-hybrid-bidi"),
]
QUICK_ROWS = [Row(f"{family} tiny", family, "tiny") for family in
              ("bert", "distilbert", "minialbert", "falbert", "cmow")]


def _reuses(n: int) -> tuple:
    """An ALBERT's overrides for ``n`` reuses of its whole layer (an LR-ALBERT)."""
    return (("num_hidden_layers", n), ("connection_schedule", []))


def _paper(*names: str) -> list[Row]:
    return [row for row in PAPER_ROWS if row.name in names]


# fine-tuning (--training): F-ALBERT's Figure 6 sweep of reuses, and the speed table's rows
TRAINING_ROWS = [
    *_paper("ALBERT-base"),
    *[Row(f"LR-ALBERT {n} reuses", "falbert", "albert-base", _reuses(n)) for n in (10, 8)],
    *_paper("LR-ALBERT"),
    *[Row(f"LR-ALBERT {n} reuses", "falbert", "albert-base", _reuses(n)) for n in (4, 2)],
    *_paper("F-ALBERT", "MiniALBERT-768", "DistilBERT", "BERT-base", "TinyBERT-4L",
            "MobileBERT", "Bidi. CMOW/CBOW-Hybrid"),
    # the large size: ALBERT-large's 24 reuses, half of them, a quarter, and F-ALBERT's FFN
    Row("ALBERT-large", "falbert", "albert-large"),
    Row("LR-ALBERT-large", "falbert", "lr-albert-large"),
    Row("LR-ALBERT-large 6 reuses", "falbert", "albert-large", _reuses(6)),
    Row("F-ALBERT-large", "falbert", "falbert-large"),
]
QUICK_TRAINING_ROWS = [
    *[Row(f"falbert tiny {n} reuses", "falbert", "tiny", _reuses(n)) for n in (4, 2)],
    *[Row(f"{family} tiny", family, "tiny") for family in ("bert", "minialbert", "cmow")]]


@dataclass
class Options:
    output: Path
    batch_size: int = 256
    length: int = 64
    batches: int = 1
    repeats: int = 3
    latency_runs: int = 20
    threads: int = 0
    device: str = "cpu"  # cpu or cuda[:N]: on a GPU, the torch and torchscript backends
    dtype: str = "fp32"
    cuda_graphs: bool = False  # on a GPU: each timed shape replayed from a CUDA graph
    backends: tuple = BACKENDS
    rows: list = dataclasses.field(default_factory=lambda: list(PAPER_ROWS))
    # the recursive rows also at every depth, 1 to theirs (a request's iterations): their
    # loop kept (ONNX, TorchScript) and their checkpoint (torch)
    depths: bool = False
    # fine-tuning steps (training.py) of training_rows instead, ``repeats`` of them timed
    training: bool = False
    training_rows: list = dataclasses.field(default_factory=lambda: list(TRAINING_ROWS))


class CannotMeasure(Exception):
    """A run the harness cannot do as asked: a --length past a model's positions, or an
    output folder whose measurements this run's would not be comparable with."""


def flops_per_sentence(model, length: int, depth: int | None = None) -> int:
    """Counted, not estimated: every matmul of one forward pass over one sentence
    (recursion and attention included; ``depth``: a recursive model's iterations, None:
    its own), via torch's FlopCounterMode. Attention through scaled_dot_product_attention
    is counted on its math path: the counter has no formula for the CPU's fused kernel and
    counted it as 0."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(1000, 30000, (1, length))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, \
            torch.no_grad():
        inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))
        model(*inputs) if depth is None else model.forward_iterations(*inputs, depth)
    return int(counter.get_total_flops())


def prepare(row: Row, backend: str, loop: str, opts: Options) -> dict:
    """Writes the artifact for one measurement (once) and returns the worker's spec."""
    from distilserve.models import export
    from distilserve.models.io import checkpoint
    from distilserve.models.io.manifest import Manifest

    folder = opts.output / "artifacts" / _key(row, backend, loop).replace("/", "_")
    manifest = folder / "manifest.json"
    source = Path(row.source) if row.source else (
        opts.output / "artifacts" / f"{row.family}-{row.preset}-{row.overrides}")
    max_length = max(opts.length, 16)
    m = Manifest.read(folder) if manifest.exists() else None
    if not (source / "config.json").exists():
        checkpoint.save(checkpoint.new(row.family, row.preset, "embed",
                                       overrides=dict(row.overrides)), source)
    if (m is None or m.max_length != max_length  # exported for another --length
            or (row.source  # a student distilled again since its export
                and (source / "config.json").stat().st_mtime > manifest.stat().st_mtime)):
        fmt = {"onnx-int8": "onnx"}.get(backend, backend)
        m = export.export(source, folder, fmt, loop, "int8" if backend == "onnx-int8" else None,
                          max_length=max_length, force=True)
    # the worker runs in the repository's root: the folder whatever this one's cwd
    return {"backend": m.backend, "folder": str(folder.resolve()), "artifact": m.artifact,
            "num_iterations": m.num_iterations, "parameters": m.parameters,
            "dtypes": m.allowed_dtypes, "parity": m.parity["max_abs_diff"],
            "quantization": m.quantization}


def _versions(device: str) -> dict[str, str]:
    """What the report was measured with."""
    import platform

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if device != "cpu":
        out.update(gpu=torch.cuda.get_device_name(), cuda=str(torch.version.cuda))
    return out


def student_rows(folder: Path) -> list[Row]:
    """One row per distilled student under ``folder`` (see ``distilserve distill``)."""
    rows = []
    for path in sorted(p.parent for p in folder.glob("*/distillation.json")):
        record = json.loads((path / "distillation.json").read_text())
        name = f"{record['family']} student" + (" (any depth)" if record.get("any_depth")
                                                 else "")
        rows.append(Row(name, record["family"], record["preset"], source=str(path.resolve())))
    return rows


def rescore(results: list[dict], references: dict[str, float], device: str, dtype: str) -> None:
    """Efficiency against this run's GEMM rate of the dtype each row computes in
    (``references``: dtype -> FLOP/s), for the rows measured on its device in its dtype
    (those a resumed run skipped included); rows of another run's dtype (a GPU's fp32
    beside its fp16) keep that run's rate."""
    for r in results:
        if (r.get("device", "cpu"), r.get("dtype", "fp32")) == (device, dtype):
            score(r, references)


def score(r: dict, references: dict[str, float]) -> None:
    """A measured row's efficiency against the GEMM rate of the dtype it computes in,
    where that rate was measured."""
    gemm = references.get(compute_dtype(r.get("backend", ""), r.get("dtype", "fp32")))
    if "gflop_per_s" in r and gemm:
        r.update(gemm_gflop_per_s=gemm / 1e9, efficiency=r["gflop_per_s"] * 1e9 / gemm)


def _key(row: Row, backend: str, loop: str, opts: Options | None = None) -> str:
    where = (f"|{opts.device}|{opts.dtype}" if opts and (opts.device, opts.dtype) != ("cpu", "fp32")
             else "")
    return f"{row.name}|{backend}|{loop}{where}{'|graphs' if opts and opts.cuda_graphs else ''}"


def _column(backend: str, opts: Options) -> str:
    """The report's column: the backend; on a GPU or in a half dtype with its dtype, and
    graphs if used."""
    if (opts.device, opts.dtype) == ("cpu", "fp32"):
        return backend
    return f"{backend} {opts.dtype}{' graphs' if opts.cuda_graphs else ''}"


def _loops(row: Row, backend: str) -> tuple:
    from distilserve.models.families import RECURSIVE

    return ("unroll", "keep") if row.family in RECURSIVE and backend != "torch" else ("unroll",)


def _depth_jobs(rows: list[Row], backends: tuple) -> list[tuple[Row, str, str, str]]:
    """(row, backend, loop, "depths"): the recursive rows whose depth a request may choose,
    their loop kept (the checkpoint itself on torch)."""
    from distilserve.models.families import RECURSIVE

    return [(row, b, "unroll" if b == "torch" else "keep", "depths") for row in rows
            if row.family in RECURSIVE for b in backends if b in ("torch", "torchscript", "onnx")]


def _measure(row: Row, backend: str, loop: str, depth: int | None, spec: dict,
             opts: Options) -> dict:
    """One measurement of a prepared artifact (``spec``) by the worker, in a process of its
    own; ``depth``: a recursive model's iterations (None: its own)."""
    from distilserve.models import families
    from distilserve.models.io import checkpoint

    model = checkpoint.load(Path(spec["folder"]) / "checkpoint").model
    flops = flops_per_sentence(model, opts.length, depth)
    del model
    out = subprocess.run([sys.executable, "-m", "distilserve.bench.worker",
                          json.dumps({**spec, "depth": depth})],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    if out.returncode != 0:
        result = {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    else:
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["gflop_per_s"] = result["sentences_per_s"] * flops / 1e9
    if row.source:
        distilled = json.loads((Path(row.source) / "distillation.json").read_text())
        result["fidelity"] = (distilled["fidelity"] if depth is None
                              else distilled.get("fidelity_by_depth", {}).get(str(depth)))
        if result["fidelity"] is None:  # distilled before fidelity was kept by depth
            del result["fidelity"]
    return {"model": row.name, "family": row.family, "preset": row.preset,
            "overrides": dict(row.overrides), "backend": backend,
            "device": opts.device, "dtype": opts.dtype, "column": _column(backend, opts),
            "loop": loop if row.family in families.RECURSIVE else None,
            "iterations": depth, "mode": "inference", "parameters": spec["parameters"],
            "flops_per_sentence": flops, "batch_size": opts.batch_size,
            "length": opts.length, "parity_max_abs_diff": spec["parity"],
            "int8_agreement": spec["quantization"], **result}


def _measure_training(row: Row, opts: Options, threads: int) -> dict:
    """One row's fine-tuning steps (distilserve.bench.training) in a process of its own."""
    spec = {"mode": "training", "family": row.family, "preset": row.preset,
            "overrides": dict(row.overrides), "batch_size": opts.batch_size,
            "length": opts.length, "steps": opts.repeats, "threads": threads,
            "device": opts.device, "dtype": opts.dtype}
    out = subprocess.run([sys.executable, "-m", "distilserve.bench.worker", json.dumps(spec)],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    if out.returncode != 0:
        result = {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    else:
        result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"model": row.name, "family": row.family, "preset": row.preset,
            "overrides": dict(row.overrides), "backend": "torch", "column": "training",
            "loop": None, "device": opts.device, "dtype": opts.dtype,
            "batch_size": opts.batch_size, "length": opts.length, "mode": "training",
            **result}


def _check_shape(done: dict, opts: Options) -> None:
    """Refuses to add rows of one batch shape to a folder of another's (a resumed row's key
    names no shape, and the report one shape for all); fine-tuning rows name theirs."""
    shapes = {(r["batch_size"], r["length"]) for r in done.values()
              if r.get("mode") != "training" and "batch_size" in r}
    if other := sorted(shapes - {(opts.batch_size, opts.length)}):
        raise CannotMeasure(
            f"{opts.output} holds measurements of batches of "
            + ", ".join(f"{b} x {n} tokens" for b, n in other)
            + f", not {opts.batch_size} x {opts.length}: name another --output, or give "
            "its --batch-size and --length")


def _check_lengths(rows: list[Row], length: int) -> None:
    """Refuses a --length past any row's positions, before anything is measured."""
    from distilserve.models.io import checkpoint

    short = []
    for row in rows:
        config = (checkpoint.read_config(Path(row.source)) if row.source else
                  checkpoint.preset_config(row.family, row.preset, dict(row.overrides)))
        if length > (positions := checkpoint.positions(config)):
            short.append(f"{row.name} takes at most {positions} tokens")
    if short:
        raise CannotMeasure(f"--length {length}: {'; '.join(short)} "
                            f"({'its' if len(short) == 1 else 'their'} position embeddings)")


def measure_all(opts: Options, progress=print) -> list[dict]:
    """Measures every row x backend x loop not already in results.jsonl; CannotMeasure,
    before measuring, where those were measured at another batch shape, or --length is past
    a row's positions."""
    from distilserve.models import families

    opts.output.mkdir(parents=True, exist_ok=True)
    log = opts.output / "results.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    if not opts.training:
        _check_shape(done, opts)
    asked = opts.training_rows if opts.training else opts.rows
    rows = [row for row in asked if opts.dtype in families.get(row.family).dtypes]
    for row in asked:
        if row not in rows:  # e.g. CMOW in fp16: not a failure, a row the dtype leaves out
            progress(f"{row.name}: left out, {row.family} does not run in {opts.dtype}")
    _check_lengths(rows, opts.length)
    threads = opts.threads or available_cores()
    if opts.device == "cpu":
        progress(f"measuring the fp32, bf16 and int8 GEMM rates ({threads} threads)")
        rates = gemm_rates(threads)
    else:
        progress(f"measuring the {opts.dtype} GEMM rate on {opts.device}")
        rates = gpu_gemm_rates(opts.device, opts.dtype)
    references = reference_rates(rates)
    jobs = [] if opts.training else [
        (row, b, loop, None) for row in rows for b in opts.backends
        for loop in _loops(row, b)] + (_depth_jobs(rows, opts.backends) if opts.depths else [])
    for n, row in enumerate(rows if opts.training else [], 1):
        key = f"{row.name}|training|{opts.batch_size}x{opts.length}|{opts.device}|{opts.dtype}"
        if key in done:
            continue
        progress(f"[{n}/{len(rows)}] {row.name}: fine-tuning steps")
        record = _measure_training(row, opts, threads)
        record["key"] = key
        done[key] = record
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")
    for n, (row, backend, loop, depths) in enumerate(jobs, 1):
        key = _key(row, backend, loop, opts)
        if not depths and key in done:
            continue
        progress(f"[{n}/{len(jobs)}] {row.name}, {backend}, loop {loop}: preparing")
        spec = prepare(row, backend, loop, opts)
        spec.update(batch_size=opts.batch_size, length=opts.length, batches=opts.batches,
                    repeats=opts.repeats, latency_runs=opts.latency_runs, threads=threads,
                    device=opts.device, dtype=opts.dtype, cuda_graphs=opts.cuda_graphs)
        for depth in range(1, spec["num_iterations"] + 1) if depths else [None]:
            at = "" if depth is None else f", {depth} iterations"
            if depth is not None and f"{key}|iterations {depth}" in done:
                continue
            progress(f"[{n}/{len(jobs)}] {row.name}, {backend}, loop {loop}{at}: measuring")
            record = _measure(row, backend, loop, depth, spec, opts)
            record["key"] = key + ("" if depth is None else f"|iterations {depth}")
            score(record, references)
            done[record["key"]] = record
            with log.open("a") as f:
                f.write(json.dumps(record) + "\n")
    results = list(done.values())  # in the order measured, earlier (resumed) runs included
    rescore(results, references, opts.device, opts.dtype)
    versions = _versions(opts.device)
    (opts.output / "results.json").write_text(json.dumps(
        {"machine": {"cores": available_cores(), "device": opts.device, "dtype": opts.dtype,
                     "versions": versions,
                     "gemm_gflop_per_s": {d: v / 1e9 for d, v in references.items()},
                     "gemm_gflop_per_s_by_library": {k: v / 1e9 for k, v in rates.items()}},
         "settings": {"batch_size": opts.batch_size, "length": opts.length,
                      "batches": opts.batches, "repeats": opts.repeats},
         "results": results}, indent=2) + "\n")
    from distilserve.bench import report

    report.write(opts.output, results, references, rates, versions)
    return results
