"""The shared engine process alone, without front ends: what it costs a request.
``python -m loadtests.engine_alone --model-repository REPO [--model NAME] [--clients 1 32
512] [--seconds 8] [--emulate-gpu] [--out DIR]``.

It starts the engine process of ``--engine shared`` (on the stand-in GPU with
``--emulate-gpu``, loadtests/emulated_gpu.py) on a Unix socket, and drives it from this
process with the front ends' own client (distilserve/server/engine_process/front_end.py):
so many concurrent requests of one sentence's token ids, each sent again as soon as it is
answered. For each count of clients: requests a second, and the engine process's CPU time
(its threads together) a request and a second. One engine serves every front
end of a device, so its CPU a request bounds the layout's rate: a core's worth of it is
the most one engine answers, whatever the device. Writes ``engine_alone.json`` under
``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from distilserve.server.engine_process.front_end import EngineClient
from distilserve.server.engine_process.process import on_uvloop

# "The cat sat on the mat." as all-MiniLM-L6-v2 reads it: [CLS] ... [SEP]
IDS = np.array([101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102], np.int32)


def cpu_seconds(process: psutil.Process) -> float:
    """The process's user and system CPU time so far, all its threads."""
    times = process.cpu_times()
    return times.user + times.system


async def drive(socket: str, process: psutil.Process, model: str | None, clients: list[int],
                seconds: float) -> list[dict]:
    """Each count of ``clients`` in turn against the engine at ``socket``: its row."""
    client = EngineClient(socket)
    client.start()
    await client.connected.wait()
    while not (state := (await client.call({"op": "models"}))[0])["ready"]:
        await asyncio.sleep(0.2)
    served = {m["name"]: m for m in state["models"]}
    served = served[model] if model else state["models"][0]
    return [await measured(client, process, served, count, seconds) for count in clients]


async def measured(client: EngineClient, process: psutil.Process, served: dict, count: int,
                   seconds: float) -> dict:
    """``count`` clients for ``seconds`` (after as long as two seconds' warming up, for
    the batches of this load to form): the row."""
    answered, stop = 0, False

    async def one() -> None:
        nonlocal answered
        while not stop:
            header, _ = await client.call({"op": "infer", "model": served["name"],
                                           "version": served["version"], "iterations": None,
                                           "priority": 0, "lengths": [len(IDS)]},
                                          [IDS, np.zeros_like(IDS)])
            if "failed" in header:
                raise RuntimeError(f"the engine refused a request: {header}")
            answered += 1

    running = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.sleep(min(2.0, seconds))
    done, cpu, began = answered, cpu_seconds(process), time.perf_counter()
    await asyncio.sleep(seconds)
    done, cpu = answered - done, cpu_seconds(process) - cpu
    took = time.perf_counter() - began
    stop = True
    await asyncio.gather(*running)
    return {"clients": count, "requests_per_s": done / took,
            "engine_cpu_us_per_request": 1e6 * cpu / max(done, 1), "engine_cores": cpu / took}


def run_engine(opts, folder: Path) -> list[dict]:
    """The engine process started on a socket in ``folder`` and driven: the rows."""
    socket, log = str(folder / "engine.sock"), folder / "engine.log"
    module = "loadtests.emulated_gpu" if opts.emulate_gpu else "distilserve.server.engine_process"
    env = {**os.environ, "DISTILSERVE_MODEL_REPOSITORY": str(opts.model_repository)}
    with log.open("w") as out:
        engine = subprocess.Popen(
            [sys.executable, "-m", module, *(["engine"] if opts.emulate_gpu else []), socket],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not os.path.exists(socket):
            if engine.poll() is not None:
                raise SystemExit(f"the engine process exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        return on_uvloop(drive(socket, psutil.Process(engine.pid), opts.model, opts.clients,
                               opts.seconds))
    finally:
        engine.terminate()
        engine.wait(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.engine_alone", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", help="the embedding model to drive (default: the first served)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32, 512])
    p.add_argument("--seconds", type=float, default=8.0, help="each count's measured time")
    p.add_argument("--emulate-gpu", action="store_true", help="the stand-in GPU's engine")
    p.add_argument("--out", type=Path, default=Path("loadtests/engine_alone"))
    opts = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="engine-alone-") as folder:
        rows = run_engine(opts, Path(folder))
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "engine_alone.json").write_text(json.dumps(rows, indent=1))
    for row in rows:
        print(f"{row['clients']} clients: {row['requests_per_s']:,.0f} req/s, the engine "
              f"{row['engine_cpu_us_per_request']:.1f} us of CPU a request "
              f"({row['engine_cores']:.2f} of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
