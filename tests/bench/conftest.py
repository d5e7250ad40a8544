import pytest

from distilserve.bench import harness


@pytest.fixture
def fixed_gemm_rates(monkeypatch):
    """The machine's GEMM rates as figures, not measured: for the tests of what the harness
    measures with them (the rates themselves: test_cpu_gemm_rates_are_plausible_flop_rates)."""
    rates = {"torch square 2048": 190e9, "onnxruntime ffn 16384x768x3072": 196e9,
             "torch bf16 ffn 16384x768x3072": 376e9, "onnxruntime int8 ffn 16384x768x3072": 724e9}
    monkeypatch.setattr(harness, "gemm_rates", lambda threads, runs=5: dict(rates))
    return rates
