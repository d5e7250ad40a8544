"""`distilserve bench --quick` and the load-test command, at a tiny scale: their outputs
are complete and well-formed (numbers are for the committed full run, not for tests)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from distilserve.bench import harness
from distilserve.server.cli import main
from distilserve.server.engine import load_engine
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from loadtests import grpc_vs_http
from loadtests import run as loadrun

pytestmark = pytest.mark.slow  # the bench and load tests, in subprocesses

PNG = b"\x89PNG\r\n\x1a\n"


def test_bench_quick_writes_results_report_and_charts(tmp_path, monkeypatch):
    """Run elsewhere than the repository, into a relative folder: its measuring processes,
    which run in the repository, find the artifacts where the command was run."""
    monkeypatch.chdir(tmp_path)
    tmp_path = tmp_path / "results"
    assert main(["bench", "--quick", "--output", "results"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["results"]
    assert set(results["machine"]["gemm_gflop_per_s"]) == {"fp32", "bf16", "int8"}
    assert all(rate > 0 for rate in results["machine"]["gemm_gflop_per_s"].values())
    assert {r["family"] for r in rows} == {"bert", "distilbert", "minialbert", "falbert", "cmow"}
    assert {r["loop"] for r in rows if r["family"] == "minialbert"} == {"unroll", "keep"}
    for r in rows:
        assert "error" not in r, r
        assert r["sentences_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["parameters"] > 0
        assert r["flops_per_sentence"] > 0 and 0 < r["efficiency"]
        assert r["latency_ms_p50"] <= r["latency_ms_p95"]
    report = (tmp_path / "REPORT.md").read_text()
    assert "## All measurements" in report and "minialbert tiny" in report
    assert "## The papers' claims" not in report  # the tiny presets are none of their models
    assert "Fresh weights at the tiny test presets" in report  # not "the papers' sizes"
    assert "GEMM fp32 " in report and ", bf16 " in report and ", int8 " in report
    for chart in ("throughput.png", "memory.png", "params.png"):
        assert (tmp_path / chart).read_bytes()[:8] == PNG
    # resumable: a second run measures nothing again (the machine's rates aside: as before)
    before = (tmp_path / "results.jsonl").read_text()
    monkeypatch.setattr(harness, "gemm_rates", lambda threads, runs=5: {
        k: v * 1e9 for k, v in results["machine"]["gemm_gflop_per_s_by_library"].items()})
    assert main(["bench", "--quick", "--output", "results"]) == 0
    assert (tmp_path / "results.jsonl").read_text() == before


def test_the_in_process_ceiling_opens_a_model_as_the_service_does(exports, tiny_checkpoints, tmp_path):
    folder = tmp_path / "bf16"
    exports(tiny_checkpoints["bert", "embed"], folder, "torch")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["dtype"] = "bf16"  # the model's own choice, over DISTILSERVE_DTYPE
    (folder / "manifest.json").write_text(json.dumps(manifest))
    served = load_engine("m", folder, Settings(), Metrics()).describe()
    ceiling = loadrun.InProcess(folder, batch=4)
    assert (ceiling.backend.device, ceiling.backend.dtype) == (served["device"],
                                                               served["dtype"]) == ("cpu", "bf16")


def test_load_test_command_at_tiny_scale(exports, tiny_checkpoints, tmp_path):
    repo = tmp_path / "repo"
    for task in ("embed", "classify", "ner"):
        exports(tiny_checkpoints["cmow", task], repo / f"cmow-{task}", "onnx")
    out = tmp_path / "reports"
    code = loadrun.main(["--model-repository", str(repo), "--out", str(out), "--users", "3",
                         "--seconds", "3", "--clients", "4", "--light-seconds", "2",
                         "--rounds", "2"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["rounds"]) == 2
    for r in summary["rounds"]:
        assert r["in_process"]["batched_sentences_per_s"] > 0
        assert r["many_clients"]["requests"] > 0 and r["many_clients"]["clients"] == 4
        assert set(r["many_clients"]["statuses"]) == {"200"}  # JSON keys
    assert summary["service_vs_in_process_throughput"] > 0
    locust = summary["locust"]
    assert locust["failures"] == 0 and locust["requests"] > 0
    assert set(locust["by_route"]) == {"/v1/embed", "/v1/classify", "/v1/ner"}
    for name in ("locust_stats.csv", "locust.html", "summary.md"):
        assert (out / name).stat().st_size > 0
    # locust ran its 3 s from the start of the run: its start-up, however slow, not counted
    said = {line.split("locust.main: ")[1]: datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
            for line in (out / "locust.log").read_text().splitlines() if "locust.main: " in line}
    ran = said["--run-time limit reached, shutting down"] - said["Run time limit set to 3 seconds"]
    assert ran.total_seconds() >= 2.99, said
    rerank = summary["rerank"]  # 8 clients, a query and 16 documents each
    assert rerank["documents_per_s"] > 0 and rerank["in_process_documents_per_s"] > 0
    assert set(rerank["service"]["statuses"]) == {"200"}
    bulk = summary["bulk"]  # one client sending 2048 sentences a request, one queries
    assert bulk["inputs"] == 2048 and bulk["bulk_client"]["requests"] >= 1
    assert bulk["queries"]["requests"] > 0 and bulk["queries"]["max_ms"] >= bulk["queries"]["p50_ms"]
    assert set(bulk["bulk_client"]["statuses"]) == set(bulk["queries"]["statuses"]) == {"200"}


def test_grpc_beside_http_at_tiny_scale(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "bert", "onnx")
    out = tmp_path / "grpc"
    assert grpc_vs_http.main(["--model-repository", str(tmp_path / "repo"), "--output",
                              str(out), "--clients", "4", "--seconds", "1",
                              "--rounds", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "bert" and len(summary["rounds"]) == 2
    for way in ("gRPC ModelInfer", "gRPC tei.v1 Embed", "gRPC tei.v1 EmbedStream",
                "HTTP /v2 infer (JSON)", "HTTP /v1/embed"):
        for r in summary["rounds"]:
            assert r[way]["clients"]["requests"] > 0 and r[way]["lone"]["requests"] > 0
            assert r[way]["clients"]["server_cpu_us"] > 0
        assert f"| {way} |" in (out / "summary.md").read_text()


def test_peer_comparison_at_tiny_scale(exports, tiny_checkpoints, tmp_path):
    """loadtests.peer against the service itself as its own "peer" (no other server
    here): every phase measured on both, the same client and sentences."""
    from loadtests import peer
    from tests.conftest import running_server

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "bert", "torch")
    out = tmp_path / "peer"
    with running_server(repo) as other:
        assert peer.main(["--model-repository", str(repo), "--peer-url", other,
                          "--peer-path", "/v1/embeddings", "--peer-model", "bert",
                          "--peer-name", "itself", "--seconds", "0.5", "--processes", "1",
                          "--out", str(out)]) == 0
    result = json.loads((out / "peer.json").read_text())
    assert [r["phase"] for r in result["distilserve"]] == [p[0] for p in peer.PHASES]
    for ours, theirs in zip(result["distilserve"], result["peer"]["rows"]):
        assert set(ours["statuses"]) == set(theirs["statuses"]) == {"200"}  # JSON keys
    assert result["served"]["device"] == "cpu" and "| 4 clients x 32 sentences |" in \
        (out / "peer.md").read_text()
    # what the service did inside each phase: a lone client's inputs run one per batch,
    # a request's 32 sentences share batches
    inside = {r["phase"]: r["inside"] for r in result["distilserve"]}
    assert inside["1 client x 1 sentence"]["inputs_per_batch"] == 1.0
    assert inside["4 clients x 32 sentences"]["inputs_per_batch"] > 1
    for figures in inside.values():
        assert figures["batches_per_s"] > 0 and figures["ms_per_batch"] > 0
        assert figures["ms_queued"] > 0 and figures["ms_tokenizing"] > 0
        assert figures["event_loop_cpu"] <= figures["cpu_cores"]
    # CPU times come in clock ticks (10 ms): a short phase on a slow machine may show none
    assert sum(figures["event_loop_cpu"] for figures in inside.values()) > 0
    assert "| ms per batch | ms tokenising | ms queued |" in (out / "peer.md").read_text()


def test_peer_with_an_emulated_gpu(exports, tiny_checkpoints, tmp_path):
    """loadtests.peer --emulate-gpu: the service and the in-process ceiling run on a
    stand-in for a GPU (overlapping batches, the GPU's batch limits and warm-up)."""
    from loadtests import peer

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "bert", "onnx")
    out = tmp_path / "peer"
    assert peer.main(["--model-repository", str(repo), "--emulate-gpu", "--seconds", "0.5",
                      "--processes", "1", "--out", str(out), "--profile"]) == 0
    result = json.loads((out / "peer.json").read_text())
    assert result["served"]["device"] == result["in_process"]["device"] == "emulated-gpu"
    assert all(set(r["statuses"]) == {"200"} for r in result["distilserve"])
    inside = {r["phase"]: r["inside"] for r in result["distilserve"]}
    assert inside["4 clients x 32 sentences"]["inputs_per_batch"] > 1
    assert "warmed bert on emulated-gpu" in (out / "service.log").read_text()
    # --profile: py-spy saw the event loop in every phase and the model's thread in the
    # phases together (py-spy samples running threads: one client's batches keep
    # infer-bert busy for ~3% of a core, ~1.5 samples in a 0.5 s phase, often none)
    seen = set()
    for r in result["distilserve"]:
        profile = r["profile"]
        assert "error" not in profile and (out / profile["file"]).stat().st_size > 0
        threads = {t["thread"]: t for t in profile["threads"]}
        assert "MainThread" in threads, threads
        assert all(0 < share <= 1 for _, share in threads["MainThread"]["top"])
        seen |= threads.keys()
    assert "infer-bert" in seen, seen
    report = (out / "peer.md").read_text()
    assert "| 512 clients x 1 | MainThread |" in report and "(httptools_impl.py)" in report


def test_profile_summary_per_thread():
    """py-spy's raw lines -> each thread's cores and the functions it was in; a worker
    process's threads are told apart by their process, the command lines' ; and " aside."""
    from loadtests.profile import summarise

    parent = 'process 10:"python -m distilserve.server.cli serve"'
    worker = 'process 11:"python -c from multiprocessing.spawn import spawn_main; spawn_main()"'
    lines = [f"{parent};{worker};thread (11): MainThread;run (asyncio/runners.py:118) 150",
             f"{parent};{worker};thread (11): MainThread;run (asyncio/runners.py:118);"
             "send (uvicorn/protocols/http/httptools_impl.py:12) 50",
             f"{parent};{worker};thread (12): infer-m;launch (distilserve/models/runtime/onnx.py:40) 100",
             f"{parent};thread (10): MainThread;wait (threading.py:300) 10"]
    threads = summarise(lines, seconds=2.0, rate=100)
    assert [t["thread"] for t in threads] == ["MainThread (process 11)", "infer-m (process 11)",
                                              "MainThread (process 10)"]
    assert threads[0]["cores"] == 1.0 and threads[0]["samples"] == 200
    assert threads[0]["top"] == [("run (runners.py)", 0.75), ("send (httptools_impl.py)", 0.25)]
    assert threads[1]["cores"] == 0.5
    # one process: its threads go by their names alone
    alone = summarise(["thread (7): MainThread;f (a.py:1) 3", "thread (8): infer-m 1"], 1.0, 4)
    assert [(t["thread"], t["cores"]) for t in alone] == [("MainThread", 0.75), ("infer-m", 0.25)]
    assert alone[1]["top"] == [("(the thread itself)", 1.0)]


def test_a_profile_as_short_as_py_spys_start_is_written(tmp_path):
    """py-spy ends without a file when stopped before it samples: a phase's recording
    begins once it does, however short the phase or slow the machine."""
    import subprocess
    import sys

    from loadtests.profile import Profile

    busy = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    try:
        profile = Profile(busy.pid, tmp_path)
        profile.start("a short phase")
        result = profile.stop()  # at once
    finally:
        busy.kill()
        busy.wait()
    assert "error" not in result and (tmp_path / result["file"]).exists(), result


def test_soak_at_tiny_scale(exports, tiny_checkpoints, tmp_path):
    from loadtests import soak

    repo = tmp_path / "repo"
    for task in ("embed", "classify", "ner"):
        exports(tiny_checkpoints["bert", task], repo / f"bert-{task}", "onnx")
    out = tmp_path / "soak"
    # a loose tolerance: 12 s on a busy machine is no soak; the full run is in RESULTS.md
    code = soak.main(["--model-repository", str(repo), "--seconds", "12", "--warmup", "2",
                      "--clients", "3", "--tolerance-mib", "500", "--output", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["passed"], summary
    routes = {key.rsplit(" ", 1)[0] for key in summary["by_route_and_status"]}
    assert routes == {"/v1/embeddings", "/v1/embed", "/v1/rerank", "/v1/tokenize",
                      "/v1/classify", "/v1/ner", "/v1/models", "/metrics"}
    assert all(key.endswith(" 200") for key in summary["by_route_and_status"]), summary
    assert summary["memory"]["rss_end_mib"] > 50
    assert len((out / "samples.csv").read_text().splitlines()) > 10
    assert "# Soak" in (out / "summary.md").read_text()


def test_soak_tells_growth_from_a_flat_line():
    from loadtests.soak import growth

    flat = [(t, 800 + (t % 7)) for t in range(240)]  # noise, no trend
    leaking = [(t, 800 + t * 0.5) for t in range(240)]  # 0.5 MiB/s
    warmed = [(t, 600 + min(t, 100) * 2) for t in range(240)]  # grows, then flat
    assert not growth(flat, 120, 32)["grew"]
    assert growth(leaking, 120, 32)["grew"]
    assert growth(leaking, 120, 32)["slope_mib_per_min"] == 30.0
    assert not growth(warmed, 120, 32)["grew"]
    assert growth(warmed, 0, 32)["grew"]  # without the warm-up it would count


def test_the_layouts_side_by_side_on_the_emulated_gpu(exports, tiny_checkpoints, tmp_path):
    """loadtests.engines --emulate-gpu: one process, a copy per worker and a shared engine,
    each served on the stand-in (the workers' and the engine process's models too), every
    request answered, each layout's rows in the report beside the in-process rate, with
    what its event loops spent a request; then a peer (the service itself) with the same
    clients."""
    from loadtests import engines
    from tests.conftest import running_server

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "bert", "onnx")
    out = tmp_path / "engines"
    with running_server(repo) as other:
        assert engines.main(["--model-repository", str(repo), "--emulate-gpu", "--workers",
                             "2", "--rounds", "1", "--seconds", "0.5", "--processes", "1",
                             "--peer-url", other, "--peer-path", "/v1/embeddings",
                             "--peer-model", "bert", "--peer-name", "itself",
                             "--out", str(out)]) == 0
    result = json.loads((out / "engines.json").read_text())
    layouts = [name for name in result["results"] if name not in ("in process", "itself")]
    assert layouts == ["one process", "2 workers, a copy each", "2 workers, shared engine"]
    (peer,) = result["results"]["itself"]
    assert [r["phase"] for r in peer] == ["1 client", "32 clients", "512 clients"]
    assert all(set(r["statuses"]) == {"200"} and "inside" not in r for r in peer)
    for name in layouts:
        (rows,) = result["results"][name]
        assert [r["phase"] for r in rows] == ["1 client", "32 clients", "512 clients"]
        assert all(set(r["statuses"]) == {"200"} for r in rows), name
        # (CPU times come in clock ticks: a short phase may show none)
        assert sum(r["inside"]["event_loops_us_per_request"] for r in rows) > 0, name
    log = (out / "service.log").read_text()  # the last layout's: the shared engine
    assert "engine process" in log and "warmed bert on emulated-gpu" in log
    report = (out / "engines.md").read_text()
    assert report.count("| 2 workers, shared engine |") == 3 and report.count("| itself |") == 3
    assert "At 512 clients the shared engine served" in report and "itself: " in report
