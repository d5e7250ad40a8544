"""distilserve beside a peer server (Infinity, TEI, ...) with the same client and
sentences, one after the other: ``python -m loadtests.peer --model-repository REPO
[--peer-url http://127.0.0.1:7997 --peer-model minilm] --out DIR``.

Both are asked for OpenAI-shaped embeddings (distilserve at /v1/embeddings, the peer at
``--peer-path``) by closed-loop raw-socket clients on 127.0.0.1: a lone client (latency),
32, 128 and 512 clients sending one sentence each, and 4 clients sending 32 sentences
each. The in-process ceiling (tokenise + forward + pool, batches of 256) is measured too,
and what distilserve did inside each phase (batches, inputs per batch, time per batch; how
busy its event loop and its busiest other thread were; what its event loops spent a
request), so that a shortfall shows its cause. ``--profile`` adds where each of its threads
spent that time (py-spy: loadtests/profile.py). Writes ``peer.json`` and ``peer.md`` under ``--out``.
``--emulate-gpu`` serves and measures with a stand-in for a GPU
(loadtests/emulated_gpu.py), to study the batching where there is none.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from distilserve.models import samples
from loadtests import lightload
from loadtests.emulated_gpu import EmulatedGpu
from loadtests.profile import Profile, py_spy
from loadtests.run import HERE, InProcess, free_port, start_server, wait_until_ready

PHASES = [("1 client x 1 sentence", 1, 1), ("32 clients x 1", 32, 1),
          ("128 clients x 1", 128, 1), ("512 clients x 1", 512, 1),
          ("4 clients x 32 sentences", 4, 32)]


def payloads(model: str, per_request: int) -> list[dict]:
    texts = samples.SENTENCES
    if per_request == 1:
        return [{"model": model, "input": t} for t in texts]
    return [{"model": model, "input": [texts[(i + j) % len(texts)] for j in range(per_request)]}
            for i in range(len(texts))]


def gpu_listing() -> tuple[int, dict[int, int]] | None:
    """The MiB in use on the machine's GPUs, and by each process nvidia-smi names (pid ->
    MiB); None where there is no nvidia-smi (no GPU) or it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        said = [subprocess.run([smi, f"--query-{query}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=60, check=True).stdout
                for query in ("gpu=memory.used", "compute-apps=pid,used_memory")]
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi(*said)


def parse_smi(used: str, apps: str) -> tuple[int, dict[int, int]]:
    """nvidia-smi's csv (noheader, nounits) of ``memory.used`` (a line a GPU) and of
    ``pid,used_memory`` (a line a process) -> (MiB in use in all, {pid: MiB})."""
    by_pid = {}
    for line in apps.splitlines():
        pid, _, mib = (cell.strip() for cell in line.partition(","))
        if pid.isdigit() and mib.isdigit():
            by_pid[int(pid)] = by_pid.get(int(pid), 0) + int(mib)
    return sum(int(line) for line in used.split() if line.isdigit()), by_pid


class Inside:
    """What the service did between ``start()`` and ``stop()``: from its /metrics, batches
    per second, inputs per batch, milliseconds per batch (started to collected) and the
    mean time a request waited for its batch to start; from its threads' CPU time
    (psutil; every process: workers too), the cores it used, its busiest event loop (a
    process's main thread) and its busiest other thread (the model's inference thread, or
    a runtime's), as fractions of one core, and its event loops' CPU seconds in all. On a
    GPU (``gpu_before``: gpu_listing's MiB in use before the service started), also what
    it held there at the end: the MiB in use over ``gpu_before`` and how many of its
    processes held any (a CUDA context)."""

    def __init__(self, url: str, pid: int, model: str, gpu_before: int | None = None):
        self.url, self.process, self.model = url, psutil.Process(pid), model
        self.gpu_before = gpu_before

    def _snapshot(self) -> dict:
        metrics = {}
        for family in text_string_to_metric_families(httpx.get(self.url + "/metrics").text):
            for sample in family.samples:
                if sample.labels.get("model") == self.model:
                    metrics[sample.name] = sample.value
        cpu = {}
        for process in [self.process, *self.process.children(recursive=True)]:
            try:
                for t in process.threads():
                    cpu[process.pid, t.id] = t.user_time + t.system_time
            except psutil.NoSuchProcess:
                pass
        return {"at": time.perf_counter(), "metrics": metrics, "cpu": cpu}

    def start(self) -> None:
        self.before = self._snapshot()

    def stop(self) -> dict:
        after, before = self._snapshot(), self.before
        wall = after["at"] - before["at"]

        def grew(name: str) -> float:
            return after["metrics"].get(name, 0.0) - before["metrics"].get(name, 0.0)

        def mean(histogram: str) -> float:  # of what it observed in between
            count = grew(histogram + "_count")
            return grew(histogram + "_sum") / count if count else 0.0

        used = {k: max(0.0, v - before["cpu"].get(k, 0.0)) for k, v in after["cpu"].items()}
        loops = [v for (pid, tid), v in used.items() if pid == tid]
        others = [v for (pid, tid), v in used.items() if pid != tid]
        figures = {"batches_per_s": grew("distilserve_batch_size_count") / wall,
                   "inputs_per_batch": mean("distilserve_batch_size"),
                   "ms_per_batch": 1000 * mean("distilserve_inference_seconds"),
                   "ms_tokenizing": 1000 * mean("distilserve_tokenize_seconds"),
                   "ms_queued": 1000 * mean("distilserve_queue_seconds"),
                   "cpu_cores": sum(used.values()) / wall,
                   "event_loop_cpu": max(loops, default=0.0) / wall,
                   "busiest_other_thread_cpu": max(others, default=0.0) / wall,
                   "event_loops_cpu_s": sum(loops)}
        gpu = gpu_listing() if self.gpu_before is not None else None
        if gpu is not None:
            figures["gpu_mib"] = gpu[0] - self.gpu_before
            figures["gpu_processes"] = len({pid for pid, _ in after["cpu"]} & set(gpu[1]))
        return figures


def measure(url: str, path: str, model: str, seconds: float, processes: int,
            inside: Inside | None = None, profile: Profile | None = None,
            phases: list[tuple[str, int, int]] = PHASES) -> list[dict]:
    """Each phase (label, clients, sentences a request) for ``seconds`` after a warm-up:
    its row."""
    rows = []
    for label, clients, per_request in phases:
        lightload.drive(url, path, payloads(model, per_request), clients, min(2.0, seconds),
                      processes)  # warm-up
        if profile:  # first: it may take a while to start sampling, which inside leaves out
            profile.start(label)
        if inside:
            inside.start()
        r = lightload.drive(url, path, payloads(model, per_request), clients, seconds,
                          processes)
        if inside:  # (what the event loops cost a request: the layout's bound on a core)
            r["inside"] = inside.stop()
            r["inside"]["event_loops_us_per_request"] = (
                1e6 * r["inside"]["event_loops_cpu_s"] / max(r["requests"], 1))
        if profile:
            r["profile"] = profile.stop()
        r.update(phase=label, sentences_per_s=lightload.answered_per_s(r) * per_request)
        rows.append(r)
        print(f"  {label}: {r['requests_per_s']:.0f} req/s, {r['sentences_per_s']:.0f} "
              f"sentences/s, p50 {r['p50_ms']:.2f} ms, statuses {r['statuses']}", flush=True)
    return rows


def profile_table(rows: list[dict], threads: int = 3) -> list[str]:
    """The report's lines on each phase's busiest threads, from ``--profile``."""
    lines = ["", "Where distilserve's busiest threads were in each phase (py-spy; cores: "
             "a thread's samples as a share of one core; then the functions it was in, as "
             "shares of its samples):", "", "| phase | thread | cores | functions |",
             "|---|---|---|---|"]
    for r in rows:
        profile = r["profile"]
        if profile.get("error"):
            lines.append(f"| {r['phase']} | py-spy failed: {profile['error']} | | |")
        for t in profile.get("threads", [])[:threads]:
            functions = ", ".join(f"{f} {share:.0%}" for f, share in t["top"])
            lines.append(f"| {r['phase']} | {t['thread']} | {t['cores']:.2f} | {functions} |")
    return lines


def add_peer_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that name a peer and how to ask it (loadtests.engines takes them too)."""
    p.add_argument("--peer-url", help="a peer already serving, e.g. http://127.0.0.1:7997")
    p.add_argument("--peer-model", default="minilm")
    p.add_argument("--peer-path", default="/embeddings")
    p.add_argument("--peer-name", default="Infinity")
    p.add_argument("--peer-health", default="/health",
                   help="the peer's route that answers 200 once it is ready (waited for)")


def report(result: dict, args) -> list[str]:
    """peer.md's lines of ``result`` (peer.json's): distilserve's phases beside the peer's,
    the requests not answered 2xx (counted out of the rates), and what distilserve did
    inside each phase."""
    model, described, inproc = result["model"], result["served"], result["in_process"]
    ours, peer = result["distilserve"], result["peer"]["rows"]
    beside = f" beside {args.peer_name}" if peer else ""
    graphs = (f", CUDA graphs up to {described['cuda_graph_tokens']} tokens"
              if described.get("cuda_graph_tokens") else "")
    lines = [f"# distilserve{beside} ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"Model {model} ({described['family']}, {described['backend']} backend, "
             f"{described['device']}, {described['dtype']}{graphs}); in-process ceiling "
             f"{inproc['batched_sentences_per_s']:.0f} sentences/s (batches of 256), one "
             f"sentence {inproc['single_p50_ms']:.2f} ms. {args.seconds:.0f} s per phase, "
             f"closed-loop raw-socket clients in {args.processes} processes on 127.0.0.1.", "",
             f"| phase | distilserve req/s | sentences/s | p50 ms | p99 ms | "
             f"{args.peer_name} req/s | sentences/s | p50 ms | p99 ms | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ours):
        cells = "| | | |"
        if peer:
            q = peer[i]
            ratio = (f"{r['sentences_per_s'] / q['sentences_per_s']:.1f}x"
                     if q["sentences_per_s"] else "—")  # (a peer that answered none)
            cells = (f"{lightload.answered_per_s(q):.0f} | {q['sentences_per_s']:.0f} | "
                     f"{q['p50_ms']:.2f} | {q['p99_ms']:.2f} | {ratio}")
        lines.append(f"| {r['phase']} | {lightload.answered_per_s(r):.0f} | {r['sentences_per_s']:.0f}"
                     f" | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {cells} |")
    lines += lightload.not_answered_lines([
        (f"{who}, {r['phase']}", r) for who, rows in (("distilserve", ours),
                                                      (args.peer_name, peer)) for r in rows])
    lines += ["", "Inside distilserve in each phase (CPU as a fraction of one core; the event "
              "loop is a process's main thread):", "",
              "| phase | batches/s | inputs per batch | ms per batch | ms tokenising | ms "
              "queued | CPU, cores | event loop | busiest other thread | event loops' CPU a "
              "request |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ours:
        i = r["inside"]
        lines.append(f"| {r['phase']} | {i['batches_per_s']:.0f} | {i['inputs_per_batch']:.1f} | "
                     f"{i['ms_per_batch']:.2f} | {i['ms_tokenizing']:.2f} | {i['ms_queued']:.2f} | "
                     f"{i['cpu_cores']:.2f} | {i['event_loop_cpu']:.0%} | "
                     f"{i['busiest_other_thread_cpu']:.0%} | "
                     f"{i['event_loops_us_per_request']:.0f} µs |")
    if args.profile:
        lines += profile_table(ours)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.peer", description=__doc__)
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", help="the embedding model (default: the repository's first)")
    add_peer_arguments(p)
    p.add_argument("--seconds", type=float, default=15.0, help="per phase")
    p.add_argument("--processes", type=int, default=4, help="client processes")
    p.add_argument("--out", type=Path, default=HERE / "reports")
    p.add_argument("--emulate-gpu", action="store_true",
                   help="serve (and measure in process) with a stand-in for a GPU: "
                   "loadtests/emulated_gpu.py")
    p.add_argument("--profile", nargs="?", const="python", choices=["python", "native"],
                   help="record where distilserve's threads spend each phase with py-spy "
                   "(native: C/C++ frames too, at a higher cost)")
    args = p.parse_args(argv)
    if args.profile:
        py_spy()  # says how to get it, before anything starts
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or sorted(d.name for d in args.model_repository.iterdir() if d.is_dir())[0]
    folder = args.model_repository / model
    print("in-process ceiling", flush=True)
    ceiling = InProcess(folder, 256, EmulatedGpu.like(folder) if args.emulate_gpu else None)
    inproc = {**ceiling.measure(args.seconds / 2), "device": ceiling.backend.device,
              "dtype": ceiling.backend.dtype}
    del ceiling
    print(f"  {inproc}", flush=True)
    gpu, port = gpu_listing(), free_port()
    server = start_server(args.model_repository, port, args.out / "service.log",
                          module="loadtests.emulated_gpu" if args.emulate_gpu else "distilserve.server.cli")
    url = f"http://127.0.0.1:{port}"
    try:
        described = next(m for m in httpx.get(url + "/v1/models").json()["data"]
                         if m["id"] == model)
        print(f"distilserve ({described['device']}, {described['dtype']})", flush=True)
        profile = Profile(server.pid, args.out, args.profile == "native") if args.profile else None
        ours = measure(url, "/v1/embeddings", model, args.seconds, args.processes,
                       Inside(url, server.pid, model, gpu[0] if gpu else None), profile)
    finally:
        server.terminate()
        server.wait(30)
    peer = []
    if args.peer_url:
        print(args.peer_name, flush=True)
        wait_until_ready(args.peer_url, lambda: True, args.peer_name, args.peer_health, 300)
        peer = measure(args.peer_url, args.peer_path, args.peer_model, args.seconds,
                       args.processes)
    result = {"model": model, "served": described, "in_process": inproc, "distilserve": ours,
              "peer": {"name": args.peer_name, "url": args.peer_url, "rows": peer},
              "seconds_per_phase": args.seconds, "client_processes": args.processes}
    (args.out / "peer.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = report(result, args)
    (args.out / "peer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
