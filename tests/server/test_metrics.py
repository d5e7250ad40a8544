"""server/metrics.py: Triton's statistics are the per-model series, added up."""

from __future__ import annotations

from types import SimpleNamespace

from server.metrics import Metrics


def duration(count: int, seconds: float) -> dict:
    return {"count": count, "ns": round(seconds * 1e9)}


def test_tritons_statistics_are_the_models_series():
    metrics = Metrics()
    series = metrics.model("m")
    for size, seconds in ((2, 0.5), (2, 0.25), (1, 0.125)):
        series.observe_batch(size, seconds)
    series.observe_result(SimpleNamespace(queued_s=0.1, tokenize_s=0.2, inference_s=0.5), 1.0)
    series.failed.observe(0.3)
    series.postprocessed.observe(0.0625)
    metrics.model("other")  # served, never asked
    m, other = metrics.statistics(["m", "other"])
    assert m.pop("last_inference") > 1.7e12  # milliseconds since the epoch
    assert m == {
        "name": "m", "version": "1", "inference_count": 5, "execution_count": 3,
        "inference_stats": {
            "success": duration(1, 1.0), "fail": duration(1, 0.3),
            "queue": duration(1, 0.1), "compute_input": duration(1, 0.2),
            "compute_infer": duration(1, 0.5), "compute_output": duration(1, 0.0625),
            "cache_hit": duration(0, 0), "cache_miss": duration(0, 0)},
        "batch_stats": [{"batch_size": 1, "compute_infer": duration(1, 0.125)},
                        {"batch_size": 2, "compute_infer": duration(2, 0.75)}]}
    assert other["last_inference"] == 0 and other["execution_count"] == 0
    assert other["batch_stats"] == [] and other["inference_stats"]["success"] == duration(0, 0)
    # a name never served is all zeros too (the route answers 404 before asking)
    assert metrics.statistics(["nope"])[0]["inference_count"] == 0


def test_tritons_own_series_are_the_statistics_when_scraped():
    metrics = Metrics()
    series = metrics.model("m")
    series.observe_batch(3, 0.5)
    series.observe_result(SimpleNamespace(queued_s=0.125, tokenize_s=0.25, inference_s=0.5),
                          1.0)
    series.failed.observe(0.5)
    lines = set(metrics.render().decode().splitlines())
    for name, value in (("request_success", "1.0"), ("request_failure", "1.0"),
                        ("count", "3.0"), ("exec_count", "1.0"),
                        ("request_duration_us", "1.5e+06"), ("queue_duration_us", "125000.0"),
                        ("compute_input_duration_us", "250000.0"),
                        ("compute_infer_duration_us", "500000.0"),
                        ("compute_output_duration_us", "0.0")):
        assert f'nv_inference_{name}{{model="m",version="1"}} {value}' in lines, name
    assert "# TYPE nv_inference_request_success untyped" in lines  # no _total added
