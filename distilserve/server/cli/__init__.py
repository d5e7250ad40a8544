"""The ``distilserve`` command: one module per command (its arguments and its run), what
they share in common.py; the work is in models/, server/, training/ and bench/."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from distilserve.models.io import CheckpointError
from distilserve.models.tasks import TASKS
from distilserve.server.cli import bench, distill, export, new, ray, serve
from distilserve.server.cli.common import Refused

DESCRIPTION = """Serves compact, distilled text encoders (BERT, DistilBERT, TinyBERT, MiniLM,
MobileBERT, MiniALBERT, F-ALBERT, CMOW): embeddings (OpenAI-, TEI- and Cohere-compatible
too), rerank, classification, NER, question answering and fill-mask, over HTTP and gRPC,
on the CPU or a GPU.

  distilserve serve                      the embedded default on http://127.0.0.1:8000
  distilserve new bert --preset minilm-l6 --output ckpt/minilm
  distilserve export ckpt/minilm --output repo/minilm --format onnx
  distilserve serve --model-repository repo

'distilserve COMMAND --help' describes each command."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="distilserve", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"distilserve {metadata.version('distilserve')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    new.add(sub, list(TASKS))
    export.add(sub, list(TASKS))
    for command in (serve, ray, distill, bench):
        command.add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except Refused as e:
        print(f"distilserve {args.command}: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"distilserve {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # its reader stopped reading (| head): no more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a file or folder named that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"distilserve {args.command}: {where}{e.strerror or e}", file=sys.stderr)
        return 1
