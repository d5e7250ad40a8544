"""The shared engine's transport alone: the front ends' frames over a Unix socket
(distilserve/server/engine_process/wire.py) beside ZeroMQ over ipc://, with an echo in
place of the engine, so that only the transport and its framing are measured.
``python -m loadtests.transports [--clients 1 32 512] [--seconds 5] [--rounds 3]
[--out DIR]``.

In each round, each way in turn: a process answers every request at once with one
sentence's embedding (384 float32s), and this process sends so many concurrent requests
of one sentence's token ids, each sent again as soon as it is answered. The ways:

- ``unix``: the service's own (EngineClient; each turn's messages one frame, one write).
- ``zmq-turn``: the same frames, each a ZeroMQ message (DEALER to ROUTER).
- ``zmq-each``: a ZeroMQ message for each request and each reply, its header and arrays
  the message's parts (vLLM's way between its API server and its engine core).

For each: requests a second, a lone client's round trip (p50), and the CPU time a request
of each side (ZeroMQ's I/O threads included). Writes ``transports.json`` and
``transports.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import psutil
import zmq
import zmq.asyncio

from distilserve.server.engine_process import wire
from distilserve.server.engine_process.front_end import EngineClient
from distilserve.server.engine_process.process import on_uvloop
from loadtests.engine_alone import IDS, cpu_seconds

WAYS = ("unix", "zmq-turn", "zmq-each")
EMBEDDING = np.linspace(-1, 1, 384, dtype=np.float32)


def reply_to(header: dict) -> dict:
    return {"id": header["id"], "pairs": False, "waited": 0.0, "running": 0.0}


class Writes:
    """What wire.Outbox writes to, as a ZeroMQ socket's messages (to ``to``, a ROUTER's
    peer, where given)."""

    def __init__(self, socket, to: bytes | None = None):
        self.socket, self.to = socket, to

    def write(self, data: bytes) -> None:
        self.socket.send_multipart([data] if self.to is None else [self.to, data], copy=False)

    def is_closing(self) -> bool:
        return False


def frame_of(data: bytes | memoryview) -> list:
    """A frame sent whole as one message: its messages."""
    head, _ = wire.LENGTHS.unpack_from(data)
    return wire.unpack(head, memoryview(data)[wire.LENGTHS.size:])


async def echo_unix(address: str) -> None:
    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        outbox = wire.Outbox(writer)
        try:
            while True:
                for header, _ in await wire.read(reader):
                    outbox.send(reply_to(header), [EMBEDDING])
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    await asyncio.start_unix_server(connected, address)
    await asyncio.Event().wait()


async def echo_zmq(address: str, each: bool) -> None:
    socket = zmq.asyncio.Context().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)
    outboxes: dict[bytes, wire.Outbox] = {}
    while True:
        peer, *parts = await socket.recv_multipart(copy=False)
        if each:  # [header, ids, type ids]
            header = orjson.loads(parts[0].buffer)
            socket.send_multipart([peer.bytes, orjson.dumps(reply_to(header)), EMBEDDING],
                                  copy=False)
            continue
        outbox = outboxes.setdefault(peer.bytes, wire.Outbox(Writes(socket, peer.bytes)))
        for header, _ in frame_of(parts[0].buffer):
            outbox.send(reply_to(header), [EMBEDDING])


class ZmqClient:
    """EngineClient's ``call`` over a ZeroMQ DEALER: a message a request (``each``), or
    each turn's requests in one of wire's frames. ``close()`` when done: a context left
    to the collector waits for ever for its sockets."""

    def __init__(self, address: str, each: bool):
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.each, self.ids, self.waiting = each, itertools.count(), {}
        self.outbox = wire.Outbox(Writes(self.socket))
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            parts = await self.socket.recv_multipart(copy=False)
            if self.each:
                messages = [(orjson.loads(parts[0].buffer),
                             [np.frombuffer(bytearray(parts[1].buffer), np.float32)])]
            else:
                messages = frame_of(parts[0].buffer)
            for header, arrays in messages:
                self.waiting.pop(header["id"]).set_result((header, arrays))

    def close(self) -> None:
        self.task.cancel()
        self.socket.close()
        self.context.term()

    async def call(self, header: dict, arrays: list = ()) -> tuple[dict, list]:
        header["id"] = request = next(self.ids)
        self.waiting[request] = future = asyncio.get_running_loop().create_future()
        if self.each:
            self.socket.send_multipart([orjson.dumps(header), *arrays], copy=False)
        else:
            self.outbox.send(header, arrays)
        return await future


async def measured(call, server: psutil.Process, count: int, seconds: float) -> dict:
    """``count`` clients for ``seconds``, after a second's warming up: the row."""
    answered, stop, trips = 0, False, []
    types = np.zeros_like(IDS)

    async def one() -> None:
        nonlocal answered
        while not stop:
            began = time.perf_counter()
            header, arrays = await call({"op": "infer", "lengths": [len(IDS)]}, [IDS, types])
            trips.append(time.perf_counter() - began)
            assert len(arrays[0]) == len(EMBEDDING), header
            answered += 1

    here = psutil.Process()
    running = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.sleep(1.0)
    done, mine, theirs, began = answered, cpu_seconds(here), cpu_seconds(server), time.perf_counter()
    del trips[:]
    await asyncio.sleep(seconds)
    done, took = answered - done, time.perf_counter() - began
    mine, theirs = cpu_seconds(here) - mine, cpu_seconds(server) - theirs
    stop = True
    await asyncio.gather(*running)
    return {"clients": count, "requests_per_s": done / took,
            "p50_ms": 1e3 * statistics.median(trips),
            "client_cpu_us": 1e6 * mine / max(done, 1),
            "server_cpu_us": 1e6 * theirs / max(done, 1)}


def run_way(way: str, folder: Path, clients: list[int], seconds: float) -> list[dict]:
    """The echo of ``way`` started in a process of its own and driven from this one."""
    address = str(folder / "echo.sock")
    zmq_address = "ipc://" + address
    server = subprocess.Popen([sys.executable, "-m", "loadtests.transports", "--serve", way,
                               zmq_address if way.startswith("zmq") else address])
    try:
        while not os.path.exists(address):
            if server.poll() is not None:
                raise SystemExit(f"the {way} echo exited ({server.returncode})")
            time.sleep(0.05)
        rows = []

        async def drive() -> None:
            if way == "unix":
                client = EngineClient(address)
                client.start()
                await client.connected.wait()
            else:
                client = ZmqClient(zmq_address, each=way == "zmq-each")
            try:
                for count in clients:
                    rows.append({"way": way, **await measured(client.call, psutil.Process(
                        server.pid), count, seconds)})
            finally:
                if way == "unix":
                    for task in client.tasks:
                        task.cancel()
                else:
                    client.close()

        on_uvloop(drive())
        return rows
    finally:
        server.terminate()
        server.wait(30)
        Path(address).unlink(missing_ok=True)


def report(rounds: list[list[dict]]) -> str:
    """The markdown table: each way and count of clients, the median of the rounds (and
    each round's requests a second)."""
    by: dict[tuple, list[dict]] = {}
    for row in itertools.chain.from_iterable(rounds):
        by.setdefault((row["way"], row["clients"]), []).append(row)
    lines = ["| way | clients | req/s (median) | rounds | p50 ms | client CPU µs a request "
             "| echo CPU µs a request |", "|---|---|---|---|---|---|---|"]
    for (way, count), rows in by.items():
        rate, p50, mine, theirs = (statistics.median(r[key] for r in rows) for key in (
            "requests_per_s", "p50_ms", "client_cpu_us", "server_cpu_us"))
        each = ", ".join(f"{r['requests_per_s']:,.0f}" for r in rows)
        lines.append(f"| {way} | {count} | {rate:,.0f} | {each} | {p50:.3f} | {mine:.1f} | "
                     f"{theirs:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.transports", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32, 512])
    p.add_argument("--seconds", type=float, default=5.0, help="each count's measured time")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    p.add_argument("--out", type=Path, default=Path("loadtests/transports"))
    p.add_argument("--serve", nargs=2, metavar=("WAY", "ADDRESS"), help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.serve:  # the echo's process
        way, address = opts.serve
        on_uvloop(echo_unix(address) if way == "unix" else echo_zmq(address,
                                                                    way == "zmq-each"))
        return 0
    rounds = []
    with tempfile.TemporaryDirectory(prefix="transports-") as folder:
        for _ in range(opts.rounds):
            rounds.append([row for way in opts.ways
                           for row in run_way(way, Path(folder), opts.clients, opts.seconds)])
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "transports.json").write_text(json.dumps(rounds, indent=1))
    table = report(rounds)
    (opts.out / "transports.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
