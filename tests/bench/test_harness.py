"""The bench's timing: the fastest of several runs, each ended by its synchronisation."""

from __future__ import annotations

import time

import pytest
import torch

from bench import harness


def test_fastest_times_each_run_to_its_sync_and_leaves_the_warm_up_out():
    calls, synced, pauses = [], [], iter([0.05, 0.02, 0.0, 0.03])

    def fn():
        calls.append(len(synced))  # how many runs had been synchronised before this one

    def sync():
        time.sleep(next(pauses))  # the work finishing: the warm-up's 0.05 s is not counted
        synced.append(True)

    best = harness.fastest(fn, 3, sync)
    assert calls == [0, 1, 2, 3] and len(synced) == 4
    assert best < 0.015  # the run whose work took no time, not the warm-up or the mean


def test_cpu_gemm_rates_are_plausible_flop_rates():
    rates = harness.gemm_rates(threads=1, runs=1)
    assert set(rates) == {f"{lib} {shape}" for lib in ("torch", "onnxruntime")
                          for shape in ("square 2048", "ffn 16384x768x3072")}
    assert all(1e8 < r < 1e13 for r in rates.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_gpu_gemm_rates_are_plausible_flop_rates():
    rates = harness.gpu_gemm_rates("cuda", "fp16", runs=2)
    assert all(1e12 < r < 1e16 for r in rates.values())
