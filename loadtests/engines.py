"""Where the models run, measured side by side: one process; ``--workers N`` with a copy of
every model in each worker (``--engine per-worker``); and ``--workers N`` feeding one
engine process (``--engine shared``). ``python -m loadtests.engines --model-repository
REPO [--workers 4] [--emulate-gpu] [--rounds 3] --out DIR``.

Each round serves the repository in each layout in turn (interleaved, so that a machine
that slows down slows all alike) and drives it with the closed-loop raw-socket clients of
loadtests/lightload.py: a lone client, 32 and 512 clients of one sentence each. Each round
also measures the model in-process (batches of 256: the rate the device gives), so that
each layout's 512-client rate is read as a share of it, and what its event loops (every
process's main thread: one process's, the front ends' and the engine's) spent a request,
CPU time that bounds how many front ends a rate takes. ``--emulate-gpu`` serves with the
stand-in GPU (loadtests/emulated_gpu.py) on a machine without one. Writes
``engines.json`` and ``engines.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

from loadtests.emulated_gpu import EmulatedGpu
from loadtests.peer import Inside, measure
from loadtests.run import HERE, InProcess, free_port, start_server

PHASES = [("1 client", 1, 1), ("32 clients", 32, 1), ("512 clients", 512, 1)]


def layouts(workers: int) -> list[tuple[str, dict]]:
    return [("one process", {"DISTILSERVE_WORKERS": "1", "DISTILSERVE_ENGINE": "per-worker"}),
            (f"{workers} workers, a copy each", {"DISTILSERVE_WORKERS": str(workers),
                                                  "DISTILSERVE_ENGINE": "per-worker"}),
            (f"{workers} workers, shared engine", {"DISTILSERVE_WORKERS": str(workers),
                                                    "DISTILSERVE_ENGINE": "shared"})]


def measure_layout(repository: Path, model: str, env: dict, seconds: float, processes: int,
                   emulate: bool, log: Path) -> list[dict]:
    """The layout served (``env``), driven through each phase; its rows."""
    port = free_port()
    server = start_server(repository, port, log, env,
                          module="loadtests.emulated_gpu" if emulate else "distilserve.server.cli")
    url = f"http://127.0.0.1:{port}"
    try:
        httpx.post(url + "/v1/embeddings", json={"model": model, "input": "warm"}, timeout=60)
        return measure(url, "/v1/embeddings", model, seconds, processes,
                       Inside(url, server.pid, model), phases=PHASES)
    finally:
        server.terminate()
        server.wait(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.engines", description=__doc__)
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", help="the embedding model (default: the repository's first)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="per phase")
    p.add_argument("--processes", type=int, default=4, help="client processes")
    p.add_argument("--emulate-gpu", action="store_true",
                   help="serve (and measure in process) with the stand-in GPU")
    p.add_argument("--out", type=Path, default=HERE / "reports")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or sorted(d.name for d in args.model_repository.iterdir() if d.is_dir())[0]
    folder = args.model_repository / model
    results: dict[str, list] = {"in process": []}
    for n in range(1, args.rounds + 1):
        print(f"round {n}", flush=True)
        ceiling = InProcess(folder, 256, EmulatedGpu.like(folder) if args.emulate_gpu else None)
        inproc = ceiling.measure(args.seconds / 2)
        del ceiling
        results["in process"].append(inproc)
        print(f"  in process: {inproc['batched_sentences_per_s']:.0f} sentences/s", flush=True)
        for name, env in layouts(args.workers):
            print(f"  {name}", flush=True)
            results.setdefault(name, []).append(measure_layout(
                args.model_repository, model, env, args.seconds, args.processes,
                args.emulate_gpu, args.out / "service.log"))
    (args.out / "engines.json").write_text(json.dumps(
        {"model": model, "emulated_gpu": args.emulate_gpu, "workers": args.workers,
         "seconds_per_phase": args.seconds, "client_processes": args.processes,
         "cores": os.cpu_count(), "results": results}, indent=2) + "\n")
    lines = report(results, model, args)
    (args.out / "engines.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def report(results: dict, model: str, args) -> list[str]:
    ceiling = [r["batched_sentences_per_s"] for r in results["in process"]]
    device = "the stand-in GPU (loadtests/emulated_gpu.py)" if args.emulate_gpu else "the service's device"
    lines = [f"# Where the models run ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"Model {model} on {device}, {os.cpu_count()} cores; {len(ceiling)} interleaved "
             f"rounds of {args.seconds:.0f} s phases, closed-loop raw-socket clients in "
             f"{args.processes} processes on 127.0.0.1, one sentence a request. In process "
             f"(batches of 256): {', '.join(f'{c:.0f}' for c in ceiling)} sentences/s.", "",
             "| layout | phase | req/s (each round) | median | share of in-process | "
             "p50 ms | inputs a batch | event loops' CPU a request |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rounds in results.items():
        if name == "in process":
            continue
        for i, (label, _, _) in enumerate(PHASES):
            rates = [r[i]["requests_per_s"] for r in rounds]
            share = statistics.median(rate / c for rate, c in zip(rates, ceiling))
            lines.append(
                f"| {name} | {label} | {', '.join(f'{x:.0f}' for x in rates)} | "
                f"{statistics.median(rates):.0f} | {share:.0%} | "
                f"{statistics.median(r[i]['p50_ms'] for r in rounds):.2f} | "
                f"{statistics.median(r[i]['inside']['inputs_per_batch'] for r in rounds):.1f} | "
                f"{statistics.median(r[i]['inside']['event_loops_us_per_request'] for r in rounds):.0f} µs |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
