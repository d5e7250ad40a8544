"""gRPC (the Open Inference Protocol's and TEI's) beside HTTP, on one service:
``python -m loadtests.grpc_vs_http [--model-repository REPO]``.

It starts the service on 127.0.0.1 with DISTILSERVE_GRPC_PORT (free ports) and, in
interleaved rounds, sends one sentence a request to the embedding model over gRPC
(ModelInfer with raw_input_contents, tei.v1's Embed, and tei.v1's EmbedStream: one stream
with as many messages in flight as there are clients; grpc's own clients), the HTTP /v2
infer (JSON) and /v1/embed (the light raw-socket client, loadtests/lightload.py): a lone client's latency,
then ``--clients`` clients' throughput, with the CPU the service and this client used per
request (on a small machine they share the cores). Writes ``summary.json`` and
``summary.md``. Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
from tritonclient.grpc import service_pb2, service_pb2_grpc

from distilserve.models import samples
from distilserve.server.routes.tei.grpc_services import pb, pb_grpc
from loadtests import lightload
from loadtests.run import free_port, repository_or_default, start_server, unallocated_port

SENTENCE = samples.SENTENCES[0]


def _grpc_request(model: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    text = SENTENCE.encode()
    request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    return request


def grpc_drive(address: str, method, request, metadata: tuple, clients: int,
               seconds: float) -> dict:
    """``clients`` concurrent gRPC callers of ``method(channel)`` on one channel for
    ``seconds``, one request at a time each: requests/s, latency p50/p99 and this
    process's CPU per request."""
    latencies: list[float] = []

    async def main():
        async with grpc.aio.insecure_channel(address) as channel:
            call, until = method(channel), time.perf_counter() + seconds

            async def one():
                while time.perf_counter() < until:
                    started = time.perf_counter()
                    await call(request, metadata=metadata)
                    latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(one() for _ in range(clients)))

    return _timed(main, latencies)


def stream_drive(address: str, model: str, in_flight: int, seconds: float) -> dict:
    """One tei.v1 EmbedStream for ``seconds``, ``in_flight`` messages sent and not yet
    answered at most (its answers come in the order sent): as grpc_drive's figures."""
    latencies: list[float] = []

    async def main():
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.EmbedStub(channel).EmbedStream(metadata=(("model", model),))
            request = pb.EmbedRequest(inputs=SENTENCE, normalize=True)
            sent, window = collections.deque(), asyncio.Semaphore(in_flight)
            until = time.perf_counter() + seconds

            async def write():
                while time.perf_counter() < until:
                    await window.acquire()
                    sent.append(time.perf_counter())
                    await call.write(request)
                await call.done_writing()

            writing = asyncio.create_task(write())
            while await call.read() is not grpc.aio.EOF:
                latencies.append(time.perf_counter() - sent.popleft())
                window.release()
            await writing

    return _timed(main, latencies)


def _timed(main, latencies: list[float]) -> dict:
    """``main()`` run: its requests/s, latency p50/p99 and this process's CPU per request."""
    cpu, wall = lightload.cpu_s(), time.perf_counter()
    asyncio.run(main())
    wall, cpu = time.perf_counter() - wall, lightload.cpu_s() - cpu
    ms = np.array(latencies) * 1000
    return {"requests": len(latencies), "requests_per_s": len(latencies) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "client_cpu_us": cpu / len(latencies) * 1e6}


def http_drive(url: str, path: str, body: dict, clients: int, seconds: float) -> dict:
    result = lightload.drive(url, path, [body], clients, seconds)
    assert set(result["statuses"]) == {200}, result["statuses"]
    return {"requests": result["requests"], "requests_per_s": result["requests_per_s"],
            "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
            "client_cpu_us": result["client_cpu_share"] * result["seconds"]
            / result["requests"] * 1e6}


def measure(server: psutil.Process, drive) -> dict:
    """``drive()``'s figures, with the service's CPU per request (all its threads)."""
    before = server.cpu_times()
    figures = drive()
    after = server.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return {**figures, "server_cpu_us": used / figures["requests"] * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path,
                        help="default: the embedded default (its embedding model)")
    parser.add_argument("--model", help="the embedding model (default: the first served)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("loadtests/reports/grpc"))
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    repository = repository_or_default(args.model_repository)
    port, grpc_port = free_port(), unallocated_port()
    process = start_server(repository, port, args.output / "server.log",
                           {"DISTILSERVE_GRPC_PORT": str(grpc_port)})
    url, address = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    try:
        model = args.model or next(m["id"] for m in httpx.get(url + "/v1/models").json()[
            "data"] if m["task"] == "embed")
        server = psutil.Process(process.pid)
        ways = {
            "gRPC ModelInfer": lambda n, s: grpc_drive(
                address, lambda c: service_pb2_grpc.GRPCInferenceServiceStub(c).ModelInfer,
                _grpc_request(model), (), n, s),
            "gRPC tei.v1 Embed": lambda n, s: grpc_drive(
                address, lambda c: pb_grpc.EmbedStub(c).Embed,
                pb.EmbedRequest(inputs=SENTENCE, normalize=True), (("model", model),), n, s),
            "gRPC tei.v1 EmbedStream": lambda n, s: stream_drive(address, model, n, s),
            "HTTP /v2 infer (JSON)": lambda n, s: http_drive(
                url, f"/v2/models/{model}/infer", {"inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [1], "data": [SENTENCE]}]},
                n, s),
            "HTTP /v1/embed": lambda n, s: http_drive(
                url, "/v1/embed", {"model": model, "inputs": SENTENCE}, n, s),
        }
        rounds = []
        for _ in range(args.rounds):
            rounds.append({name: {
                "lone": measure(server, lambda d=drive: d(1, args.seconds / 2)),
                "clients": measure(server, lambda d=drive: d(args.clients, args.seconds))}
                for name, drive in ways.items()})
    finally:
        process.terminate()
        process.wait(60)
    summary = {"model": model, "clients": args.clients, "seconds": args.seconds,
               "rounds": rounds}
    (args.output / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.output / "summary.md").write_text(report(summary))
    print(report(summary))
    return 0


def report(summary: dict) -> str:
    """Each way's figures over the rounds, as ranges (lowest-highest)."""
    def span(way: str, load: str, key: str, digits: int = 0) -> str:
        values = [r[way][load][key] for r in summary["rounds"]]
        return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"

    lines = [f"{summary['model']}: a lone client, and {summary['clients']} clients "
             f"({summary['seconds']:g} s each), over {len(summary['rounds'])} interleaved "
             "rounds (lowest-highest)", "",
             "| way | lone p50 ms | req/s | p99 ms | service CPU µs/req | client CPU µs/req |",
             "|---|---|---|---|---|---|"]
    for way in summary["rounds"][0]:
        lines.append(f"| {way} | {span(way, 'lone', 'p50_ms', 2)} | "
                     f"{span(way, 'clients', 'requests_per_s')} | "
                     f"{span(way, 'clients', 'p99_ms', 1)} | "
                     f"{span(way, 'clients', 'server_cpu_us')} | "
                     f"{span(way, 'clients', 'client_cpu_us')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
