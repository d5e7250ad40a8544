"""distilserve/server/metrics.py: Triton's statistics are the per-model series, added up."""

from __future__ import annotations

from types import SimpleNamespace

from distilserve.server.metrics import Metrics


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


def observed() -> Metrics:
    """A model's series after a batch of 3, a request answered and one failed."""
    metrics = Metrics()
    series = metrics.model("m")
    series.observe_batch(3, 0.5)
    series.observe_result(SimpleNamespace(queued_s=0.125, tokenize_s=0.25, inference_s=0.5),
                          1.0)
    series.failed.observe(0.5)
    series.queue_depth.set(4)
    return metrics


def test_tritons_own_series_are_the_statistics_when_scraped():
    metrics = observed()
    lines = set(metrics.render().decode().splitlines())
    for name, value in (("request_success", "1.0"), ("request_failure", "1.0"),
                        ("count", "3.0"), ("exec_count", "1.0"),
                        ("request_duration_us", "1.5e+06"), ("queue_duration_us", "125000.0"),
                        ("compute_input_duration_us", "250000.0"),
                        ("compute_infer_duration_us", "500000.0"),
                        ("compute_output_duration_us", "0.0")):
        assert f'nv_inference_{name}{{model="m",version="1"}} {value}' in lines, name
    assert "# TYPE nv_inference_request_success untyped" in lines  # no _total added


def test_teis_series_are_ours_under_its_names():
    from prometheus_client.parser import text_string_to_metric_families

    # the failed request: counted, but not in te_request_duration (TEI's: answered ones)
    scraped = {f.name: f for f in text_string_to_metric_families(observed().render().decode())}

    def value(name: str, sample: str) -> float:
        return next(s.value for s in scraped[name].samples
                    if s.name == sample and s.labels.get("model") == "m")

    for tei, ours in (("te_request_duration", "distilserve_model_request_seconds"),
                      ("te_request_tokenization_duration", "distilserve_tokenize_seconds"),
                      ("te_request_queue_duration", "distilserve_queue_seconds"),
                      ("te_request_inference_duration", "distilserve_request_inference_seconds"),
                      ("te_batch_next_size", "distilserve_batch_size")):
        assert scraped[tei].type == "histogram"
        assert value(tei, tei + "_sum") == {"te_request_duration": 1.0}.get(
            tei, value(ours, ours + "_sum")), tei
        assert value(tei, tei + "_count") == 1.0
    assert value("te_batch_next_size", "te_batch_next_size_sum") == 3.0
    assert value("te_queue_size", "te_queue_size") == 4.0
    assert [value(name, name) for name in ("te_request_count", "te_request_success",
                                           "te_request_failure")] == [2.0, 1.0, 1.0]
    assert scraped["te_request_count"].type == "unknown"  # untyped: no _total added


def scraped(metrics: Metrics) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples}


def test_a_turns_observations_are_written_together_when_it_ends_as_each_would_be():
    import asyncio

    # on and past the buckets' bounds, between them, past all of them, zero
    amounts = [0.001, 0.0011, 0.0025, 0.003, 0.5, 0.7, 11.0, 0.0, 0.001, 2.5]
    at_once, turned = Metrics(), Metrics()
    for amount in amounts:  # no event loop: each written as it comes
        at_once.model("m").queued.observe(amount)
        at_once.observe_request("/v1/embed", 200, amount)
    at_once.model("m").last.set(5.0)

    async def one_turn():
        series = turned.model("m")
        for amount in amounts:
            series.queued.observe(amount)
            turned.observe_request("/v1/embed", 200, amount)
        series.last.set(4.0)
        series.last.set(5.0)  # the turn's last value
        child = turned.queued.labels("m")
        assert child._sum.get() == 0  # not yet written
        await asyncio.sleep(0)  # the turn ends
        assert child._sum.get() == sum(amounts)

    asyncio.run(one_turn())
    theirs = {k: v for k, v in scraped(turned).items() if not k[0].endswith("_created")}
    ours = {k: v for k, v in scraped(at_once).items() if not k[0].endswith("_created")}
    assert theirs == ours
    assert ours["distilserve_queue_seconds_count", (("model", "m"),)] == len(amounts)
    assert ours["distilserve_requests_total", (("route", "/v1/embed"), ("status", "200"))] == 10


def test_what_a_turn_observed_is_in_a_scrape_made_in_the_same_turn():
    import asyncio

    metrics = Metrics()

    async def scrape_at_once():
        metrics.observe_request("/v1/embed", 200, 0.01)
        return scraped(metrics)

    seen = asyncio.run(scrape_at_once())
    assert seen["distilserve_requests_total", (("route", "/v1/embed"), ("status", "200"))] == 1
    assert seen["distilserve_request_seconds_sum", (("route", "/v1/embed"),)] == 0.01
