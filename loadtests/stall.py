"""One client address that stalls thousands of connections, beside well-behaved clients:
``python -m loadtests.stall [--model-repository REPO]``.

It starts the service on 127.0.0.1 (a free port, an API key, short deadlines), then opens
``--connections`` connections from 127.0.0.2 (another loopback address: a client address
of its own) stalled in each of four ways, KINDS, reopening each one the service closes,
while ``--clients`` clients with the key send embedding requests from 127.0.0.1 one after
another. It prints (and writes to ``--output``) what each side got: the clients' statuses
and latencies; for each kind of stalled connection, how many were refused when accepted
(503), how many the service closed, and the longest a closed one lived (from its last
byte of the kind's stall: connecting, its headers, its response), against the deadline
it was held to; and the service's ``distilserve_connections_closed_total``. Traffic goes
to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

from distilserve.models import samples
from loadtests import lightload
from loadtests.run import free_port, repository_or_default, start_server

SOURCE = "127.0.0.2"  # the stalling client's address
# each kind of stalled connection: what it sends, and the deadline that closes it
KINDS = {
    "half_header": "header_timeout",  # half a request's headers, then nothing
    "slow_body": "body_timeout",  # whole headers, then a byte of the body a second
    "short_body": "body_timeout",  # a Content-Length larger than the body sent
    "idle_keep_alive": "keep_alive_timeout",  # a request answered, then nothing
}
DEADLINES = {"header_timeout": 2.0, "body_timeout": 3.0, "keep_alive_timeout": 2.0}


def _opening(kind: str, key: str) -> bytes:
    """What a connection of ``kind`` sends first (with the API key: a key does not buy a
    stalled connection more time)."""
    if kind == "half_header":
        return lightload.request("/v1/embed", b"", key=key)[:50]
    if kind == "idle_keep_alive":
        return b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sent = b'{"inputs": "a"' if kind == "short_body" else b"{"
    return lightload.request("/v1/embed", sent, key=key, length=1000)


async def _stall(kind: str, port: int, key: str, until: float, record: dict) -> None:
    """Connections of ``kind``, one after another until ``until``: each kept stalled until
    the service closes it."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(SOURCE, 0))
        except OSError:
            record["connect_failed"] += 1
            await asyncio.sleep(0.1)
            continue
        since, got = time.monotonic(), b""
        try:
            writer.write(_opening(kind, key))
            while True:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    if kind == "slow_body":
                        writer.write(b" ")
                    continue
                if not chunk:
                    break
                got += chunk
                if kind == "idle_keep_alive" and got.startswith(b"HTTP/1.1 200") \
                        and got.endswith(b"}"):  # /health's answer: idle from now
                    since = time.monotonic()
        except OSError:  # reset
            pass
        finally:
            writer.close()
        lived = time.monotonic() - since
        status = lightload.status_of(got)
        if status == 503 and b"retry-after" in got.lower():
            record["refused_503"] += 1
        else:
            record["closed"] += 1
            record["longest_s"] = max(record["longest_s"], lived)
            if status not in (None, 200):
                record["statuses"][str(status)] = record["statuses"].get(str(status), 0) + 1


def stall(port: int, key: str, connections: int, seconds: float) -> dict:
    """``connections`` stalled connections, the kinds in turn, reopened as closed for
    ``seconds``; then those still open are waited for (their deadlines, and as long
    again): what happened to each kind."""
    records = {kind: {"connect_failed": 0, "refused_503": 0, "closed": 0, "longest_s": 0.0,
                      "statuses": {}} for kind in KINDS}

    async def main():
        until = time.monotonic() + seconds
        kinds = list(KINDS)
        tasks = [asyncio.create_task(_stall(kinds[i % len(kinds)], port, key, until,
                                            records[kinds[i % len(kinds)]]))
                 for i in range(connections)]
        if not tasks:  # (a run without stalling, to compare with)
            await asyncio.sleep(seconds)
            return 0
        _, open_still = await asyncio.wait(tasks, timeout=seconds + 2 * max(DEADLINES.values())
                                           + 5)
        for task in open_still:
            task.cancel()
        return len(open_still)

    cpu, wall = lightload.cpu_s(), time.monotonic()
    never_closed = asyncio.run(main())
    return {"connections": connections, "never_closed": never_closed, "kinds": records,
            "cpu_share": (lightload.cpu_s() - cpu) / (time.monotonic() - wall)}


def run(repository: Path, connections: int, clients: int, seconds: float,
        out: Path | None = None) -> dict:
    """The service started, stalled from SOURCE while ``clients`` clients run for
    ``seconds``; the figures (written to ``out``/stall.json, beside the service's log;
    ``out`` None: a new temporary folder)."""
    port, key = free_port(), secrets.token_hex(8)
    out = out or Path(tempfile.mkdtemp(prefix="distilserve-stall-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stall-server.log"
    env = {"DISTILSERVE_API_KEY": key, "DISTILSERVE_ACCESS_LOG": "false",
           **{f"DISTILSERVE_{name.upper()}": str(s) for name, s in DEADLINES.items()}}
    server = start_server(repository, port, log, env)
    url = f"http://127.0.0.1:{port}"
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            stalling = pool.apply_async(stall, (port, key, connections, seconds + 2))
            time.sleep(2)  # the stalled connections opened first
            payloads = [{"inputs": s} for s in samples.SENTENCES]
            served = lightload.drive(url, "/v1/embed", payloads, clients, seconds, key=key)
            stalled = stalling.get()
        metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}).text
    finally:
        server.terminate()
        server.wait(60)
    closed = {m[0]: float(m[1]) for m in re.findall(
        r'distilserve_connections_closed_total\{reason="(\w+)"\} ([0-9.e+]+)', metrics)}
    figures = {"clients": served, "stalled": stalled, "deadlines_s": DEADLINES,
               "closed_by_the_service": closed}
    (out / "stall.json").write_text(json.dumps(figures, indent=2))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.stall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", type=Path, default=None,
                        help="default: the embedded default")
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--output", type=Path, default=Path("loadtests/reports"))
    args = parser.parse_args(argv)
    figures = run(repository_or_default(args.model_repository), args.connections,
                  args.clients, args.seconds, args.output)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
