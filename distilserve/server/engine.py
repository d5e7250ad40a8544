"""One served model: its card (what its manifest says it is and does), its tokenisation
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

import functools
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import numpy as np

from distilserve.models import families
from distilserve.models.io.manifest import FILE as manifest_file
from distilserve.models.io.manifest import Manifest, ManifestError
from distilserve.models.runtime import open_backend
from distilserve.models.runtime.base import Backend, BackendError
from distilserve.models.tasks import PER_TOKEN
from distilserve.server.core import postprocess
from distilserve.server.core.batching import InputTooLong, NotFinite, OverQueue, QueueFull
from distilserve.server.core.refusals import ModelLoadError
from distilserve.server.core.runner import Limits, LocalRunner, ModelUnavailable, Result, Runner
from distilserve.server.core.threads import on_daemon_thread, on_own_thread
from distilserve.server.core.tokenisation import TokenIds, Tokenisation
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from distilserve.server.vocabularies import Foreign

__all__ = ["Engine", "InputTooLong", "ModelLoadError", "ModelUnavailable", "NotFinite",
           "OverQueue", "QueueFull", "Result", "TokenIds", "load_engine", "on_daemon_thread",
           "on_own_thread", "open_engine"]


def relevant_index(manifest: Manifest, labels: list[str]) -> int | None:
    """Which output of a classification model is relevance, for rerank: the single
    logit, the label the manifest names (``relevant_label``), or the second of two."""
    if manifest.task != "classify":
        return None
    named = manifest.relevant_label
    if named in labels:
        return labels.index(named)
    return 0 if len(labels) == 1 else 1 if len(labels) == 2 and named is None else None


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
    """A model folder served here: its card and tokenisation, and its ``runner`` (given, as
    Ray Serve's; else a LocalRunner of its runtime backend)."""

    def __init__(self, name: str, folder: Path, manifest: Manifest, settings: Settings,
                 metrics: Metrics, cpu_thread: Executor | None = None,
                 runner: Callable[[Engine], Runner] | None = None):
        self.name, self.folder, self.manifest = name, folder, manifest
        self.task, self.family = manifest.task, manifest.family
        self.labels: list[str] = manifest.labels
        self.relevant = relevant_index(manifest, self.labels)
        # an NLI model's entailment label (the first whose name begins so, as transformers'
        # zero-shot-classification pipeline finds it): it classifies zero-shot
        self.entailment = next((i for i, label in enumerate(self.labels) if
                                label.lower().startswith("entail")), None) \
            if manifest.task == "classify" else None
        self.multi_label = manifest.multi_label  # a classifier's labels are independent
        # an embedding model's prompts by name, and the one put before unprompted inputs
        self.prompts: dict[str, str] = manifest.prompts
        # an embedding model's token-id inputs to /v1/embeddings in another vocabulary than
        # its own (distilserve.server.vocabularies), read back into text; None: in its own
        vocabulary = manifest.token_ids or settings.token_ids
        self.foreign = None
        if self.task == "embed" and vocabulary != "model":
            try:
                self.foreign = Foreign(vocabulary)
            except ImportError as e:
                raise ModelLoadError(f"{folder}: {e}") from None
        # the service pools an embedding model's token vectors (export --token-embeddings)
        self.pools = manifest.pooling if manifest.token_embeddings else None
        # [T, X] an input: NER's labels, QA's start and end, token vectors to pool (not
        # fill-mask's: the batch decodes its mask tokens, [M, V] an input; see decoding)
        self.per_token = (manifest.task in PER_TOKEN and manifest.task != "fill-mask"
                          or self.pools is not None)
        # SPLADE's embeddings: a weight per vocabulary entry, mostly zero, ranked by dot product
        self.sparse = manifest.pooling == "splade"
        # [B, X] -> [B, X]: what every request would do to its outputs, done by the batch
        # (None: nothing is)
        self.batch_postprocess = batch_postprocess(self)
        self.default_prompt = manifest.prompts.get(manifest.default_prompt_name or "", "")
        self.max_length = manifest.max_length
        # OpenAI's model object's "created": when the model was exported (Unix seconds)
        self.created = int((folder / manifest_file).stat().st_mtime)
        self.series = metrics.model(name)
        if runner is None:  # first: a broken artifact is the likelier fault, and names the file
            backend = open_runtime(folder, manifest, settings)
        self.text = Tokenisation(folder, manifest, self.task, self.max_length)
        self.runner: Runner = runner(self) if runner is not None else LocalRunner(
            self, backend, limits(settings, backend.device), cpu_thread)

    def describe(self) -> dict:
        runs = self.runner.describe()
        info = {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "distilserve",
                "task": self.task, "family": self.family, "backend": runs["backend"],
                "max_length": self.max_length, "device": runs["device"],
                "dtype": runs["dtype"], "dtype_reason": runs["dtype_reason"]}
        for key in ("loop", "pooling", "dimensions", "parameters"):
            if getattr(self.manifest, key) is not None:
                info[key] = getattr(self.manifest, key)
        if (trained := self.manifest.num_iterations) is not None:  # a recursive model
            info["iterations"] = {"min": 1 if self.depth else trained, "max": trained,
                                  "default": trained}
        if self.pools:
            info["token_embeddings"] = True
        if self.foreign is not None:
            info["token_ids"] = self.foreign.name
        if self.prompts:
            info["prompts"] = self.prompts
            info["default_prompt_name"] = self.manifest.default_prompt_name
        info.update({k: runs[k] for k in ("cuda_graph_tokens", "quantization") if k in runs})
        if self.task in ("classify", "ner"):
            info["labels"] = self.labels
        if self.text.mask_token is not None:
            info["mask_token"] = self.text.mask_token
        if self.multi_label:
            info["multi_label"] = True
        if self.entailment is not None:  # an NLI model: /v1/classify's candidate_labels
            info["zero_shot"] = True
        return info

    @property
    def dimensions(self) -> int | None:
        """An embedding model's width."""
        return self.manifest.dimensions

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
                    windows: tuple[int, int] | None = None,
                    iterations: int | None = None) -> Result:
        """The texts' raw outputs, as the runner gives them (LocalRunner.infer)."""
        return await self.runner.infer(texts, truncation, windows, iterations)

def batch_postprocess(engine: Engine) -> Callable[[np.ndarray], np.ndarray] | None:
    """What every request to the model does to its outputs unless it asks otherwise, for a
    whole batch [B, X] at once: a dense embedding model's unit vectors (not with
    ``dimensions`` or ``normalize: false``), a classifier's scores (its labels' softmax or
    sigmoid, as transformers' pipeline chooses; not with ``function_to_apply``). None for
    other models."""
    if engine.task == "embed" and engine.pools is None and not engine.sparse:
        return postprocess.normalize
    if engine.task == "classify":
        return functools.partial(postprocess.label_scores, labels=engine.labels,
                                 multi_label=engine.multi_label)
    return None


def limits(settings: Settings, device: str) -> Limits:
    """How a model on ``device`` batches, as the settings say."""
    batch_size, batch_tokens = settings.batch_limits(device)
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


