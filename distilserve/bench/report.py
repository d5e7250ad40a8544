"""REPORT.md and the PNG charts from the harness's results, with the papers' ratios
next to the measured ones. ``python -m distilserve.bench.report FOLDER`` draws the charts again from
FOLDER/results.json (for a run on a machine without matplotlib, such as the lent GPU's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from distilserve.models.runtime.cores import available_cores

# (what, numerator model, denominator model, quantity, the paper's ratio, source)
CLAIMS = [
    ("BERT-base vs DistilBERT", "BERT-base", "DistilBERT", "speed", 0.50, "CMOW paper, A100"),
    ("MobileBERT vs DistilBERT", "MobileBERT", "DistilBERT", "speed", 0.60, "CMOW paper"),
    ("TinyBERT-4L vs DistilBERT", "TinyBERT-4L", "DistilBERT", "speed", 3.26, "CMOW paper"),
    ("CMOW/CBOW-Hybrid vs DistilBERT", "Bidi. CMOW/CBOW-Hybrid", "DistilBERT", "speed", 3.26,
     "CMOW paper"),
    ("LR-ALBERT vs ALBERT-base", "LR-ALBERT", "ALBERT-base", "speed", 2.0, "F-ALBERT paper"),
    ("LR-ALBERT vs ALBERT-base", "LR-ALBERT", "ALBERT-base", "memory", 0.5, "F-ALBERT paper"),
    ("F-ALBERT vs LR-ALBERT", "F-ALBERT", "LR-ALBERT", "speed", 1.2, "F-ALBERT paper"),
    ("F-ALBERT vs LR-ALBERT", "F-ALBERT", "LR-ALBERT", "memory", 0.85, "F-ALBERT paper"),
    ("LR-ALBERT-large vs ALBERT-large", "LR-ALBERT-large", "ALBERT-large", "speed", 2.0,
     "F-ALBERT paper"),
    ("LR-ALBERT-large vs ALBERT-large", "LR-ALBERT-large", "ALBERT-large", "memory", 0.5,
     "F-ALBERT paper"),
    ("F-ALBERT-large vs LR-ALBERT-large", "F-ALBERT-large", "LR-ALBERT-large", "speed", 1.4,
     "F-ALBERT paper"),
    ("F-ALBERT-large vs LR-ALBERT-large", "F-ALBERT-large", "LR-ALBERT-large", "memory", 0.85,
     "F-ALBERT paper"),
    ("MiniALBERT-768 vs DistilBERT", "MiniALBERT-768", "DistilBERT", "speed", 1.0,
     "MiniALBERT paper (same latency as a 6x768 model)"),
    ("MiniALBERT-768 vs DistilBERT", "MiniALBERT-768", "DistilBERT", "memory", 1.0,
     "MiniALBERT paper"),
]


def column(r: dict) -> str:
    """The report's column: the backend, with the dtype on a GPU ("torch fp16")."""
    return r.get("column", r["backend"])


def quantity(r: dict, what: str) -> float:
    """Speed is sentences/s; memory is peak GPU memory on a GPU, peak RSS on the CPU."""
    if what == "speed":
        return r["sentences_per_s"]
    return r["peak_gpu_mb"] if "peak_gpu_mb" in r else r["peak_rss_mb"]


def _get(results, model, col, loop="unroll"):
    for r in results:
        if r["model"] == model and column(r) == col and (r["loop"] in (None, loop)) \
                and "error" not in r:
            return r
    return None


def _machine(results: list[dict], references: dict[str, float], rates: dict | None,
             versions: dict | None) -> str:
    versions = versions or {}
    measured = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in (rates or {}).items())
    on_gpu = {r["dtype"]: r["gemm_gflop_per_s"] for r in results
              if r.get("device", "cpu") != "cpu" and "gemm_gflop_per_s" in r}
    if not on_gpu and "gpu" in versions:  # fine-tuning rows only: this run's rate
        on_gpu = {d: v / 1e9 for d, v in references.items()}
    if on_gpu:  # the rows of each dtype against the GEMM rate of their own run
        where = (f"{versions.get('gpu', 'a GPU')} (CUDA {versions.get('cuda')}), GEMM at the "
                 "compute dtype " + ", ".join(f"{d} {g / 1e3:.0f}" for d, g in on_gpu.items())
                 + f" TFLOP/s, each measured in its dtype's run (this run: {measured})")
        memory = "peak GPU memory (torch.cuda.max_memory_allocated)"
    else:
        by_dtype = ", ".join(f"{d} {v / 1e9:.0f}" for d, v in references.items())
        where = (f"{available_cores()} cores, GEMM {by_dtype} GFLOP/s measured in this run "
                 f"({measured})")
        memory = "peak RSS of the measuring process"
    used = ", ".join(f"{k} {v}" for k, v in versions.items() if k not in ("gpu", "cuda"))
    return f"Machine: {where}; {used}. Memory is {memory}."


def write(folder: Path, results: list[dict], references: dict[str, float],
          rates: dict | None = None,
          versions: dict | None = None) -> None:
    trained = [r for r in results if r.get("mode") == "training"]
    by_depth = [r for r in results if r.get("iterations") is not None]
    results = [r for r in results if r.get("iterations") is None and r not in trained]
    backends = list(dict.fromkeys(column(r) for r in results))
    quick = results and all(r.get("preset") == "tiny" for r in results)
    sizes = ("the tiny test presets (--quick: a check that the harness works, not the "
             "papers' sizes)" if quick else "the papers' sizes")
    lines = ["# distilserve bench", "", _machine(results, references, rates, versions) + (
        " Efficiency is achieved FLOP/s (counted FLOPs x sentences/s) over the GEMM rate of "
        "the dtype the row computes in (ONNX Runtime's in fp32, an int8 export's in int8). "
        f"Batches of {results[0]['batch_size']} x {results[0]['length']} random token ids, "
        "median of repeats (min-max in brackets), each model in its own process. Fresh "
        f"weights at {sizes} (speed does not depend on weight values)." if results else ""), ""]
    # the papers' rows, which the throughput, memory and parameters charts draw
    papers = any("error" not in r and "fidelity" not in r and r["loop"] in (None, "unroll")
                 for r in results)
    measured, claims = {r["model"] for r in results}, []
    for what, num, den, qty, paper, source in CLAIMS if papers else ():
        if not {num, den} <= measured:  # e.g. the large ALBERTs, measured by --training
            continue
        cells = []
        for b in backends:
            a, d = _get(results, num, b), _get(results, den, b)
            cells.append(f"{quantity(a, qty) / quantity(d, qty):.2f}" if a and d else "-")
        claims.append(f"| {what} ({qty}) | {paper:.2f} | " + " | ".join(cells) + f" | {source} |")
    if papers:
        lines += ["![throughput](throughput.png)", ""]
    if claims:  # (none where no claim's two models were measured: --quick's tiny presets)
        lines += ["## The papers' claims, measured", "",
                  "| claim | paper | " + " | ".join(backends) + " | source |",
                  "|---|---|" + "---|" * len(backends) + "---|", *claims]
    lines += ["", "## All measurements", "",
              "| model | backend | loop | params (M) | GFLOP/sent. | sentences/s | "
              "batch-1 p50/p95 ms | peak memory MB | efficiency |",
              "|---|---|---|---|---|---|---|---|---|"] if results else []
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {column(r)} | {r['loop'] or ''} | | | "
                         f"failed: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['model']} | {column(r)} | {r['loop'] or ''} | {r['parameters'] / 1e6:.1f} "
            f"| {r['flops_per_sentence'] / 1e9:.3f} | {r['sentences_per_s']:.1f} "
            f"({r['sentences_per_s_min']:.0f}-{r['sentences_per_s_max']:.0f}) | "
            f"{r['latency_ms_p50']:.1f} / {r['latency_ms_p95']:.1f} | "
            f"{quantity(r, 'memory'):.0f} | "
            f"{format(r['efficiency'], '.0%') if 'efficiency' in r else '-'} |")
    if papers:
        lines += ["", "![memory](memory.png)", "", "![throughput vs parameters](params.png)"]
    lines.append("")
    students = [r for r in results if "fidelity" in r and "error" not in r]
    if students:
        lines += ["## Distilled students: speed against fidelity to MiniLM", "",
                  "Students distilled from all-MiniLM-L6-v2 by `distilserve distill` "
                  "(distilserve/training/distill.py); fidelity on held-out docstring sentences: Spearman "
                  "correlation of pairwise cosine similarities with the teacher's, and "
                  "top-10 neighbour overlap.", "",
                  "| student | backend | loop | params (M) | sentences/s | Spearman | "
                  "top-10 overlap |", "|---|---|---|---|---|---|---|"]
        for r in teacher_rows(results, students) + students:
            f = r.get("fidelity", {"spearman": 1.0, "top10_overlap": 1.0})
            lines.append(f"| {r['model']} | {r['backend']} | {r['loop'] or ''} | "
                         f"{r['parameters'] / 1e6:.1f} | "
                         f"{r['sentences_per_s']:.1f} | {f['spearman']:.3f} | "
                         f"{f['top10_overlap']:.3f} |")
        lines += ["", "![throughput vs fidelity](fidelity.png)", ""]
    if by_depth:
        lines += depth_table(by_depth)
    if trained:
        lines += training_table(trained)
    (folder / "REPORT.md").write_text("\n".join(lines))
    charts(folder, results + by_depth + trained)


def training_table(rows: list[dict]) -> list[str]:
    """Fine-tuning steps (distilserve/bench/training.py): every row, and the papers' memory
    and speed claims as training measures them, each with what its memory is made of; a
    section per device and dtype measured."""
    first = rows[0]
    lines = ["## Fine-tuning", "",
             f"One fine-tuning step as the papers fine-tune (forward, a classification "
             f"head's cross-entropy, backward, AdamW) on {first['batch_size']} x "
             f"{first['length']} random token ids, each model in its own process, the median "
             "of the timed steps after a first. fp16 and bf16 are mixed precision "
             "(torch.autocast; the weights, gradients and AdamW state stay fp32, fp16 with a "
             "gradient scaler). Memory: the step's peak "
             f"({first.get('memory', 'peak memory')}); the activations kept for the backward "
             "pass (the tensors saved for it, parameters left out); the parameters' own bytes "
             "(gradients take as many, AdamW's state twice as many).", ""]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("device", "cpu"), r.get("dtype", "fp32")), []).append(r)
    for (device, dtype), group in groups.items():
        if len(groups) > 1:
            lines += [f"### {dtype} on {device}", ""]
        lines += _training_group(group)
    return lines + ["![fine-tuning by reuses](training.png)", ""]


def _training_group(rows: list[dict]) -> list[str]:
    claims = []
    for what, num, den, qty, paper, _ in CLAIMS:
        a, d = _get(rows, num, "training"), _get(rows, den, "training")
        if qty != "memory" or not (a and d):
            continue
        speed = next((p for w, _, _, q, p, _ in CLAIMS if w == what and q == "speed"), None)
        fixed = 3 * a["parameter_mb"]  # gradients and AdamW's two moments
        claims.append(
            f"| {what} | memory {paper:.2f}" + (f", speed {speed:.2f}" if speed else "")
            + f" | {a['step_memory_mb'] / d['step_memory_mb']:.2f} | "
            f"{a['activations_mb'] / d['activations_mb']:.2f} | "
            f"{a['sentences_per_s'] / d['sentences_per_s']:.2f} | "
            f"activations {a['activations_mb']:.0f} against {d['activations_mb']:.0f} MB; "
            f"gradients and AdamW state (3x the parameters) {fixed:.0f} against "
            f"{3 * d['parameter_mb']:.0f} MB |")
    lines = ["| claim | paper | step memory | activations | fine-tuning speed | why it differs |",
             "|---|---|---|---|---|---|", *claims, ""] if claims else []
    lines += ["| model | reuses | params (M) | parameters MB | activations MB | step "
              "memory MB | step ms | sentences/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | | | | | failed: {r['error']} | | |")
            continue
        lines.append(f"| {r['model']} | {r.get('reuses') or ''} | {r['parameters'] / 1e6:.1f} "
                     f"| {r['parameter_mb']:.0f} | {r['activations_mb']:.0f} | "
                     f"{r['step_memory_mb']:.0f} | {r['step_ms']:.0f} | "
                     f"{r['sentences_per_s']:.1f} |")
    return lines + [""]


def depth_table(rows: list[dict]) -> list[str]:
    """The recursive models at each depth a request may choose (``iterations``)."""
    lines = ["## Depth per request", "",
             "A recursive model's shared layer applied fewer times than trained (a request's "
             "`iterations`), its loop kept (ONNX, TorchScript) or its checkpoint (torch); "
             "a distilled student's fidelity at that depth, measured as above.", "",
             "| model | backend | iterations | GFLOP/sent. | sentences/s | batch-1 p50 ms | "
             "Spearman | top-10 overlap |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {column(r)} | {r['iterations']} | | failed: "
                         f"{r['error']} | | | |")
            continue
        f = r.get("fidelity")
        lines.append(f"| {r['model']} | {column(r)} | {r['iterations']} | "
                     f"{r['flops_per_sentence'] / 1e9:.3f} | {r['sentences_per_s']:.1f} | "
                     f"{r['latency_ms_p50']:.1f} | "
                     + (f"{f['spearman']:.3f} | {f['top10_overlap']:.3f} |" if f else "- | - |"))
    return lines + ["", "![speed and fidelity by depth](depths.png)", ""]


def teacher_rows(results: list[dict], students: list[dict]) -> list[dict]:
    """The teacher's architecture (MiniLM-L6) on the students' backends: fidelity 1."""
    backends = {r["backend"] for r in students}
    return [{**r, "model": "MiniLM-L6 (the teacher)"} for r in results
            if r.get("preset") == "minilm-l6" and "error" not in r
            and r["backend"] in backends and r["loop"] in (None, "unroll")]


def charts(folder: Path, results: list[dict]) -> None:
    try:
        import matplotlib
    except ImportError:  # the report is written; the charts can be drawn elsewhere
        print(f"bench: charts not drawn (matplotlib is not installed): `python -m distilserve.bench.report "
              f"{folder}` draws them from its results.json", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    deep = [r for r in results if "error" not in r and r.get("iterations") is not None]
    if deep:
        depth_chart(folder, deep, plt)
    swept = [r for r in results if "error" not in r and r.get("mode") == "training"
             and r.get("family") == "falbert"]
    if swept:
        training_chart(folder, swept, plt)
    measured = [r for r in results if "error" not in r and r["loop"] in (None, "unroll")
                and r.get("iterations") is None and r.get("mode") != "training"]
    if not measured:  # every row failed (REPORT.md says why): no empty axes
        if not deep and not swept:
            print("bench: charts not drawn: no row was measured", file=sys.stderr)
        return
    students = [r for r in measured if "fidelity" in r]
    if students:
        fig, ax = plt.subplots(figsize=(8, 5))
        for r in teacher_rows(results, students) + students:
            x = r.get("fidelity", {"spearman": 1.0})["spearman"]
            ax.scatter(x, r["sentences_per_s"])
            ax.annotate(f"{r['model']} ({r['backend']})", (x, r["sentences_per_s"]),
                        fontsize=8)
        ax.set_xlabel("fidelity to MiniLM (Spearman of pairwise similarities)")
        ax.set_ylabel("sentences/s")
        ax.set_yscale("log")
        ax.set_title("distilled students: speed against fidelity")
        fig.tight_layout()
        fig.savefig(folder / "fidelity.png", dpi=100)
        plt.close(fig)
    ok = [r for r in measured if "fidelity" not in r]  # the papers' rows
    if not ok:  # students alone
        return
    models = list(dict.fromkeys(r["model"] for r in ok))
    backends = list(dict.fromkeys(column(r) for r in ok))
    for name, key, label in (("throughput", "speed", "sentences/s"),
                             ("memory", "memory", "peak memory (MB)")):
        fig, ax = plt.subplots(figsize=(12, 5))
        width = 0.8 / max(len(backends), 1)
        for i, b in enumerate(backends):
            values = [next((quantity(r, key) for r in ok if r["model"] == m and column(r) == b), 0)
                      for m in models]
            ax.bar(np.arange(len(models)) + i * width, values, width, label=b)
        ax.set_xticks(np.arange(len(models)) + width * (len(backends) - 1) / 2)
        ax.set_xticklabels(models, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend()
        ax.set_title(f"{label} per model and backend (loop unrolled)")
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    for b in backends:
        rows = [r for r in ok if column(r) == b]
        ax.scatter([r["parameters"] / 1e6 for r in rows], [r["sentences_per_s"] for r in rows],
                   label=b)
    for r in ok:
        if column(r) == backends[0]:
            ax.annotate(r["model"], (r["parameters"] / 1e6, r["sentences_per_s"]), fontsize=7)
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("sentences/s")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("throughput against parameters")
    fig.tight_layout()
    fig.savefig(folder / "params.png", dpi=100)
    plt.close(fig)


def depth_chart(folder: Path, rows: list[dict], plt) -> None:
    """depths.png: sentences/s by iterations, one line per model and backend; beside it,
    for the distilled students, sentences/s against fidelity, each point a depth."""
    lines = {}
    for r in rows:
        lines.setdefault(f"{r['model']} ({column(r)})", []).append(r)
    students = {name: rs for name, rs in lines.items() if all("fidelity" in r for r in rs)}
    fig, axes = plt.subplots(1, 2 if students else 1, figsize=(13 if students else 7, 5),
                             squeeze=False)
    speed = axes[0][0]
    for name, rs in lines.items():
        speed.plot([r["iterations"] for r in rs], [r["sentences_per_s"] for r in rs],
                   marker="o", label=name)
    speed.set_xlabel("iterations (the request's depth)")
    speed.set_ylabel("sentences/s")
    speed.set_title("speed by depth")
    speed.legend(fontsize=7)
    if students:
        trade = axes[0][1]
        for name, rs in students.items():
            xs = [r["fidelity"]["spearman"] for r in rs]
            ys = [r["sentences_per_s"] for r in rs]
            trade.plot(xs, ys, marker="o", label=name)
            for r, x, y in zip(rs, xs, ys):
                trade.annotate(str(r["iterations"]), (x, y), fontsize=8)
        trade.set_xlabel("fidelity to MiniLM (Spearman of pairwise similarities)")
        trade.set_ylabel("sentences/s")
        trade.set_title("distilled students: speed against fidelity, by depth")
        trade.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "depths.png", dpi=100)
    plt.close(fig)


def training_chart(folder: Path, rows: list[dict], plt) -> None:
    """training.png: the ALBERTs' fine-tuning memory and speed against their reuses, a line
    per size and dtype (every reuse with the whole FFN); F-ALBERT's shrinking FFN as stars."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        size = next((s for s in ("large", "tiny") if s in r["preset"]), "base")
        shrinking = r["preset"].startswith("falbert") and r["preset"] != "tiny"
        series.setdefault((size, r.get("dtype", "fp32"), shrinking), []).append(r)
    fig, (memory, speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (size, dtype, shrinking), group in sorted(series.items()):
        group.sort(key=lambda r: r["reuses"])
        label = f"{'F-ALBERT' if shrinking else 'ALBERT'} {size} {dtype}"
        style = dict(marker="*", markersize=11, linestyle="none") if shrinking else \
            dict(marker="o")
        reuses = [r["reuses"] for r in group]
        line, = memory.plot(reuses, [r["step_memory_mb"] for r in group],
                            label=f"{label}: step peak", **style)
        kept = {**style, "marker": "x"} if shrinking else dict(marker="x", linestyle="--")
        memory.plot(reuses, [r["activations_mb"] for r in group], color=line.get_color(),
                    label=f"{label}: activations", **kept)
        speed.plot(reuses, [r["sentences_per_s"] for r in group], label=label,
                   color=line.get_color(), **style)
    for axis, title, unit in ((memory, "fine-tuning memory", "MB"),
                              (speed, "fine-tuning speed", "sentences/s")):
        axis.set_xlabel("layer reuses")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "training.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "results.json").is_file():
        print("usage: python -m distilserve.bench.report FOLDER (a bench run's output: its results.json)",
              file=sys.stderr)
        return 2
    folder = Path(args[0])
    charts(folder, json.loads((folder / "results.json").read_text())["results"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
