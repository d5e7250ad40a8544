"""The ``distilserve`` command. Argument parsing only: the work is in models/ and server/."""

from __future__ import annotations

import argparse
import sys

from models import checkpoint


def cmd_new(args: argparse.Namespace) -> int:
    if args.list:
        for family in checkpoint.FAMILIES:
            print(f"{family}: {', '.join(checkpoint.presets(family))}")
        return 0
    if not args.family or not args.output:
        print("distilserve new: FAMILY and --output are required (or --list)", file=sys.stderr)
        return 2
    labels = [x.strip() for x in args.labels.split(",") if x.strip()] if args.labels else None
    ckpt = checkpoint.new(args.family, args.preset, args.task, labels, seed=args.seed)
    out = checkpoint.save(ckpt, args.output)
    print(f"wrote {args.family}/{args.preset} ({args.task}, "
          f"{ckpt.num_parameters() / 1e6:.2f}M parameters) to {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="distilserve", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    new = sub.add_parser("new", help="write a checkpoint of a family with fresh weights")
    new.add_argument("family", nargs="?", choices=checkpoint.FAMILIES)
    new.add_argument("--output", "-o")
    new.add_argument("--preset", default="tiny")
    new.add_argument("--task", default="embed", choices=["embed", "classify", "ner"])
    new.add_argument("--labels", help="comma-separated labels for classify and ner")
    new.add_argument("--seed", type=int, default=0)
    new.add_argument("--list", action="store_true", help="print families and presets")
    new.set_defaults(func=cmd_new)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except checkpoint.CheckpointError as e:
        print(f"distilserve {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
