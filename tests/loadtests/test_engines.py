"""loadtests/engines.py's report and loadtests/peer.py's reading of nvidia-smi, from made-up
figures: a layout's GPU memory and how many of its processes hold any, a peer's rows
without the service's inside figures, the requests refused counted out of the rates, and
the sentence that sets the shared engine beside the rest. (The layouts served and
measured: tests/e2e/test_bench_and_load.py.)"""

from __future__ import annotations

from argparse import Namespace

from loadtests import engines, peer


def rows(rates: list[float], p50: float, inside: dict | None = None) -> list[dict]:
    return [{"requests_per_s": rate, "requests": 10 * rate, "statuses": {200: 10 * rate},
             "p50_ms": p50, **({"inside": {"inputs_per_batch": 2.0, "event_loops_us_per_request": 100.0,
                            **inside}} if inside is not None else {})} for rate in rates]


ARGS = Namespace(workers=8, emulate_gpu=False, seconds=10.0, processes=8, peer_url="http://x",
                 peer_name="Infinity")


def test_nvidia_smi_gives_the_mib_in_use_in_all_and_by_process():
    used, apps = "1200\n800\n", "4242, 500\n4243, 700\n4242, 20\n[N/A], [N/A]\n"
    assert peer.parse_smi(used, apps) == (2000, {4242: 520, 4243: 700})
    assert peer.parse_smi("", "") == (0, {})


def test_the_report_shows_gpu_memory_and_sets_the_shared_engine_beside_the_rest():
    one, copies, shared = (name for name, _ in engines.layouts(8))
    results = {"in process": [{"batched_sentences_per_s": 50_000.0}] * 2,
               one: [rows([500, 3000, 4000], 1.0, {"gpu_mib": 900, "gpu_processes": 1})] * 2,
               copies: [rows([500, 9000, 11000], 1.1, {"gpu_mib": 7200, "gpu_processes": 8})] * 2,
               shared: [rows([450, 12000, 25000], 1.2, {"gpu_mib": 950, "gpu_processes": 1})] * 2,
               "Infinity": [rows([300, 1000, 1250], 3.0)] * 2}
    lines = engines.report(results, "minilm", ARGS)
    assert lines[4].endswith("| GPU MiB (processes) |")
    assert "| 8 workers, a copy each | 512 clients | 11000, 11000 | 11000 | 22% | 1.10 | 2.0 | " \
           "100 µs | 7200 (8) |" in lines
    assert "| 8 workers, shared engine | 512 clients | 25000, 25000 | 25000 | 50% | 1.20 | 2.0 | " \
           "100 µs | 950 (1) |" in lines
    assert "| Infinity | 512 clients | 1250, 1250 | 1250 | 2% | 3.00 | — | — | — |" in lines
    assert lines[-1] == (
        "At 512 clients the shared engine served 25000 req/s (medians of the rounds), 50% of "
        "the in-process rate; its rate against one process: 6.25x; 8 workers, a copy each: "
        "2.27x; Infinity: 20.00x. A lone client's p50: 1.20 ms shared, 1.00 ms one process.")


def test_a_run_stopped_part_way_reports_what_it_measured():
    """Written after each layout: a second round cut short after its first layout, and
    no GPU (no memory column)."""
    one, _, shared = (name for name, _ in engines.layouts(8))
    results = {"in process": [{"batched_sentences_per_s": 10_000.0}] * 2,
               one: [rows([500, 3000, 4000], 1.0, {})] * 2,
               shared: [rows([450, 2000, 5000], 1.2, {})]}
    lines = engines.report(results, "minilm", ARGS)
    assert "GPU" not in lines[4]
    assert "| 8 workers, shared engine | 512 clients | 5000 | 5000 | 50% | 1.20 | 2.0 | 100 µs |" \
        in lines
    assert "its rate against one process: 1.25x." in lines[-1]
    assert engines.report({"in process": [{"batched_sentences_per_s": 1.0}],
                           one: [rows([1, 2, 3], 1.0, {})]}, "minilm", ARGS)[-1].startswith("| one")


def test_requests_refused_are_no_part_of_a_layouts_rate_and_are_named():
    """A layout whose engine refuses everything (503) answers fast: its rate is what it
    answered, and the report names the phases that were refused and how."""
    one, _, shared = (name for name, _ in engines.layouts(8))
    failing = rows([450, 2000, 5000], 1.2, {})
    failing[2] = {**failing[2], "statuses": {200: 30_000, 503: 20_000}}  # (10 s: 5,000/s)
    results = {"in process": [{"batched_sentences_per_s": 10_000.0}],
               one: [rows([500, 3000, 4000], 1.0, {})], shared: [failing]}
    lines = engines.report(results, "minilm", ARGS)
    assert "| 8 workers, shared engine | 512 clients | 3000 | 3000 | 30% | 1.20 | 2.0 | 100 µs |" \
        in lines
    assert lines[-3] == ("Not answered (counted out of req/s; status: requests): 8 workers, "
                         "shared engine, 512 clients, round 1: {503: 20000}.")
    assert "served 3000 req/s" in lines[-1] and "one process: 0.75x" in lines[-1]


def test_a_peer_that_answered_nothing_is_said_so_not_divided_by():
    """The peer refused every request (503): the reports say so, where the ratios would
    divide by its rate of none."""
    one, _, shared = (name for name, _ in engines.layouts(8))
    refused = [{**row, "statuses": {503: row["requests"]}} for row in rows([9, 90, 900], 3.0)]
    results = {"in process": [{"batched_sentences_per_s": 10_000.0}],
               one: [rows([500, 3000, 4000], 1.0, {})], shared: [rows([450, 2000, 5000], 1.2, {})],
               "Infinity": [refused]}
    lines = engines.report(results, "minilm", ARGS)
    assert "| Infinity | 512 clients | 0 | 0 | 0% | 3.00 | — | — |" in lines
    assert lines[-1].startswith("At 512 clients the shared engine served 5000 req/s") and \
        "Infinity: none answered" in lines[-1]

    ours = [{**row, "phase": label, "sentences_per_s": row["requests_per_s"], "p99_ms": 2.0,
             "inside": {"batches_per_s": 10.0, "inputs_per_batch": 2.0, "ms_per_batch": 1.0,
                        "ms_tokenizing": 0.1, "ms_queued": 0.2, "cpu_cores": 1.0,
                        "event_loop_cpu": 0.5, "busiest_other_thread_cpu": 0.5,
                        "event_loops_us_per_request": 100.0}}
            for row, label in zip(rows([500, 4000], 1.0), ("1 client", "512 clients"))]
    theirs = [{**row, "phase": label, "sentences_per_s": 0.0, "p99_ms": 5.0}
              for row, label in zip(refused, ("1 client", "512 clients"))]
    result = {"model": "minilm", "in_process": {"batched_sentences_per_s": 10_000.0,
                                                "single_p50_ms": 0.9},
              "served": {"family": "bert", "backend": "onnx", "device": "cpu", "dtype": "fp32"},
              "distilserve": ours, "peer": {"name": "Infinity", "rows": theirs}}
    said = peer.report(result, Namespace(seconds=10.0, processes=2, peer_name="Infinity",
                                         profile=None))
    assert "| 512 clients | 4000 | 4000 | 1.00 | 2.00 | 0 | 0 | 3.00 | 5.00 | — |" in said
    assert ("Not answered (counted out of req/s; status: requests): Infinity, 1 client: "
            "{503: 90}; Infinity, 512 clients: {503: 900}.") in said
