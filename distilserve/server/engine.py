"""One served model: its card (distilserve/server/core/card.py, ``Engine.card``: what its
manifest says it is and does), its tokenisation
(distilserve/server/core/tokenisation.py, ``Engine.text``) and its runner
(distilserve/server/core/runner.py, ``Engine.runner``: here, the backend behind a batching
queue; on Ray Serve, its replicas). ``infer`` gives one raw output per input (per token,
[T, X], for NER, with its encoding, and for token embeddings), and where a model's
postprocessing does not depend on the request, each output postprocessed too, with its
batch (batch_postprocess). The routes postprocess the rest
(distilserve/server/core/postprocess.py).

Nothing here knows about HTTP: errors are ``ApiError``-free exceptions that the routes
translate (``InputTooLong``, ``NotFinite``, ``QueueFull``, ``OverQueue``,
``ModelUnavailable``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from stat import S_ISDIR

from distilserve.models import families
from distilserve.models.io.manifest import Manifest, ManifestError
from distilserve.models.runtime import open_backend
from distilserve.models.runtime.base import Backend, BackendError
from distilserve.server.core.batching import InputTooLong, NotFinite, OverQueue, QueueFull
from distilserve.server.core.card import Card
from distilserve.server.core.refusals import ModelLoadError
from distilserve.server.core.runner import Limits, LocalRunner, ModelUnavailable, Result, Runner
from distilserve.server.core.threads import on_daemon_thread, on_own_thread
from distilserve.server.core.tokenisation import TokenIds, Tokenisation
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from distilserve.server.vocabularies import Foreign

__all__ = ["Engine", "InputTooLong", "ModelLoadError", "ModelUnavailable", "NotFinite",
           "OverQueue", "QueueFull", "Result", "TokenIds", "folder_version", "load_engine",
           "on_daemon_thread", "on_own_thread", "open_engine"]


def folder_version(folder: Path) -> str:
    """What changes when any file a model folder serves changes (a new export put in its
    place whole, an artefact copied under an unchanged manifest, the rest of a folder
    copied after its manifest): a digest of each file's path, inode, size and
    modification time."""
    version = []
    for path in sorted(folder.rglob("*")):
        try:
            stat = path.stat()
        except OSError:  # removed while listed: the next poll sees the folder without it
            continue
        if not S_ISDIR(stat.st_mode):
            version.append((str(path.relative_to(folder)), stat.st_ino, stat.st_size,
                            stat.st_mtime_ns))
    return hashlib.blake2b(repr(version).encode(), digest_size=16).hexdigest()


def read_manifest(folder: Path) -> Manifest:
    try:
        return Manifest.read(folder)
    except ManifestError as e:
        raise ModelLoadError(str(e)) from None


def open_runtime(folder: Path, manifest: Manifest, settings: Settings) -> Backend:
    """The runtime backend that serves a model folder: on the manifest's device and dtype,
    else the settings'; an ONNX model asked onto a GPU that its onnxruntime cannot use runs
    there from its checkpoint, traced at load. A failure is a ModelLoadError naming the
    folder."""
    try:
        return open_backend(
            manifest.backend, folder, manifest.artifact, settings.model_threads(),
            manifest.num_iterations, manifest.device or settings.device,
            manifest.dtype or settings.dtype, manifest.allowed_dtypes, checkpoint_instead=True,
            token_embeddings=manifest.token_embeddings, task=manifest.task,
            quantized=manifest.quantization is not None,
            cpu_bf16=families.get(manifest.family).cpu_bf16, keep_loop=manifest.loop == "keep")
    except BackendError as e:
        raise ModelLoadError(f"{folder}: {e}") from None


class Engine:
    """A model folder served here: its card, its tokenisation, and its ``runner`` (given,
    as Ray Serve's and the shared engine's; else a LocalRunner of its runtime backend).
    The card's facts read as the engine's own (``engine.task``, ``engine.labels``)."""

    def __init__(self, name: str, folder: Path, manifest: Manifest, settings: Settings,
                 metrics: Metrics, cpu_thread: Executor | None = None,
                 runner: Callable[[Engine], Runner] | None = None):
        self.card = Card(name, folder, manifest)
        self.version = folder_version(folder)  # which export of the folder it serves
        # an embedding model's token-id inputs to /v1/embeddings in another vocabulary than
        # its own (distilserve.server.vocabularies), read back into text; None: in its own
        vocabulary = manifest.token_ids or settings.token_ids
        self.foreign = None
        if manifest.task == "embed" and vocabulary != "model":
            try:
                self.foreign = Foreign(vocabulary)
            except ImportError as e:
                raise ModelLoadError(f"{folder}: {e}") from None
        self.series = metrics.model(name)
        if runner is None:  # first: a broken artifact is the likelier fault, and names the file
            backend = open_runtime(folder, manifest, settings)
        self.text = Tokenisation(folder, manifest, manifest.task, manifest.max_length)
        self.runner: Runner = runner(self) if runner is not None else LocalRunner(
            self, backend, limits(settings, backend.device, backend.dtype), cpu_thread)

    def __getattr__(self, name: str):
        if name == "card":  # (not set yet: the card is the first attribute set)
            raise AttributeError(name)
        return getattr(self.card, name)

    def describe(self) -> dict:
        trained = self.manifest.num_iterations  # a recursive model's
        return self.card.describe(
            self.runner.describe(), token_ids=self.foreign and self.foreign.name,
            iterations=None if trained is None else {
                "min": 1 if self.depth else trained, "max": trained, "default": trained},
            mask_token=self.text.mask_token)

    @property
    def depth(self) -> int | None:
        """A recursive model's trained depth where a request may ask for fewer iterations
        (its runner runs the loop kept, or its checkpoint); None: its depth is fixed."""
        return self.runner.depth

    @property
    def batch_limits(self) -> tuple[int, int]:
        """(inputs, padded tokens) per forward pass, as its runner batches."""
        return self.runner.batch_limits

    async def start(self, warmup: bool = True) -> None:
        await self.runner.start(warmup)

    async def stop(self) -> None:
        await self.runner.stop()

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0) -> Result:
        """The texts' raw outputs, as the runner gives them (LocalRunner.infer)."""
        return await self.runner.infer(texts, truncation, windows, iterations, priority)


def limits(settings: Settings, device: str, dtype: str) -> Limits:
    """How a model on ``device`` in ``dtype`` batches, as the settings say."""
    batch_size, batch_tokens = settings.batch_limits(device, dtype)
    return Limits(batch_size, batch_tokens, settings.max_queue, settings.max_wait_ms / 1000,
                  settings.cuda_graph_tokens)


def load_engine(name: str, folder: Path, settings: Settings, metrics: Metrics,
                cpu_thread: Executor | None = None) -> Engine:
    return Engine(name, folder, read_manifest(folder), settings, metrics,
                  cpu_thread=cpu_thread)


async def open_engine(name: str, folder: Path, settings: Settings, metrics: Metrics,
                      cpu_thread: Executor | None = None) -> Engine:
    """The model in ``folder`` loaded (on a thread of its own) and started, warmed up
    unless the settings say not; ``cpu_thread``: where the process's PyTorch models run
    on the CPU, in turn."""
    engine = await on_own_thread(load_engine, name, folder, settings, metrics, cpu_thread)
    try:
        await engine.start(settings.warmup)
    except BaseException:
        await engine.stop()
        raise
    return engine


