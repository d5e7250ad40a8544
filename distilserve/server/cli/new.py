"""``distilserve new``: a checkpoint of a family with fresh weights."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from distilserve.models import families
from distilserve.server.cli.common import Refused


def add(sub, tasks: list[str]) -> None:
    new = sub.add_parser("new", help="write a checkpoint of a family with fresh weights",
                         description="Writes a checkpoint (config.json, model.safetensors, "
                         "tokenizer files) of a model family at a size preset, with fresh "
                         "weights.")
    new.add_argument("family", nargs="?", choices=families.FAMILIES, help="model family")
    new.add_argument("--output", "-o", help="folder to write the checkpoint to")
    new.add_argument("--preset", default="tiny",
                     help="size preset, one of the family's (see --list; default tiny)")
    new.add_argument("--task", default="embed", choices=tasks,
                     help="task head: sentence embedding, sequence or token classification, "
                     "extractive question answering or fill-mask (qa, fill-mask: the "
                     "transformers families)")
    new.add_argument("--labels", help="comma-separated labels for classify and ner")
    new.add_argument("--seed", type=int, default=0, help="seed of the fresh weights")
    new.add_argument("--force", action="store_true",
                     help="replace the checkpoint an --output folder holds (its files)")
    new.add_argument("--list", action="store_true", help="print families and presets")
    new.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:  # (without torch: the families' files are read, not imported)
        for name, family in families.REGISTRY.items():
            print(f"{name}: {', '.join(family.preset_names)}")
        return 0
    from distilserve.models.io import checkpoint

    if not args.family or not args.output:
        raise Refused("FAMILY and --output are required (or --list)")
    out = Path(args.output)
    old = sorted(out.iterdir()) if out.is_dir() else []
    if old and not args.force:
        raise Refused(f"{out} already holds files (a checkpoint?); pass --force to replace it")
    if old and not (out / "config.json").exists():  # --force: a checkpoint's files only
        raise Refused(f"{out} holds files but no checkpoint (config.json): --force replaces a "
                      "checkpoint only; name a new or empty folder")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels is not None else None
    ckpt = checkpoint.new(args.family, args.preset, args.task, labels, seed=args.seed)
    for path in old:  # in place, the folder kept ("." stays the shell's folder)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    checkpoint.save(ckpt, out)
    print(f"wrote {args.family}/{args.preset} ({args.task}, "
          f"{ckpt.num_parameters() / 1e6:.2f}M parameters) to {out}")
    return 0
