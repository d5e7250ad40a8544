"""``distilserve export``: a checkpoint into a servable model folder."""

from __future__ import annotations

import argparse
import sys

from distilserve.models.tasks import POOLINGS
from distilserve.server.cli.common import status


def add(sub, tasks: list[str]) -> None:
    exp = sub.add_parser("export", help="export a checkpoint into a servable model folder",
                         description="Exports a checkpoint into a model folder (manifest, "
                         "checkpoint, artifact), checks the artifact against PyTorch at "
                         "unseen shapes and fp16/bf16 against fp32, and refuses to write "
                         "anything servable when the check fails.")
    exp.add_argument("checkpoint", help="checkpoint folder (config.json and weights)")
    exp.add_argument("--output", "-o", required=True,
                     help="the model folder to write, REPO/NAME (served as NAME)")
    exp.add_argument("--format", default="onnx", choices=["onnx", "torchscript", "torch"],
                     help="artifact: ONNX Runtime, TorchScript, or the PyTorch checkpoint "
                     "itself (default onnx)")
    exp.add_argument("--loop", default="unroll", choices=["unroll", "keep"],
                     help="MiniALBERT and F-ALBERT: write the iterations out, or keep one "
                     "layer in a loop (default unroll)")
    exp.add_argument("--quantize", choices=["int8"],
                     help="ONNX only: also write a dynamically quantised int8 model and "
                     "serve it")
    exp.add_argument("--task", choices=tasks,
                     help="serve the checkpoint for this task (default: the one its config "
                     "names; a ...ForMaskedLM is an embedding model unless fill-mask)")
    exp.add_argument("--max-length", type=int,
                     help="longest input in tokens, at most the model's positions "
                     "(default: the length a sentence-transformers model was trained for, "
                     "else the model's maximum)")
    exp.add_argument("--pooling", choices=[*POOLINGS, "splade"],
                     help="an embedding model's pooling of its tokens (default: what its "
                     "sentence-transformers files say, else mean); splade: a masked-language "
                     "model's SPLADE embedding, also served sparse at /embed_sparse")
    exp.add_argument("--token-embeddings", action="store_true",
                     help="an embedding model: the artifact gives every token's vector, "
                     "served by TEI's /embed_all, and the service pools them for the other "
                     "embedding routes")
    exp.add_argument("--relevant-label",
                     help="a classification model used as a cross-encoder by /v1/rerank: "
                     "the label whose probability is relevance (default: the second of two)")
    exp.add_argument("--alias", action="append", metavar="NAME",
                     help="a name the model answers to besides its folder's, e.g. an OpenAI "
                     "model name its clients send (repeat for more)")
    exp.add_argument("--force", action="store_true",
                     help="replace an existing model folder (once the new one is complete)")
    exp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from distilserve.models import export

    with status("exporting") as progress:
        try:
            manifest = export.export(args.checkpoint, args.output, args.format, args.loop,
                                     args.quantize, args.task, args.max_length, progress,
                                     force=args.force, relevant_label=args.relevant_label,
                                     pooling=args.pooling,
                                     token_embeddings=args.token_embeddings,
                                     aliases=args.alias)
        except export.ExportError as e:
            print(f"distilserve export: {e}", file=sys.stderr)
            return 1
    parity = manifest.parity
    print(f"max abs diff vs PyTorch: {parity['max_abs_diff']:.3g}, "
          f"{parity['max_scaled_diff']:.3g} of the output's scale "
          f"(tolerance {parity['tolerance']}, shapes {parity['shapes']})")
    if manifest.quantization:
        q = manifest.quantization
        figures = {k: v for k, v in q.items() if isinstance(v, float)}
        print("int8 vs fp32: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items())
              + f" ({len(q['kept_fp32'])} MatMuls kept in fp32)")
    pooled = (f", {manifest.pooling} pooling" if manifest.pooling else "") + (
        " of its token embeddings" if manifest.token_embeddings else "") + (
        f", prompts {', '.join(manifest.prompts)}" if manifest.prompts else "")
    print(f"wrote {args.output} ({manifest.family} {manifest.task}{pooled}, max_length "
          f"{manifest.max_length}, backend {manifest.backend}, artifact {manifest.artifact})")
    return 0
