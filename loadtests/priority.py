"""What vLLM's ``priority`` gives a query beside bulk work: one client sending one
sentence at a time beside ``--bulk-clients`` clients each sending ``--per-request``
sentences a request, the bulk at priority 0 (the queries') and at 1, in turn, on one
served model, ``--rounds`` times. ``python -m loadtests.priority --model-repository REPO
--model NAME``; prints each phase's figures and writes ``priority.json`` under
``--out``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadtests import lightload
from loadtests.peer import payloads
from loadtests.run import HERE, free_port, start_server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", required=True, help="an embedding model of the repository")
    p.add_argument("--bulk-clients", type=int, default=32)
    p.add_argument("--per-request", type=int, default=16, help="the bulk's sentences")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="per phase")
    p.add_argument("--out", type=Path, default=HERE / "reports")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(args.model_repository, port, args.out / "priority-service.log")
    url, bulk = f"http://127.0.0.1:{port}", payloads(args.model, args.per_request)[0]
    queries, rows = payloads(args.model, 1), []
    try:
        lightload.beside_bulk(url, "/v1/embeddings", bulk, queries, 2.0, args.bulk_clients)
        for _ in range(args.rounds):
            for priority in (0, 1):
                bulked, asked = lightload.beside_bulk(
                    url, "/v1/embeddings", {**bulk, "priority": priority}, queries,
                    args.seconds, args.bulk_clients)
                rows.append({"bulk_priority": priority, "queries": asked, "bulk": bulked,
                             "bulk_sentences_per_s": bulked["requests_per_s"]
                             * args.per_request})
                print(f"bulk at priority {priority}: queries p50 {asked['p50_ms']:.1f} ms, "
                      f"p99 {asked['p99_ms']:.1f} ms; bulk "
                      f"{rows[-1]['bulk_sentences_per_s']:.0f} sentences/s", flush=True)
    finally:
        server.terminate()
        server.wait(60)
    (args.out / "priority.json").write_text(json.dumps(
        {"model": args.model, "bulk_clients": args.bulk_clients,
         "per_request": args.per_request, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
