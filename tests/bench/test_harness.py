"""The bench's timing (the fastest of several runs, each ended by its synchronisation) and
its efficiency figures."""

from __future__ import annotations

import json
import time

import pytest
import torch

from distilserve.bench import gemm, harness
from distilserve.server.cli import main


def test_fastest_times_each_run_to_its_sync_and_leaves_the_warm_up_out():
    calls, synced, pauses = [], [], iter([0.05, 0.02, 0.0, 0.03])

    def fn():
        calls.append(len(synced))  # how many runs had been synchronised before this one

    def sync():
        time.sleep(next(pauses))  # the work finishing: the warm-up's 0.05 s is not counted
        synced.append(True)

    best = gemm.fastest(fn, 3, sync)
    assert calls == [0, 1, 2, 3] and len(synced) == 4
    assert best < 0.015  # the run whose work took no time, not the warm-up or the mean


@pytest.mark.slow  # timed GEMMs
def test_cpu_gemm_rates_are_plausible_flop_rates():
    rates = gemm.gemm_rates(threads=1, runs=1)
    assert set(rates) == {f"{lib} {shape}" for lib in ("torch", "onnxruntime")
                          for shape in ("square 2048", "ffn 16384x768x3072")} | {
        "torch bf16 ffn 16384x768x3072", "onnxruntime int8 ffn 16384x768x3072"}
    assert all(1e8 < r < 1e13 for r in rates.values())
    assert set(gemm.reference_rates(rates)) == {"fp32", "bf16", "int8"}


def test_each_row_is_scored_against_the_gemm_rate_of_the_dtype_it_computes_in():
    """On the CPU in bf16, the torch rows against the bf16 rate; ONNX Runtime's in fp32
    and an int8 export's in int8, whatever the run's dtype."""
    references = gemm.reference_rates({"torch square 2048": 150e9, "onnxruntime ffn": 200e9,
                                       "torch bf16 ffn": 400e9, "onnxruntime int8 ffn": 600e9})
    assert references == {"fp32": 200e9, "bf16": 400e9, "int8": 600e9}
    rows = [{"backend": b, "device": "cpu", "dtype": "bf16", "gflop_per_s": 100.0}
            for b in ("torch", "torchscript", "onnx", "onnx-int8")]
    harness.rescore(rows, references, "cpu", "bf16")
    assert [r["efficiency"] for r in rows] == [0.25, 0.25, 0.5, 100 / 600]
    assert [r["gemm_gflop_per_s"] for r in rows] == [400, 400, 200, 600]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_gpu_gemm_rates_are_plausible_flop_rates():
    rates = gemm.gpu_gemm_rates("cuda", "fp16", runs=2)
    assert all(1e12 < r < 1e16 for r in rates.values())


def _gpu_row(dtype: str, gemm: float, achieved: float) -> dict:
    return {"model": "DistilBERT", "device": "cuda:0", "dtype": dtype, "gflop_per_s": achieved,
            "gemm_gflop_per_s": gemm, "efficiency": achieved / gemm}


@pytest.mark.parametrize("family", ["bert", "distilbert", "minialbert", "falbert"])
def test_counted_flops_include_attention(family):
    """Attention's matmuls grow with the square of the length, the rest linearly: doubling
    the length more than doubles the count (the CPU's fused attention had counted 0)."""
    from distilserve.models.io import checkpoint

    model = checkpoint.new(family, "tiny").model.eval()
    assert harness.flops_per_sentence(model, 32) > 2 * harness.flops_per_sentence(model, 16)


def test_a_resumed_run_rescores_its_own_dtype_only():
    """fp32 then fp16 into one folder: the fp16 run's GEMM rate is 15 times the fp32
    run's, and must not become the fp32 rows' reference."""
    fp32, fp16 = _gpu_row("fp32", 52_000, 44_000), _gpu_row("fp16", 700_000, 280_000)
    harness.rescore([fp32, fp16], {"fp16": 760_000e9}, "cuda:0", "fp16")
    assert fp32["efficiency"] == 44_000 / 52_000 and fp32["gemm_gflop_per_s"] == 52_000
    assert fp16["efficiency"] == 280_000 / 760_000 and fp16["gemm_gflop_per_s"] == 760_000


def test_a_gpu_report_names_each_dtypes_gemm_rate():
    from distilserve.bench import report

    rows = [_gpu_row("fp32", 52_000, 44_000), _gpu_row("fp16", 760_000, 280_000)]
    line = report._machine(rows, {"fp16": 760_000e9}, {"torch fp16 square 8192": 760_000e9},
                           {"gpu": "NVIDIA H100", "cuda": "13.0", "torch": "2.11.0"})
    assert "GEMM at the compute dtype fp32 52, fp16 760 TFLOP/s" in line
    assert "NVIDIA H100" in line and "torch 2.11.0" in line and "peak GPU memory" in line


@pytest.mark.slow  # the harness's worker processes
def test_a_dtype_a_family_does_not_run_in_leaves_its_rows_out(tmp_path, fixed_gemm_rates):
    """Every row in fp16 (as on a GPU; torch runs fp16 on the CPU too): CMOW has no fp16,
    so its row is left out and said so, not recorded as a failure."""
    said = []
    opts = harness.Options(output=tmp_path, batch_size=2, length=8, repeats=1, latency_runs=1,
                           threads=1, dtype="fp16", backends=("torch",),
                           rows=[harness.Row("bert tiny", "bert", "tiny"),
                                 harness.Row("cmow tiny", "cmow", "tiny")])
    results = harness.measure_all(opts, said.append)
    assert [(r["model"], "error" in r) for r in results] == [("bert tiny", False)]
    assert "cmow tiny: left out, cmow does not run in fp16" in said


def test_bench_refuses_a_length_past_a_models_positions(capsys, tmp_path,
                                                         fixed_gemm_rates):
    assert main(["bench", "--quick", "--models", "bert tiny", "--length", "129", "--output",
                 str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "distilserve bench: --length 129: bert tiny takes at most 128 tokens (its position "
        "embeddings)")


def test_an_artifact_exported_for_another_length_is_exported_again(tmp_path):
    """A folder's artifacts outlive its results (deleted to measure again): one exported
    at another --length is not measured as if exported at this one."""
    from distilserve.models.io.manifest import Manifest

    row = harness.Row("bert tiny", "bert", "tiny")
    for length in (16, 40):
        opts = harness.Options(output=tmp_path, length=length)
        spec = harness.prepare(row, "onnx", "unroll", opts)
        assert Manifest.read(spec["folder"]).max_length == length


def test_bench_adds_no_rows_of_another_shape_to_a_folder(capsys, tmp_path, fixed_gemm_rates):
    """A resumed row's key names no batch shape: rows of two shapes in one folder would be
    reported as one; fine-tuning rows name theirs."""
    out = tmp_path / "out"
    out.mkdir()
    rows = [{"key": "bert tiny|onnx|unroll", "mode": "inference", "batch_size": 8,
             "length": 16},
            {"key": "bert tiny|training|32x128|cpu|fp32", "mode": "training",
             "batch_size": 32, "length": 128}]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["bench", "--quick", "--models", "bert tiny", "--length", "32", "--output",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"distilserve bench: {out} holds measurements of batches of 8 x 16 tokens, not "
        "8 x 32: name another --output, or give its --batch-size and --length")
    assert sorted(p.name for p in out.iterdir()) == ["results.jsonl"]


def _graphs_run(tmp_path, device: str) -> list[dict]:
    opts = harness.Options(output=tmp_path, batch_size=2, length=8, repeats=1, latency_runs=1,
                           threads=1, device=device, dtype="fp16" if device != "cpu" else "fp32",
                           cuda_graphs=True, backends=("torch",),
                           rows=[harness.Row("bert tiny", "bert", "tiny")])
    return harness.measure_all(opts, lambda said: None)


@pytest.mark.slow  # the harness's worker processes
def test_cuda_graphs_without_a_gpu_are_a_clear_error(tmp_path, capsys, fixed_gemm_rates):
    assert main(["bench", "--quick", "--cuda-graphs", "--output", str(tmp_path)]) == 2
    assert "--cuda-graphs needs a GPU (--device cuda)" in capsys.readouterr().err
    [result] = _graphs_run(tmp_path, "cpu")  # the worker says so too
    assert result["error"] == ("CUDA graphs need the torch or TorchScript backend on a GPU, "
                               "not torch on cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_cuda_graphs_get_a_column_of_their_own(tmp_path):
    [result] = _graphs_run(tmp_path, "cuda")
    assert "error" not in result, result
    assert result["column"] == "torch fp16 graphs" and result["key"].endswith("|graphs")
    assert result["sentences_per_s"] > 0


@pytest.mark.slow  # the harness's worker processes
def test_depths_measure_each_recursive_row_at_every_depth_with_a_students_fidelity(
        tmp_path, fixed_gemm_rates):
    """--depths: the recursive rows at iterations 1 to theirs, the loop kept (onnx) and the
    checkpoint (torch), fewer iterations fewer FLOPs; a distilled student's fidelity at
    each depth from its distillation record; the report's table and chart."""
    from distilserve.models.io import checkpoint

    student = tmp_path / "students" / "minialbert"
    checkpoint.save(checkpoint.new("minialbert", "tiny", "embed"), student)
    by_depth = {str(d): {"spearman": d / 10, "top10_overlap": d / 20, "sentences": 5}
                for d in (1, 2, 3)}
    (student / "distillation.json").write_text(json.dumps({
        "family": "minialbert", "preset": "tiny", "fidelity": by_depth["3"],
        "fidelity_by_depth": by_depth}))
    opts = harness.Options(output=tmp_path / "out", batch_size=2, length=8, repeats=1,
                           latency_runs=1, threads=1, backends=("onnx", "torch"), depths=True,
                           rows=harness.student_rows(tmp_path / "students"))
    results = harness.measure_all(opts, lambda said: None)
    deep = [r for r in results if r["iterations"] is not None]
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    assert [(r["backend"], r["loop"], r["iterations"]) for r in deep] == [
        ("onnx", "keep", 1), ("onnx", "keep", 2), ("onnx", "keep", 3),
        ("torch", "unroll", 1), ("torch", "unroll", 2), ("torch", "unroll", 3)]
    assert [r["fidelity"]["spearman"] for r in deep[:3]] == [0.1, 0.2, 0.3]
    flops = [r["flops_per_sentence"] for r in deep[:3]]
    assert flops[0] < flops[1] < flops[2]
    assert flops[2] == next(r["flops_per_sentence"] for r in results
                            if r["iterations"] is None and r["backend"] == "onnx")
    assert harness._depth_jobs([harness.Row("bert tiny", "bert", "tiny")], ("onnx",)) == []
    written = (opts.output / "REPORT.md").read_text()
    assert "## Depth per request" in written and "| minialbert student | onnx | 2 |" in written
    assert (opts.output / "depths.png").stat().st_size > 0
    again = harness.measure_all(opts, lambda said: None)  # resumed: nothing measured again
    assert [r["key"] for r in again] == [r["key"] for r in results]
