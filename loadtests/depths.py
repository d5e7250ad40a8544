"""Depth per request under load: ``python -m loadtests.depths --model-repository REPO
--model NAME [--clients 32] [--seconds 10] [--rounds 3]``.

It starts the service on 127.0.0.1 (a free port) serving ``REPO``, whose model ``NAME`` is
a recursive one whose depth a request may choose, and drives ``--clients`` closed-loop
clients (loadtests/lightload.py) with one sentence per request, in interleaved rounds of
phases: every request at the full depth, every request at each depth alone, and a mix,
each request's depth drawn at random from 1 to the full one. Prints requests/s, latency
percentiles and the forward passes at each depth, as JSON. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests import lightload
from loadtests.run import free_port, start_server

SENTENCES = ["The Eiffel Tower stands in Paris.", "Bananas are rich in potassium.",
             "A quick brown fox jumps over the lazy dog.", "The meeting moved to Thursday.",
             "Rain is expected over the weekend.", "She plays the cello in an orchestra."]


def passes_by_depth(url: str, model: str) -> dict[str, float]:
    """distilserve_batches_by_iterations_total of ``model``: iterations -> forward passes."""
    return {sample.labels["iterations"]: sample.value
            for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
            for sample in family.samples
            if sample.name == "distilserve_batches_by_iterations_total"
            and sample.labels["model"] == model}


def phases(model: str, depth: int, seed: int = 0) -> dict[str, list[dict]]:
    """Each phase's request bodies, cycled by every client: the full depth (no
    ``iterations``), each depth alone, and a mix drawn at random."""
    rng = random.Random(seed)
    bodies = {"full": [{"model": model, "inputs": s} for s in SENTENCES]}
    for d in range(1, depth + 1):
        bodies[f"depth {d}"] = [{"model": model, "inputs": s, "iterations": d}
                                for s in SENTENCES]
    bodies["mixed"] = [{"model": model, "inputs": rng.choice(SENTENCES),
                        "iterations": rng.randint(1, depth)} for _ in range(256)]
    return bodies


def run(repository: Path, model: str, clients: int, seconds: float, rounds: int,
        out: Path | None = None) -> dict:
    port = free_port()
    out = out or Path(tempfile.mkdtemp(prefix="distilserve-depths-"))
    out.mkdir(parents=True, exist_ok=True)
    server = start_server(repository, port, out / "server.log",
                          {"DISTILSERVE_ACCESS_LOG": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        described = httpx.get(f"{url}/v1/models/{model}").json()
        span = described.get("iterations")
        if not span or span["min"] != 1:
            raise SystemExit(f"model {model!r}: its depth cannot be chosen per request "
                             f"({span or 'not a recursive model'})")
        bodies = phases(model, span["max"])
        figures: dict[str, list[dict]] = {name: [] for name in bodies}
        for _ in range(rounds):  # interleaved: each round runs every phase once
            for name, payloads in bodies.items():
                before = passes_by_depth(url, model)
                result = lightload.drive(url, "/v1/embed", payloads, clients, seconds)
                after = passes_by_depth(url, model)
                result["passes_by_depth"] = {d: after[d] - before.get(d, 0) for d in after
                                             if after[d] > before.get(d, 0)}
                figures[name].append(result)
    finally:
        server.terminate()
        server.wait(60)
    return {"model": model, "iterations": span, "clients": clients, "seconds": seconds,
            "rounds": rounds, "phases": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.depths", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.model_repository, args.model, args.clients, args.seconds,
                         args.rounds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
