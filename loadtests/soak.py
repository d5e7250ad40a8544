"""A soak test: ``python -m loadtests.soak [--model-repository REPO] [--seconds 240]``.

It starts the service on 127.0.0.1 (a free port), drives every route with a few
closed-loop clients for a bounded time (embeddings, embed, classify, NER, rerank,
tokenize, the model list, metrics; texts of varied lengths and counts), samples the
service's resident memory (RSS, its worker processes included) every second, and fails
when memory still grows after the warm-up, when any answer is a 5xx, or when a request
fails to get an answer. It writes ``samples.csv``, ``summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil

from distilserve.models import samples
from loadtests.run import HERE, free_port, repository_or_default, start_server


def payloads(models: list[dict]) -> list[tuple[str, str, dict | None]]:
    """(method, path, body) for every route the served models allow."""
    first = {}
    for m in models:
        first.setdefault(m["task"], m["id"])
    texts = list(samples.SENTENCES)
    out: list[tuple[str, str, dict | None]] = [("GET", "/v1/models", None),
                                               ("GET", "/metrics", None)]
    for i in range(len(texts)):
        some = [texts[(i + k) % len(texts)] * (1 + k % 3) for k in range(1 + i % 8)]
        if "embed" in first:
            model = first["embed"]
            out += [("POST", "/v1/embeddings", {"model": model, "input": some}),
                    ("POST", "/v1/embed", {"model": model, "inputs": texts[i]}),
                    ("POST", "/v1/rerank", {"model": model, "query": texts[i],
                                            "documents": some, "return_documents": True}),
                    ("POST", "/v1/tokenize", {"model": model, "inputs": some})]
        if "classify" in first:
            out.append(("POST", "/v1/classify", {"model": first["classify"], "inputs": some}))
        if "ner" in first:
            out.append(("POST", "/v1/ner", {"model": first["ner"], "inputs": some}))
    return out


def rss_mib(pid: int) -> float:
    """Resident memory of the process and its children (worker processes), in MiB."""
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def growth(samples_: list[tuple[float, float]], warmup: float, tolerance_mib: float) -> dict:
    """Does memory still grow after ``warmup`` seconds? Compares the median RSS of the
    first and last fifth of the samples after the warm-up (medians: a passing spike is
    not growth) and fits a line to them (MiB per minute)."""
    after = [(t, m) for t, m in samples_ if t >= warmup]
    if len(after) < 10:
        raise ValueError(f"{len(after)} samples after the warm-up; run longer")
    fifth = max(2, len(after) // 5)
    start = statistics.median(m for _, m in after[:fifth])
    end = statistics.median(m for _, m in after[-fifth:])
    t, m = np.array(after).T
    slope = float(np.polyfit(t, m, 1)[0]) * 60
    return {"warmup_s": warmup, "rss_start_mib": round(samples_[0][1], 1),
            "rss_after_warmup_mib": round(start, 1), "rss_end_mib": round(end, 1),
            "growth_after_warmup_mib": round(end - start, 1),
            "slope_mib_per_min": round(slope, 2), "tolerance_mib": tolerance_mib,
            "grew": end - start > tolerance_mib}


async def drive(url: str, clients: int, seconds: float, work: list, counts: Counter,
                failures: list[str]) -> None:
    until = time.monotonic() + seconds

    async def client(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            i = k
            while time.monotonic() < until:
                method, path, body = work[i % len(work)]
                i += clients
                try:
                    response = await http.request(method, path, json=body)
                    counts[f"{path} {response.status_code}"] += 1
                except httpx.HTTPError as e:
                    failures.append(f"{path}: {type(e).__name__}: {e}")

    await asyncio.gather(*(client(k) for k in range(clients)))


async def sample_memory(pid: int, started: float, every: float, out: list, stop: asyncio.Event):
    while not stop.is_set():
        out.append((round(time.monotonic() - started, 2), rss_mib(pid)))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass


async def soak(url: str, pid: int, clients: int, seconds: float) -> tuple:
    work = payloads(httpx.get(url + "/v1/models").json()["data"])
    counts, failures, memory, stop = Counter(), [], [], asyncio.Event()
    started = time.monotonic()
    sampler = asyncio.create_task(sample_memory(pid, started, 1.0, memory, stop))
    await drive(url, clients, seconds, work, counts, failures)
    stop.set()
    await sampler
    return counts, failures, memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__)
    parser.add_argument("--model-repository", type=Path,
                        help="folder of model folders (default: the embedded default, "
                        "built first if it is not yet)")
    parser.add_argument("--seconds", type=float, default=240, help="length of the run")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before memory must be flat (default: half the run)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--tolerance-mib", type=float, default=32.0,
                        help="growth after the warm-up that fails the run")
    parser.add_argument("--output", type=Path, default=HERE / "reports" / "soak",
                        help="folder for samples.csv, summary.json and summary.md")
    args = parser.parse_args(argv)
    warmup = args.seconds / 2 if args.warmup is None else args.warmup
    args.output.mkdir(parents=True, exist_ok=True)
    repository, port = repository_or_default(args.model_repository), free_port()
    server = start_server(repository, port, args.output / "server.log")
    try:
        counts, failures, memory = asyncio.run(
            soak(f"http://127.0.0.1:{port}", server.pid, args.clients, args.seconds))
    finally:
        server.terminate()
        server.wait(60)
    with (args.output / "samples.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("seconds", "rss_mib"), *memory])
    server_errors = {k: v for k, v in counts.items() if k.rsplit(" ", 1)[1].startswith("5")}
    summary = {"seconds": args.seconds, "clients": args.clients,
               "requests": sum(counts.values()), "by_route_and_status": dict(sorted(
                   counts.items())), "server_errors": server_errors,
               "transport_failures": len(failures), "first_failures": failures[:5],
               "memory": growth(memory, warmup, args.tolerance_mib)}
    ok = not server_errors and not failures and not summary["memory"]["grew"]
    summary["passed"] = ok
    (args.output / "summary.json").write_text(json.dumps(summary, indent=2))
    mem = summary["memory"]
    lines = [f"# Soak: {args.seconds:.0f} s, {args.clients} clients, every route",
             "", f"- requests: {summary['requests']} "
             f"({summary['requests'] / args.seconds:.0f}/s), 5xx: {sum(server_errors.values())}, "
             f"unanswered: {len(failures)}",
             f"- RSS: {mem['rss_start_mib']} MiB at start, {mem['rss_after_warmup_mib']} after "
             f"the {warmup:.0f} s warm-up, {mem['rss_end_mib']} at the end (growth "
             f"{mem['growth_after_warmup_mib']} MiB, {mem['slope_mib_per_min']} MiB/min; "
             f"fails over {args.tolerance_mib} MiB)",
             f"- result: {'passed' if ok else 'FAILED'}", "",
             "| route and status | requests |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in sorted(counts.items()))]
    (args.output / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
