"""Where the models run, measured side by side: one process; ``--workers N`` with a copy of
every model in each worker (``--engine per-worker``); and ``--workers N`` feeding one
engine process (``--engine shared``). ``python -m loadtests.engines --model-repository
REPO [--workers 4] [--emulate-gpu] [--rounds 3] [--peer-url URL] --out DIR``.

Each round serves the repository in each layout in turn (interleaved, so that a machine
that slows down slows all alike) and drives it with the closed-loop raw-socket clients of
loadtests/lightload.py: a lone client, 32 and 512 clients of one sentence each; then a
peer already serving (``--peer-url``, e.g. Infinity; the flags of loadtests.peer) with
the same clients and sentences. Each round also measures the model in-process (batches of
256: the rate the device gives), so that each layout's 512-client rate is read as a share
of it, and what its event loops (every process's main thread: one process's, the front
ends' and the engine's) spent a request, CPU time that bounds how many front ends a rate
takes; on a GPU, what each layout held in GPU memory and in how many processes.
``--emulate-gpu`` serves with the stand-in GPU (loadtests/emulated_gpu.py) on a machine
without one. Writes ``engines.json`` and ``engines.md`` under ``--out`` after each layout
measured, so that a run stopped part way keeps what it measured.
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
from loadtests.lightload import answered_per_s, not_answered_lines
from loadtests.peer import Inside, add_peer_arguments, gpu_listing, measure
from loadtests.run import HERE, InProcess, free_port, start_server, wait_until_ready

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
    gpu, port = gpu_listing(), free_port()
    server = start_server(repository, port, log, env,
                          module="loadtests.emulated_gpu" if emulate else "distilserve.server.cli")
    url = f"http://127.0.0.1:{port}"
    try:
        httpx.post(url + "/v1/embeddings", json={"model": model, "input": "warm"}, timeout=60)
        return measure(url, "/v1/embeddings", model, seconds, processes,
                       Inside(url, server.pid, model, gpu[0] if gpu else None),
                       phases=PHASES)
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
    add_peer_arguments(p)
    p.add_argument("--out", type=Path, default=HERE / "reports")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or sorted(d.name for d in args.model_repository.iterdir() if d.is_dir())[0]
    folder = args.model_repository / model
    if args.peer_url:  # loaded before the first round, not beside it
        wait_until_ready(args.peer_url, lambda: True, args.peer_name, args.peer_health, 300)
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
            write(results, model, args)
        if args.peer_url:
            print(f"  {args.peer_name}", flush=True)
            results.setdefault(args.peer_name, []).append(measure(
                args.peer_url, args.peer_path, args.peer_model, args.seconds, args.processes,
                phases=PHASES))
            write(results, model, args)
    print((args.out / "engines.md").read_text())
    return 0


def write(results: dict, model: str, args) -> None:
    """engines.json and engines.md of what is measured so far."""
    (args.out / "engines.json").write_text(json.dumps(
        {"model": model, "emulated_gpu": args.emulate_gpu, "workers": args.workers,
         "seconds_per_phase": args.seconds, "client_processes": args.processes,
         "cores": os.cpu_count(), "peer": args.peer_name if args.peer_url else None,
         "results": results}, indent=2) + "\n")
    (args.out / "engines.md").write_text("\n".join(report(results, model, args)) + "\n")


def median_of(rounds: list[list[dict]], phase: int, figure) -> float | None:
    """The median over the rounds of ``figure(row)`` for the ``phase``-th phase's rows;
    None where no round has one (``figure`` gives None where a row lacks it)."""
    values = [v for rows in rounds if (v := figure(rows[phase])) is not None]
    return statistics.median(values) if values else None


def report(results: dict, model: str, args) -> list[str]:
    ceiling = [r["batched_sentences_per_s"] for r in results["in process"]]
    device = "the stand-in GPU (loadtests/emulated_gpu.py)" if args.emulate_gpu else "the service's device"
    measured = {name: rounds for name, rounds in results.items() if name != "in process"}
    gpu = any("gpu_mib" in row.get("inside", {})
              for rounds in measured.values() for rows in rounds for row in rows)
    lines = [f"# Where the models run ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"Model {model} on {device}, {os.cpu_count()} cores; {len(ceiling)} interleaved "
             f"rounds of {args.seconds:.0f} s phases, closed-loop raw-socket clients in "
             f"{args.processes} processes on 127.0.0.1, one sentence a request. In process "
             f"(batches of 256): {', '.join(f'{c:.0f}' for c in ceiling)} sentences/s.", "",
             "| layout | phase | req/s (each round) | median | share of in-process | "
             "p50 ms | inputs a batch | event loops' CPU a request |"
             + (" GPU MiB (processes) |" if gpu else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")]

    def inside(name: str):
        return lambda row: row.get("inside", {}).get(name)

    for name, rounds in measured.items():
        for i, (label, _, _) in enumerate(PHASES):
            rates = [answered_per_s(rows[i]) for rows in rounds]
            share = statistics.median(rate / c for rate, c in zip(rates, ceiling))
            batch, loops = median_of(rounds, i, inside("inputs_per_batch")), median_of(
                rounds, i, inside("event_loops_us_per_request"))
            cells = [f"{batch:.1f}" if batch is not None else "—",
                     f"{loops:.0f} µs" if loops is not None else "—"]
            if gpu:
                mib, held = median_of(rounds, i, inside("gpu_mib")), median_of(
                    rounds, i, inside("gpu_processes"))
                cells.append(f"{mib:.0f} ({held:.0f})" if mib is not None else "—")
            lines.append(
                f"| {name} | {label} | {', '.join(f'{x:.0f}' for x in rates)} | "
                f"{statistics.median(rates):.0f} | {share:.0%} | "
                f"{median_of(rounds, i, lambda row: row['p50_ms']):.2f} | "
                + " | ".join(cells) + " |")
    lines += not_answered_lines([
        (f"{name}, {label}, round {n}", row) for name, rounds in measured.items()
        for n, rows in enumerate(rounds, 1) for (label, _, _), row in zip(PHASES, rows)])
    return lines + verdict(measured, ceiling, args)


def verdict(measured: dict, ceiling: list[float], args) -> list[str]:
    """The shared engine beside the rest, in a sentence: at 512 clients its share of the
    in-process rate and its rate over each other layout's (and the peer's), a lone
    client's p50 beside one process's."""
    one, _, shared = (name for name, _ in layouts(args.workers))
    if shared not in measured:
        return []
    last = len(PHASES) - 1  # 512 clients

    def rate(name: str) -> float:
        return median_of(measured[name], last, answered_per_s)

    share = statistics.median(answered_per_s(rows[last]) / c
                              for rows, c in zip(measured[shared], ceiling))
    beside = "; ".join(f"{name}: {rate(shared) / rate(name):.2f}x" if rate(name) else
                       f"{name}: none answered" for name in measured if name != shared)
    said = (f"At 512 clients the shared engine served {rate(shared):.0f} req/s (medians of "
            f"the rounds), {share:.0%} of the in-process rate"
            + (f"; its rate against {beside}" if beside else ""))
    if one in measured:
        lone = [median_of(measured[name], 0, lambda row: row["p50_ms"]) for name in (shared, one)]
        said += f". A lone client's p50: {lone[0]:.2f} ms shared, {lone[1]:.2f} ms one process"
    return ["", said + "."]


if __name__ == "__main__":
    sys.exit(main())
