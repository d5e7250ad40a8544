"""A burst: ``python -m loadtests.burst --requests 2000 [--model-repository REPO]``.

It starts the service on 127.0.0.1 (a free port, an API key, a queue of ``--queue``
inputs), sends ``--requests`` embedding requests at once, each on a connection of its own
from one of ``--addresses`` loopback addresses (many clients at once: no one address past
DISTILSERVE_MAX_CLIENT_CONNECTIONS unless asked), then one more request: prints the
statuses, how many refusals (429, 503) carried Retry-After, and the status of the request
after. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
from collections import Counter
from pathlib import Path

import httpx

from loadtests import lightload
from loadtests.run import free_port, repository_or_default, start_server


async def _one(port: int, source: str, body: bytes, key: str) -> tuple[int | None, bool]:
    """(the status, whether it carried Retry-After); None: no answer (closed, reset)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(source, 0))
    except OSError:
        return None, False
    try:
        writer.write(lightload.request("/v1/embed", body, key=key, close=True))
        answer = await reader.read()
    except OSError:
        return None, False
    finally:
        writer.close()
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    status = lightload.status_of(answer)
    return status, status is not None and b"\r\nretry-after:" in head


def burst(port: int, key: str, requests: int, addresses: int) -> dict:
    body = json.dumps({"inputs": "a sentence in a burst"}).encode()

    async def main():
        return await asyncio.gather(*(
            _one(port, f"127.0.0.{2 + i % addresses}", body, key) for i in range(requests)))

    answers = asyncio.run(main())
    statuses = Counter(str(status) for status, _ in answers)
    told = Counter(str(status) for status, retry in answers if retry)
    return {"requests": requests, "addresses": addresses, "statuses": dict(statuses),
            "with_retry_after": dict(told)}


def run(repository: Path, requests: int, addresses: int, queue: int,
        env: dict | None = None) -> dict:
    port, key = free_port(), secrets.token_hex(8)
    out = Path(tempfile.mkdtemp(prefix="distilserve-burst-"))
    server = start_server(repository, port, out / "server.log", {
        "DISTILSERVE_API_KEY": key, "DISTILSERVE_ACCESS_LOG": "false",
        "DISTILSERVE_MAX_QUEUE": str(queue), **(env or {})})
    try:
        figures = burst(port, key, requests, addresses)
        after = httpx.post(f"http://127.0.0.1:{port}/v1/embed", json={"inputs": "after"},
                           headers={"Authorization": f"Bearer {key}"}, timeout=60)
        figures["after"] = after.status_code
    finally:
        server.terminate()
        server.wait(60)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.burst", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", type=Path, default=None,
                        help="default: the embedded default")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--addresses", type=int, default=16)
    parser.add_argument("--queue", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(run(repository_or_default(args.model_repository), args.requests,
                         args.addresses, args.queue), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
