"""``distilserve distill``: the teacher distilled into a student of a family."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distilserve.server.cli.common import Refused, at_least, positive, status
from distilserve.training import DEFAULT_STEPS as OBJECTIVES  # the families distillation knows


def add(sub) -> None:
    dist = sub.add_parser("distill", help="distil the teacher into a student of a family",
                          description="Distils all-MiniLM-L6-v2 (or --teacher) into a "
                          "student with the family's paper objective, on sentences from "
                          "installed docstrings; saves and resumes every 200 steps.")
    dist.add_argument("family", choices=list(OBJECTIVES),
                      help="the student's family")
    dist.add_argument("--output", "-o", type=Path, required=True,
                      help="folder for the student checkpoint (resumed if it holds one)")
    dist.add_argument("--preset", help="student size (default: one that aligns with MiniLM)")
    dist.add_argument("--steps", type=at_least(1),
                      help="training steps (default: the family's, "
                      + ", ".join(f"{f} {n}" for f, n in OBJECTIVES.items()) + ")")
    dist.add_argument("--seed", type=int, default=0, help="seed of data order and weights")
    dist.add_argument("--batch-size", type=at_least(1), default=32,
                      help="sentences per step")
    dist.add_argument("--lr", type=positive, default=3e-4, help="peak learning rate")
    dist.add_argument("--teacher", type=Path, help="a local checkpoint of the bert family "
                      "(default: MiniLM)")
    dist.add_argument("--sentences", type=at_least(1000), default=60_000,
                      help="sentences to read from installed docstrings, a tenth of them "
                      "held out (read once, then kept in the cache; fewer start sooner, "
                      "for a short run)")
    dist.add_argument("--any-depth", action="store_true",
                      help="minialbert, falbert: train every depth, 1 to the student's, to "
                      "give embeddings (the output loss at every iteration's exit), for "
                      "requests that choose fewer iterations")
    dist.add_argument("--add-to-default", action="store_true",
                      help="export the student into the default repository as FAMILY")
    dist.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from distilserve.models import export
    from distilserve.models.io import checkpoint
    from distilserve.models.runtime.cores import limit_torch_threads
    from distilserve.server.settings import Settings
    from distilserve.training import distill

    limit_torch_threads()  # in a container: its CPU limit, not the node's cores

    if args.any_depth and args.family not in ("minialbert", "falbert"):
        raise Refused(f"--any-depth is for the recursive families (minialbert, falbert), "
                      f"not {args.family}")
    if (args.output / "config.json").exists() and not (args.output / distill.STATE).exists():
        raise Refused(f"{args.output} holds a checkpoint that is no distillation to resume "
                      f"(it has no {distill.STATE}): name another folder")
    opts = distill.Options(family=args.family, output=args.output, preset=args.preset,
                           steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                           lr=args.lr, teacher=args.teacher, cache_dir=Settings().cache_dir,
                           any_depth=args.any_depth, corpus_limit=args.sentences)
    with status("distilling") as progress:
        try:
            record = distill.distill(opts, progress)
        except ValueError as e:  # a preset that cannot learn from this teacher
            raise Refused(str(e)) from None
        fid = record["fidelity"]
        print(f"{args.family} student ({record['parameters'] / 1e6:.1f}M parameters) in "
              f"{args.output}: Spearman {fid['spearman']:.3f}, top-10 overlap "
              f"{fid['top10_overlap']:.3f} on {fid['sentences']} held-out sentences")
        if "fidelity_by_depth" in record:
            print("Spearman by depth: " + ", ".join(
                f"{depth} {f['spearman']:.3f}" for depth, f in record["fidelity_by_depth"].items()))
        if args.add_to_default:
            from distilserve.server.embedded_default import ensure_default_repository

            target = ensure_default_repository(Settings().cache_dir) / args.family
            # CMOW's matrix products grow with length until they swamp the embedding:
            # served at the length it was trained on
            length = (opts.max_length if args.family == "cmow" else
                      min(256, checkpoint.positions(checkpoint.read_config(args.output))))
            try:
                export.export(args.output, target, "onnx", max_length=length,
                              progress=progress, force=True)
            except export.ExportError as e:
                print(f"distilserve distill: the student is saved in {args.output}, and not "
                      f"added to the default repository: {e}", file=sys.stderr)
                return 1
            print(f"added to the default repository as {args.family!r}: {target}")
    return 0
