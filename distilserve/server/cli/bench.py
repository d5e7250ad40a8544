"""``distilserve bench``: the benchmark harness."""

from __future__ import annotations

import argparse
from pathlib import Path

from distilserve.server.cli.common import Refused, at_least, status


def add(sub) -> None:
    bench = sub.add_parser("bench", help="throughput, latency and memory of every family",
                           description="Measures every paper-size model x backend x loop "
                           "form, each in its own process, and writes results.json, "
                           "REPORT.md and charts; resumes where it stopped.")
    bench.add_argument("--output", type=Path, default=Path("bench-results"),
                       help="folder for results, report and charts (default bench-results; "
                       "the committed report is bench/)")
    bench.add_argument("--quick", action="store_true",
                       help="tiny presets, one backend, seconds: checks the harness")
    bench.add_argument("--batch-size", type=at_least(1),
                       help="sentences per batch (default 256; --training 32; --quick 8)")
    bench.add_argument("--length", type=at_least(1),
                       help="tokens per sentence (default 64; --training 128; --quick 16)")
    bench.add_argument("--batches", type=at_least(1), default=1, help="batches per timed run")
    bench.add_argument("--repeats", type=at_least(1),
                       help="timed runs, the median reported (default 3; --quick 2)")
    bench.add_argument("--threads", type=at_least(0), default=0,
                       help="intra-op threads (0: all cores)")
    bench.add_argument("--device", default="cpu",
                       help="cpu, or cuda[:N]: the torch and torchscript backends on a "
                       "GPU (auto: a GPU where one is visible)")
    bench.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"],
                       help="compute dtype (fp16 and bf16: the torch and TorchScript "
                       "backends; bf16 on the CPU where it has bf16 matrix units)")
    bench.add_argument("--cuda-graphs", action="store_true",
                       help="on a GPU, run each timed shape from a CUDA graph (one launch "
                       "per batch, as DISTILSERVE_CUDA_GRAPH_TOKENS serves small batches)")
    bench.add_argument("--backends", help="comma-separated: torch,torchscript,onnx,onnx-int8")
    bench.add_argument("--models", help="comma-separated model names or presets")
    bench.add_argument("--students", type=Path,
                       help="also measure the distilled students in this folder")
    bench.add_argument("--training", action="store_true",
                       help="fine-tuning steps instead (forward, a classification head's "
                       "loss, backward, AdamW): the ALBERTs by reuses, and the speed table's "
                       "rows, with sentences/s and memory told apart (parameters, "
                       "activations, the step's peak)")
    bench.add_argument("--depths", action="store_true",
                       help="also measure the recursive models at every depth a request may "
                       "choose (iterations 1 to theirs): the loop kept (onnx, torchscript) "
                       "and the checkpoint (torch), with a student's fidelity at each")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from distilserve.bench import harness
    from distilserve.models.runtime.base import BackendError, check_device
    from distilserve.models.runtime.torch_device import resolve_device

    try:  # as the service's: cpu, cuda, cuda:N or auto (a GPU where one is visible)
        device = resolve_device(check_device(args.device))
    except BackendError as e:
        raise Refused(f"--device: {e}") from None
    args.device = "cpu" if device.type == "cpu" else args.device.replace("auto", "cuda")
    if args.cuda_graphs and args.device == "cpu":
        raise Refused("--cuda-graphs needs a GPU (--device cuda)")
    if args.backends and (unknown := set(args.backends.split(",")) - set(harness.BACKENDS)):
        raise Refused(f"--backends: unknown {', '.join(sorted(unknown))} (of "
                      f"{','.join(harness.BACKENDS)})")
    if args.students and not args.students.is_dir():
        raise Refused(f"--students: {args.students} is not a folder")
    training, quick = args.training, args.quick  # their own defaults, where not given
    opts = harness.Options(output=args.output,
                           batch_size=args.batch_size or (8 if quick else 32 if training else 256),
                           length=args.length or (16 if quick else 128 if training else 64),
                           batches=args.batches, repeats=args.repeats or (2 if quick else 3),
                           threads=args.threads,
                           device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
                           depths=args.depths, training=training)
    onnx_runs = (args.device, args.dtype) == ("cpu", "fp32")  # ONNX Runtime: fp32, the CPU
    if not onnx_runs:
        opts.backends = ("torch", "torchscript")
    if args.quick:
        opts.rows = list(harness.QUICK_ROWS)
        opts.training_rows = list(harness.QUICK_TRAINING_ROWS)
        opts.backends = ("onnx",) if onnx_runs else ("torch",)
        opts.latency_runs = 5
    if args.backends:
        opts.backends = tuple(args.backends.split(","))
    if not onnx_runs and (onnx := [b for b in opts.backends if b.startswith("onnx")]):
        raise Refused(f"--backends {','.join(onnx)}: ONNX Runtime runs fp32 on the CPU, not "
                      f"{args.dtype} on {args.device} (the torch and torchscript backends do)")
    if args.students:
        opts.rows += harness.student_rows(args.students)
    if args.models:
        wanted = {m.strip() for m in args.models.split(",")}
        rows = opts.training_rows if training else opts.rows
        if unknown := wanted - {n for r in rows for n in (r.name, r.preset)}:
            raise Refused(f"--models: no model or preset {', '.join(sorted(unknown))} (of "
                          f"{', '.join(r.name for r in rows)})")
        chosen = [r for r in rows if r.name in wanted or r.preset in wanted]
        if training:
            opts.training_rows = chosen
        else:
            opts.rows = chosen
    with status("bench") as progress:
        try:
            results = harness.measure_all(opts, progress)
        except harness.CannotMeasure as e:
            raise Refused(str(e)) from None
    failed = [r["key"] for r in results if "error" in r]
    print(f"{len(results)} measurements in {opts.output} (REPORT.md, results.json, charts)"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
