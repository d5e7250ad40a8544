"""The lightest load generator: asyncio clients over raw keep-alive sockets, each sending
one request at a time for a fixed time. It reports requests/s, latency percentiles and
its own CPU use, because on 2 cores the client competes with the service (a heavier
client, httpx, measured the service at half its throughput)."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from urllib.parse import urlsplit

import numpy as np


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def request(path: str, body: bytes, host: str = "127.0.0.1", key: str | None = None,
            close: bool = False, length: int | None = None) -> bytes:
    """An HTTP/1.1 POST of the JSON ``body`` to ``path``, as the bytes sent: with the API
    key ``key``, asking to close the connection after it with ``close``, and declaring
    ``length`` bytes of body where the sender means to send fewer."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
            *([f"Authorization: Bearer {key}"] if key else []),
            f"Content-Length: {len(body) if length is None else length}",
            *(["Connection: close"] if close else [])]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def status_of(answer: bytes) -> int | None:
    """The status of an HTTP/1.1 answer's bytes; None where there is none."""
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else None


async def _client(host: str, port: int, requests: list[bytes], until: float,
                  latencies: list[float], statuses: dict, start: int = 0) -> None:
    """Sends ``requests`` in turn from the ``start``-th (clients start apart, so that
    different requests are in flight at once) until ``until``, at least one whatever the
    time (a phase on a busy machine has figures to give)."""
    reader, writer = await asyncio.open_connection(host, port)
    i = start
    try:
        while i == start or time.perf_counter() < until:
            started = time.perf_counter()
            writer.write(requests[i % len(requests)])
            i += 1
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            status = int(status_line.split()[1])
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


def drive(url: str, path: str, payloads: list[dict], clients: int, seconds: float,
          processes: int = 1, key: str | None = None) -> dict:
    """``clients`` concurrent connections for ``seconds`` (with the API key ``key``);
    returns the figures. With ``processes`` > 1 the clients are spread over that many
    processes (one asyncio loop tops out near one core: many clients against a fast
    service need several)."""
    if processes > 1:
        return _spread(url, path, payloads, clients, seconds, processes, key)
    return _summary(clients, *_drive(url, path, payloads, clients, seconds, key))


def beside_bulk(url: str, path: str, bulk: dict, queries: list[dict],
                seconds: float, bulk_clients: int = 1) -> tuple[dict, dict]:
    """``bulk_clients`` clients sending ``bulk`` (a large request) over and over, beside
    one sending ``queries`` one at a time, for ``seconds``: (the bulk clients' figures,
    the query client's), a query's latency being what large requests cost the requests
    queued behind them."""
    host, port = _address(url)
    figures = [([], {}), ([], {})]

    async def main():
        until = time.perf_counter() + seconds
        await asyncio.gather(*(
            _client(host, port, [request(path, json.dumps(p).encode(), host)
                                 for p in payloads], until, latencies, statuses)
            for payloads, (latencies, statuses) in [*[([bulk], figures[0])] * bulk_clients,
                                                    (queries, figures[1])]))

    cpu, wall = cpu_s(), time.perf_counter()
    asyncio.run(main())
    wall, cpu = time.perf_counter() - wall, cpu_s() - cpu
    return tuple(_summary(n, latencies, statuses, wall, cpu)
                 for n, (latencies, statuses) in zip((bulk_clients, 1), figures))


def _spread(url, path, payloads, clients, seconds, processes, key) -> dict:
    import multiprocessing

    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        parts = pool.starmap(_drive, [(url, path, payloads, n, seconds, key)
                                      for n in shares if n])
    latencies = [x for part in parts for x in part[0]]
    statuses: dict[int, int] = {}
    for part in parts:
        for k, v in part[1].items():
            statuses[k] = statuses.get(k, 0) + v
    return _summary(clients, latencies, statuses, max(p[2] for p in parts),
                    sum(p[3] for p in parts))


def answered_per_s(row: dict) -> float:
    """A summary's requests a second that were answered (2xx): a service that refuses every
    request (503) answers fast, and its requests a second say nothing of its rate."""
    return row["requests_per_s"] * answered(row) / max(row["requests"], 1)


def answered(row: dict) -> int:
    return sum(n for status, n in row["statuses"].items() if 200 <= int(status) < 300)


def not_answered(row: dict) -> dict:
    """A summary's statuses other than 2xx, and how many of each."""
    return {status: n for status, n in row["statuses"].items() if not 200 <= int(status) < 300}


def not_answered_lines(rows: list[tuple[str, dict]]) -> list[str]:
    """A report's lines naming each (label, summary) with answers other than 2xx, and how
    many of each status; none where every request was answered."""
    failed = [f"{label}: {refused}" for label, row in rows if (refused := not_answered(row))]
    return ["", "Not answered (counted out of req/s; status: requests): " + "; ".join(failed)
            + "."] if failed else []


def _summary(clients: int, latencies: list[float], statuses: dict, wall: float,
             cpu: float) -> dict:
    ms = np.array(latencies) * 1000
    return {"clients": clients, "seconds": round(wall, 2), "requests": len(latencies),
            "requests_per_s": len(latencies) / wall, "statuses": statuses,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "client_cpu_share": cpu / wall}


def _drive(url: str, path: str, payloads: list[dict], clients: int, seconds: float,
           key: str | None = None) -> tuple[list[float], dict, float, float]:
    """Runs the clients in this process: (latencies in s, statuses, wall s, CPU s)."""
    host, port = _address(url)
    requests = [request(path, json.dumps(p).encode(), host, key) for p in payloads]
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def main():
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_client(host, port, requests, until, latencies, statuses, n)
                               for n in range(clients)))

    cpu, wall = cpu_s(), time.perf_counter()
    asyncio.run(main())
    return latencies, statuses, time.perf_counter() - wall, cpu_s() - cpu
