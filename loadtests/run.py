"""One command for the load tests: ``python -m loadtests.run [--model-repository REPO]``.

It starts the service on 127.0.0.1 (a free port), measures the embedding model in-process
in the same run (the ceiling), drives the service with the light raw-socket client (one
lone client for latency; many clients sending one sentence each for throughput; rerank
requests; single-sentence queries beside a client sending bulk requests), runs the locust
scenarios headless (bounded users and time), stops everything, and writes
CSV/HTML reports plus ``summary.json`` and ``summary.md``. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from distilserve.models import samples
from loadtests import lightload

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unallocated_port() -> int:
    """A free port that no process binding port 0 gets: below the kernel's ephemeral range
    (and above Ray's worker ports, 10002-19999), for a port chosen now and bound later by
    another server (a free_port() port was taken meanwhile: by Ray's actors, by the HTTP
    server's own port 0 beside a gRPC port)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = range(20_000, min(low, 32_768))
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def wait_until_ready(url: str, alive, what: str, path: str = "/ready",
                     seconds: float = 900) -> None:
    """Polls ``url + path`` until it answers 200; raises RuntimeError naming ``what`` once
    ``alive()`` is false or after ``seconds`` (a bound for a hung server, not for a slow
    machine). The one start-and-wait of the load tests and the tests."""
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=5) as client:  # one TLS context, not one a poll
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError(f"{what} stopped before it was ready")
            try:
                if client.get(url + path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready in {seconds:.0f} s")


def repository_or_default(repository: Path | None) -> Path:
    """``repository``, or the embedded default's (built first if it is not yet)."""
    if repository is not None:
        return repository
    from distilserve.server.embedded_default import ensure_default_repository
    from distilserve.server.settings import Settings

    return ensure_default_repository(Settings().cache_dir)


def start_server(repository: Path, port: int, log: Path, env: dict | None = None,
                 module: str = "distilserve.server.cli") -> subprocess.Popen:
    """``distilserve serve`` on 127.0.0.1:``port`` (output to ``log``, extra variables in
    ``env``; ``module``: another command line that takes ``serve``, e.g.
    loadtests.emulated_gpu), returned once /ready answers 200 and every worker
    (DISTILSERVE_WORKERS) has started."""
    env = {**os.environ, "DISTILSERVE_HOST": "127.0.0.1", **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", module, "serve", "--model-repository", str(repository),
         "--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
        cwd=HERE.parent)
    workers = int(env.get("DISTILSERVE_WORKERS", 1))
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", lambda: process.poll() is None,
                         f"the service (log: {log})")
        # the first worker answers /ready; each other takes connections once it has loaded
        # its models (distilserve.server.app.app_from_environment) and says so, as uvicorn does
        while log.read_text().count("Application startup complete") < workers:
            if process.poll() is not None:
                raise RuntimeError(f"the service stopped before its workers started (log: "
                                   f"{log})")
            time.sleep(0.1)
    except RuntimeError:
        process.terminate()
        raise
    return process


class InProcess:
    """The same model without the service (the ceiling): batched throughput (``batch``
    sentences a batch) and the latency of one sentence (tokenise, run, normalise); the
    folder's backend opened as the service opens it (the DISTILSERVE_* variables, the
    manifest's device and dtype), or ``backend``. With DISTILSERVE_CUDA_GRAPH_TOKENS, on a
    GPU, the batches that small run from CUDA graphs, as in the service."""

    def __init__(self, folder: Path, batch: int = 32, backend=None):
        from tokenizers import Tokenizer

        from distilserve.models.io.manifest import Manifest
        from distilserve.server.core.runner import warmup_shapes
        from distilserve.server.engine import open_runtime
        from distilserve.server.settings import Settings

        manifest = Manifest.read(folder)
        settings = Settings()  # the service's, from the DISTILSERVE_* variables
        self.batch = batch
        self.backend = backend or open_runtime(folder, manifest, settings)
        if settings.cuda_graph_tokens:
            self.backend.use_graphs(warmup_shapes(*settings.batch_limits(self.backend.device),
                                                  manifest.max_length),
                                    settings.cuda_graph_tokens)
        # the Rust tokenizer called directly, as the service does (no transformers wrapper)
        self.tokenizer = Tokenizer.from_file(str(folder / "checkpoint" / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(manifest.max_length)
        self.encode(samples.SENTENCES[:32])

    def encode(self, texts: list[str]) -> np.ndarray:
        from distilserve.server.core.batching import pad
        from distilserve.server.core.postprocess import normalize

        return normalize(self.backend.run(pad(self.tokenizer.encode_batch(texts))))

    def measure(self, seconds: float) -> dict:
        sentences = (samples.SENTENCES * (1 + self.batch // len(samples.SENTENCES)))[:self.batch]
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.encode(sentences)
            done += len(sentences)
        rate = done / (time.perf_counter() - started)
        latencies = []
        for i in range(200):
            t = time.perf_counter()
            self.encode([samples.SENTENCES[i % len(samples.SENTENCES)]])
            latencies.append((time.perf_counter() - t) * 1000)
        return {"batched_sentences_per_s": rate, "single_p50_ms": statistics.median(latencies)}

    def rerank_rate(self, seconds: float, documents: int) -> float:
        """Documents/s reranked by cosine: a query and its documents embedded together."""
        texts = samples.SENTENCES
        done, started, i = 0, time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            batch = [texts[(i + j) % len(texts)] for j in range(documents + 1)]
            vectors = self.encode(batch)
            vectors[1:] @ vectors[0]
            done, i = done + documents, i + 1
        return done / (time.perf_counter() - started)


RERANK_DOCUMENTS = 16
BULK = 2048  # inputs in the bulk request (DISTILSERVE_MAX_INPUTS' default)


def rerank_payloads(model: str) -> list[dict]:
    texts = samples.SENTENCES
    return [{"model": model, "query": q,
             "documents": [texts[(i + j) % len(texts)] for j in range(1, RERANK_DOCUMENTS + 1)]}
            for i, q in enumerate(texts)]


def run_locust(url: str, out: Path, users: int, seconds: int, env: dict) -> dict:
    prefix = out / "locust"
    command = [sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless",
               "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--host", url,
               "--csv", str(prefix), "--html", str(out / "locust.html"), "--only-summary"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env},
                          timeout=seconds + 120)
    (out / "locust.log").write_text(done.stdout + done.stderr)
    rows = {r["Name"]: r for r in csv.DictReader((out / "locust_stats.csv").open())}
    total = rows["Aggregated"]
    if total["Request Count"] == "0":  # its percentiles are N/A
        raise RuntimeError(f"locust made no requests in {seconds} s: {out / 'locust.log'}")
    return {"exit_code": done.returncode, "users": users, "seconds": seconds,
            "requests": int(total["Request Count"]), "failures": int(total["Failure Count"]),
            "requests_per_s": float(total["Requests/s"]),
            "p50_ms": float(total["50%"]), "p95_ms": float(total["95%"]),
            "p99_ms": float(total["99%"]),
            "by_route": {name: {"requests": int(r["Request Count"]),
                                "failures": int(r["Failure Count"]), "p50_ms": float(r["50%"])}
                         for name, r in rows.items() if name != "Aggregated"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.run", description=__doc__)
    p.add_argument("--model-repository", type=Path,
                   help="default: the embedded default repository")
    p.add_argument("--out", type=Path, default=HERE / "reports")
    p.add_argument("--users", type=int, default=8, help="locust users")
    p.add_argument("--seconds", type=int, default=15, help="locust run time")
    p.add_argument("--clients", type=int, default=32, help="light-client connections")
    p.add_argument("--light-seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3,
                   help="in-process / lone client / many clients, repeated")
    args = p.parse_args(argv)

    repository = repository_or_default(args.model_repository)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(repository, port, args.out / "service.log")
    url = f"http://127.0.0.1:{port}"
    try:
        served = httpx.get(url + "/v1/models").json()["data"]
        by_task = {}
        for m in served:
            by_task.setdefault(m["task"], m["id"])
        embed = by_task["embed"]
        # side by side, in rounds: a machine's speed drifts from minute to minute, so each
        # round compares the service with the ceiling measured just before
        ceiling_model = InProcess(repository / embed)
        payloads = [{"model": embed, "inputs": s} for s in samples.SENTENCES]
        rounds = []
        for _ in range(args.rounds):
            rounds.append({
                "in_process": ceiling_model.measure(args.light_seconds / 2),
                "lone_client": lightload.drive(url, "/v1/embed", payloads, 1,
                                             args.light_seconds / 2),
                "many_clients": lightload.drive(url, "/v1/embed", payloads, args.clients,
                                              args.light_seconds)})
        # rerank: 8 clients, each a query and 16 documents per request, by cosine
        rerank = {"in_process_documents_per_s": ceiling_model.rerank_rate(
            args.light_seconds / 2, RERANK_DOCUMENTS)}
        served_rerank = lightload.drive(url, "/v1/rerank", rerank_payloads(embed), 8,
                                      args.light_seconds)
        rerank.update(service=served_rerank, documents_per_s=served_rerank["requests_per_s"]
                      * RERANK_DOCUMENTS)
        # a bulk request (indexing) beside single-sentence queries: what the queries wait
        bulk_texts = (samples.SENTENCES * (1 + BULK // len(samples.SENTENCES)))[:BULK]
        bulk, queries = lightload.beside_bulk(url, "/v1/embed", {
            "model": embed, "inputs": bulk_texts}, payloads, args.light_seconds)
        del ceiling_model
        env = {"DISTILSERVE_LOAD_EMBED": embed,
               "DISTILSERVE_LOAD_CLASSIFY": by_task.get("classify", ""),
               "DISTILSERVE_LOAD_NER": by_task.get("ner", "")}
        locust = run_locust(url, args.out, args.users, args.seconds, env)
    finally:
        server.terminate()
        server.wait(30)
    ratios = [r["many_clients"]["requests_per_s"] / r["in_process"]["batched_sentences_per_s"]
              for r in rounds]
    added = [r["lone_client"]["p50_ms"] - r["in_process"]["single_p50_ms"] for r in rounds]
    summary = {
        "model": embed, "clients": args.clients, "rounds": rounds, "locust": locust,
        "rerank": rerank, "bulk": {"inputs": BULK, "bulk_client": bulk, "queries": queries},
        "service_vs_in_process_throughput": statistics.median(ratios),
        "added_latency_p50_ms": statistics.median(added),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    rows = []
    for i, r in enumerate(rounds, 1):
        ceiling, lone, many = r["in_process"], r["lone_client"], r["many_clients"]
        rows += [
            f"| {i} | in-process, batches of 32 | {ceiling['batched_sentences_per_s']:.0f} | "
            f"{ceiling['single_p50_ms']:.2f} (one sentence) | | | | |",
            *(f"| {i} | service, {label} | {m['requests_per_s']:.0f} | {m['p50_ms']:.2f} | "
              f"{m['p95_ms']:.2f} | {m['p99_ms']:.2f} | "
              f"{sum(v for k, v in m['statuses'].items() if k != 200)} | "
              f"{m['client_cpu_share']:.0%} |"
              for label, m in (("1 client", lone),
                               (f"{args.clients} clients x 1 sentence", many)))]
    text = "\n".join([
        f"# Load test of {embed} ({url}, {time.strftime('%Y-%m-%d %H:%M')})", "",
        "| round | measurement | requests/s | p50 ms | p95 ms | p99 ms | failures | "
        "load-generator CPU |",
        "|---|---|---|---|---|---|---|---|", *rows,
        f"| | locust, {locust['users']} users, embed/classify/ner | "
        f"{locust['requests_per_s']:.0f} | {locust['p50_ms']:.0f} | {locust['p95_ms']:.0f} | "
        f"{locust['p99_ms']:.0f} | {locust['failures']} | (locust) |", "",
        "Service throughput with many clients / in-process, per round: "
        f"{', '.join(f'{x:.0%}' for x in ratios)} (median "
        f"{summary['service_vs_in_process_throughput']:.0%}); latency a lone request adds "
        f"at p50: {', '.join(f'{x:.2f}' for x in added)} ms (median "
        f"{summary['added_latency_p50_ms']:.2f} ms).", "",
        f"Rerank ({RERANK_DOCUMENTS} documents per request by cosine, 8 clients): "
        f"{rerank['documents_per_s']:.0f} documents/s, "
        f"{rerank['documents_per_s'] / rerank['in_process_documents_per_s']:.0%} of "
        f"in-process ({rerank['in_process_documents_per_s']:.0f}); p50 "
        f"{rerank['service']['p50_ms']:.1f} ms per request, "
        f"{sum(v for k, v in rerank['service']['statuses'].items() if k != 200)} failures.",
        "",
        f"Beside a client sending {BULK} sentences per request ({bulk['requests']} requests, "
        f"{bulk['requests_per_s'] * BULK:.0f} sentences/s), single-sentence queries took "
        f"{queries['p50_ms']:.1f} ms at p50, {queries['p99_ms']:.1f} at p99, "
        f"{queries['max_ms']:.1f} at most ({queries['requests']} queries; a lone client's "
        f"p50: {statistics.median(r['lone_client']['p50_ms'] for r in rounds):.1f} ms); "
        f"{sum(v for m in (bulk, queries) for k, v in m['statuses'].items() if k != 200)} "
        "failures.", ""])
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0 if locust["failures"] == 0 and locust["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
