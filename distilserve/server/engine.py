"""One served model: validation that needs its tokenizer (an input too long, before
anything is queued) -> batching queue -> tokenise and run on the model's inference thread
(distilserve/server/batching.py) -> one raw output per input (per token, [T, X], for NER, with its
encoding, and for token embeddings), and where a model's postprocessing does not
depend on the request, each output postprocessed too, with its batch (batch_postprocess).
The routes postprocess the rest (distilserve/server/postprocess.py).

Tokenisation is distilserve/server/core/tokenisation.py's (``Engine.text``). Nothing here
knows about HTTP: errors are ``ApiError``-free exceptions that the routes translate
(``InputTooLong``, ``NotFinite``, ``QueueFull``, ``OverQueue``, ``ModelUnavailable``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors.numpy import load_file

from distilserve.models import families
from distilserve.models.io.manifest import DECODER, Manifest, ManifestError
from distilserve.models.io.manifest import FILE as manifest_file
from distilserve.models.runtime import open_backend
from distilserve.models.runtime.base import Backend, BackendError
from distilserve.models.tasks import PAIRED, PER_TOKEN
from distilserve.server import postprocess
from distilserve.server.batching import (
    CPU_PADDING,
    Batcher,
    InputFailed,
    InputTooLong,
    NotFinite,
    OverQueue,
    QueueFull,
    Stopped,
    pad,
    time_spent,
    warmup_shapes,
)
from distilserve.server.core.refusals import ModelLoadError
from distilserve.server.core.tokenisation import TokenIds, Tokenisation
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from distilserve.server.vocabularies import Foreign

if TYPE_CHECKING:
    pass

__all__ = ["Engine", "InputTooLong", "ModelLoadError", "ModelUnavailable", "NotFinite",
           "OverQueue", "QueueFull", "load_engine", "on_own_thread", "open_engine"]

log = logging.getLogger("distilserve")
class ModelUnavailable(Exception):
    """The model's runner is gone for now (a Ray Serve replica that died, or a model
    unloaded or replaced while the request was on its way): retry shortly."""


@dataclass
class Result:
    """What a request gets back: one output per input, what was computed, and where its
    time went (seconds; as TEI's response headers say it: server/routes/common.reply)."""

    outputs: list
    tokens: int
    characters: int  # of the texts run (with their prompts); token-id inputs have none
    tokenize_s: float
    queued_s: float  # waiting: neither tokenised nor in a batch
    inference_s: float  # while one of its batches ran
    device: str
    # each output as its batch was postprocessed on the model's thread (a dense embedding
    # model's unit vector, a classifier's scores: batch_postprocess); None for other models
    postprocessed: list | None = None

    @property
    def compute_type(self) -> str:
        """cpu or gpu, as TEI's x-compute-type says it."""
        return "cpu" if self.device == "cpu" else "gpu"


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


def open_decoder(folder: Path, backend: Backend) -> Callable[[np.ndarray], np.ndarray]:
    """A fill-mask model's decoder: its vectors [N, E] -> logits [N, V], float32 numpy
    both; where the model runs on a GPU, computed there in the model's dtype
    (models/runtime/torch_device.linear), else on the host."""
    weight, bias = read_decoder(folder)
    if backend.device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():  # (an ONNX model on onnxruntime's GPU: torch's too)
            from distilserve.models.runtime.torch_device import linear

            return linear(weight, bias, backend.device, backend.dtype)
    return lambda vectors: vectors @ weight.T + bias


def read_decoder(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """A fill-mask model's decoder, (weight [V, E], bias [V]) in float32; a ModelLoadError
    naming the file if it cannot be read."""
    file = folder / DECODER
    try:
        tensors = load_file(str(file))
        weight, bias = tensors["weight"].astype(np.float32), tensors["bias"].astype(np.float32)
    except Exception as e:  # missing, not safetensors, or without those tensors
        raise ModelLoadError(f"{file}: {type(e).__name__}: {e} (a fill-mask model's "
                             "decoder, written by distilserve export)") from None
    if weight.ndim != 2 or bias.shape != weight.shape[:1]:
        raise ModelLoadError(f"{file}: weight {weight.shape} and bias {bias.shape} are not a "
                             "decoder's [V, E] and [V]")
    return weight, bias


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
    """A model folder served here: its tokenizer and metadata, and (``local``) its runtime
    backend behind a batching queue. distilserve/server/ray_serve.py's RemoteEngine keeps the first
    and sends batches to Ray Serve replicas that hold the second."""

    def __init__(self, name: str, folder: Path, manifest: Manifest, settings: Settings,
                 metrics: Metrics, local: bool = True, cpu_thread: Executor | None = None):
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
        self.graph_tokens = 0  # batches up to that many padded tokens run from CUDA graphs
        self.decoder = None  # fill-mask's, where its batches run (see _queue)
        self.series = metrics.model(name)
        if local:  # first: a broken artifact is the likelier fault, and names the file
            self.backend = open_runtime(folder, manifest, settings)
        # a recursive model's trained depth where a request may ask for fewer iterations
        # (its backend runs the loop kept, or its checkpoint); None: its depth is fixed
        self.depth = self.backend.depth if local else None
        self.text = Tokenisation(folder, manifest, self.task, self.max_length)
        if local:
            self._check_outputs()  # before any CUDA graph: the warm-up captures them in order
            self._queue(settings, cpu_thread)

    def _filled(self, b: int, t: int) -> dict[str, np.ndarray]:
        """A batch of ``b`` inputs of ``t`` tokens of text (no padding), [B, T] each."""
        return pad([TokenIds([self.text.filler] * t, [0] * t)] * b)

    def _check_outputs(self) -> None:
        """One input of max_length tokens, straight to the backend, must run and give what
        the manifest says: a manifest edited by hand, or another model's artifact, is
        refused here, naming the folder, rather than failing requests (a max_length past
        the model's positions, labels that are not its outputs)."""
        t = self.max_length
        try:
            out = self.backend.run(self._filled(1, t))
        except Exception as e:
            raise ModelLoadError(f"{self.folder}: an input of its max_length ({t} tokens, "
                                 "more than the model takes?) failed: "
                                 f"{type(e).__name__}: {e}".split("\n")[0]) from None
        width = {"embed": self.manifest.dimensions, "classify": len(self.labels),
                 "ner": len(self.labels), "qa": 2}.get(self.task)  # fill-mask's: hidden
        want = ((1, t) if self.per_token or self.task == "fill-mask" else (1,)) + (width,)
        if len(out.shape) != len(want) or any(w not in (None, o) for o, w in
                                              zip(out.shape, want)):
            said = ", ".join(f"{k} {v}" for k, v in (
                ("task", self.task), ("labels", len(self.labels)),
                ("dimensions", self.manifest.dimensions),
                ("token_embeddings", self.manifest.token_embeddings)) if v)
            raise ModelLoadError(
                f"{self.folder}: its artifact gives outputs of shape {list(out.shape)} for "
                f"one input of {t} tokens, where its manifest ({said}) says "
                f"{['?' if w is None else w for w in want]}: re-export it")

    def _queue(self, settings: Settings, cpu_thread: Executor | None) -> None:
        """The backend's batching queue (on the model's own thread; a PyTorch model on the
        CPU runs on ``cpu_thread``, where one is given), and its CUDA graphs on a GPU."""
        name = self.name
        # fill-mask: the language-model head's decoder, which its batches run (see decoding)
        self.decoder = (open_decoder(self.folder, self.backend) if self.task == "fill-mask"
                        else None)
        # the batch limits, decided here and read from here wherever they are reported
        self.batch_limits = batch_size, batch_tokens = settings.batch_limits(self.backend.device)
        self.shapes = warmup_shapes(batch_size, batch_tokens, self.max_length)
        tokens = settings.cuda_graph_tokens
        used = bool(tokens) and self.backend.use_graphs(self.shapes, tokens)
        self.graph_tokens = tokens if used else 0
        if tokens and not used and not self.backend.device.startswith("cpu"):
            log.info("%s: no CUDA graphs (%s backend on %s): they are for the torch and "
                     "TorchScript backends", name, self.backend.name, self.backend.device)
        overlap = self.backend.asynchronous  # a GPU: prepare a batch while one runs
        run = self.backend.launch if overlap else self.backend.run
        collect = self.backend.collect if overlap else None
        if cpu_thread is not None and self.backend.openmp:
            # the service's PyTorch models take turns on one thread: each on a thread of its
            # own would have an OpenMP team of its own, and with more team threads than cores
            # every small op waits (on_own_thread; loadtests/RESULTS.md has the measurement)
            run = functools.partial(_run_on, cpu_thread, run)
        if self.task == "fill-mask":
            run, collect = decoding(self, run, collect)
        if self.batch_postprocess is not None:
            run, collect = postprocessing(run, collect, self.batch_postprocess)
        self.batcher = Batcher(
            self.text.tokenize, run,
            self.max_length, batch_size,
            batch_tokens, settings.max_queue, settings.max_wait_ms / 1000,
            on_depth=self.series.queue_depth.set,  # (on_batch once warmed up: start)
            name=name, collect=collect,
            max_padding=CPU_PADDING if self.backend.device.startswith("cpu") else None)

    def describe(self) -> dict:
        info = {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "distilserve",
                "task": self.task, "family": self.family, "backend": self.backend.name,
                "max_length": self.max_length, "device": self.backend.device,
                "dtype": self.backend.dtype, "dtype_reason": self.backend.dtype_reason}
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
        if self.graph_tokens:
            info["cuda_graph_tokens"] = self.graph_tokens
        # an int8 export, run as such (not its checkpoint, run on a GPU in its place)
        if self.manifest.quantization and self.backend.name == "onnx":
            info["quantization"] = "int8"
        if self.task in ("classify", "ner"):
            info["labels"] = self.labels
        if self.text.mask_token is not None:
            info["mask_token"] = self.text.mask_token
        if self.multi_label:
            info["multi_label"] = True
        if self.entailment is not None:  # an NLI model: /v1/classify's candidate_labels
            info["zero_shot"] = True
        return info

    async def start(self, warmup: bool = True) -> None:
        if warmup and self.backend.device != "cpu":
            await on_own_thread(self._warm_shapes)
        self.batcher.start()
        if warmup:  # first runs allocate and optimise; do them before traffic
            # (a pair of one token each: question answering keeps its question whole)
            sample = ("warm", "up") if self.task in PAIRED else "warm up"
            for _ in range(2):
                await self.infer([sample], "right")
        self.batcher.on_batch = self._observe_batch  # what the clients' inputs ran

    def _observe_batch(self, size: int, seconds: float, depth: int | None) -> None:
        self.series.observe_batch(size, seconds, depth or self.depth)

    def _warm_shapes(self) -> None:
        """On a GPU, before traffic: two batches of each of ``self.shapes``. The first shape
        needs the most memory that the batch limits allow: if it fails, the model is not
        served and the message says which limits to lower. The others make the device's
        first runs at each size (kernel selection; a TorchScript graph profiles a shape's
        first run and compiles for it at the second; with DISTILSERVE_CUDA_GRAPH_TOKENS, a
        small shape's CUDA graph is captured) happen now rather than under load.
        The log says how long they took."""
        began, slowest = time.perf_counter(), (0.0, self.shapes[0])
        for n, (b, t) in enumerate(self.shapes):
            batch = self._filled(b, t)
            for _ in range(2):
                started = time.perf_counter()
                try:
                    self.backend.run(batch)
                except Exception as e:
                    hint = (" (the largest batch the limits allow: lower "
                            "DISTILSERVE_MAX_BATCH_TOKENS or DISTILSERVE_MAX_BATCH_SIZE)"
                            if n == 0 else "")
                    raise ModelLoadError(
                        f"{self.folder}: a warm-up batch of {b} inputs x {t} tokens failed "
                        f"on {self.backend.device}{hint}: {type(e).__name__}: {e}") from None
                slowest = max(slowest, (time.perf_counter() - started, (b, t)))
        log.info("warmed %s on %s: %d batch shapes twice in %.2f s, the slowest run %d x %d "
                 "in %.0f ms", self.name, self.backend.device, len(self.shapes),
                 time.perf_counter() - began, *slowest[1], slowest[0] * 1000)

    async def stop(self) -> None:
        await self.batcher.stop()

    @property
    def dimensions(self) -> int | None:
        """An embedding model's width."""
        return self.manifest.dimensions

    # run ----------------------------------------------------------------------------
    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None,
                    iterations: int | None = None) -> Result:
        """The texts' raw outputs, each cut to max_length as ``truncation`` says (see
        tokenize); with None, an input longer is refused before anything is queued. With
        ``windows`` (size, stride): each input runs as its windows (see windows), each an
        input of the batches, and its outputs are its windows' (a list of them).
        ``iterations``: a recursive model's depth for them, 1 to ``self.depth`` (None: its
        own; the caller checks it)."""
        encodings, tokenizing, groups, owners = None, 0.0, None, None
        if windows is not None:
            began = time.perf_counter()
            groups = await asyncio.to_thread(self.text.windows, texts, *windows)
            tokenizing = time.perf_counter() - began
            encodings = [window for group in groups for window in group]
            owners = [i for i, group in enumerate(groups) for _ in group]  # each window's input
            if len(encodings) > self.batcher.max_queue:
                raise OverQueue(f"{len(encodings)} windows of {len(texts)} input(s) are "
                                f"more than its queue holds ({self.batcher.max_queue}, "
                                "DISTILSERVE_MAX_QUEUE), a smaller stride makes fewer")
        elif truncation is None:
            began = time.perf_counter()
            try:
                encodings = await asyncio.to_thread(self.text.tokenize, texts, None)
            except Exception:  # the model's thread encodes them one by one and fails the bad
                encodings = []
            tokenizing = time.perf_counter() - began
            for i, enc in enumerate(encodings):
                if len(enc.ids) > self.max_length:
                    raise InputTooLong(i, len(enc.ids), self.max_length)
        queued = texts if owners is None else [texts[i] for i in owners]  # a window: its input's
        try:
            items = self.batcher.submit(queued, truncation, encodings, iterations if (
                self.depth is not None and iterations != self.depth) else None)
        except QueueFull:
            self.series.rejected.inc(len(queued))
            raise
        except Stopped:  # unloaded or replaced (repository polling) since it was chosen
            raise ModelUnavailable("it was unloaded or replaced") from None
        try:
            futures = [item.future for item in items]  # one input: no gather
            raw = [await futures[0]] if len(items) == 1 else await asyncio.gather(*futures)
        except BaseException as e:  # an input too long, or the client went away: drop the rest
            for item in items:
                item.future.cancel()
            if owners is not None and isinstance(e, InputFailed):  # a window: its input's
                raise type(e)(owners[e.index], *e.facts) from None
            raise
        encodings = [item.encoding for item in items]
        if truncation is not None and (cut := sum(1 for e in encodings if e.overflowing)):
            self.series.truncated.inc(cut)  # the Rust encodings' overflowing: what was cut
        outputs = [r[: len(e.ids)] if self.per_token else r for r, e in zip(raw, encodings)]
        postprocessed = None
        if self.batch_postprocess is not None:  # each [2X]: its output, then postprocessed
            postprocessed = [r[len(r) // 2:] for r in outputs]
            outputs = [r[:len(r) // 2] for r in outputs]
        if self.task in PER_TOKEN:  # postprocessed with their encodings
            outputs = list(zip(outputs, encodings))
        if groups is not None:  # each input's windows
            ran = iter(outputs)
            outputs = [[next(ran) for _ in group] for group in groups]
        tokenized, waited, running = time_spent(items)
        tokenizing += tokenized  # before it was queued (truncation None), and on its thread
        characters = sum(len(t) if isinstance(t, str) else 0 if isinstance(t, list)
                         else len(t[0]) + len(t[1]) for t in texts)  # text, ids, pair
        return Result(outputs, sum(len(e.ids) for e in encodings), characters,
                      tokenizing, waited, running, self.backend.device, postprocessed)


def decoding(engine: Engine, run, collect) -> tuple:
    """A fill-mask model's batches: ``run`` and ``collect`` (a GPU's, or None) such that a
    batch's outputs are, per input, its mask tokens' logits [M, V], the language-model
    head's decoder run once per batch on all its mask tokens (postprocess.decode_masks),
    on the model's thread; with ``collect``, the batch's token ids go with what ``run``
    started."""
    def decode(ids: np.ndarray, vectors: np.ndarray) -> list[np.ndarray]:
        return postprocess.decode_masks(ids, vectors, engine.text.mask_id, engine.decoder)

    if collect is None:
        return (lambda arrays: decode(arrays["input_ids"], run(arrays))), None
    return ((lambda arrays: (run(arrays), arrays["input_ids"])),
            (lambda started: decode(started[1], collect(started[0]))))


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


def postprocessing(run, collect, post: Callable[[np.ndarray], np.ndarray]) -> tuple:
    """``run`` and ``collect`` (a GPU's, or None) such that a batch's outputs [B, X] come
    with ``post`` of them, [B, 2X], each input's row and then its row postprocessed: once
    per batch, on the model's thread. Done per request on the event loop, such small numpy
    calls cost a fifth of one process's throughput at 512 clients (loadtests/RESULTS.md)."""
    def both(outputs: np.ndarray) -> np.ndarray:  # [B, X] -> [B, 2X]
        with np.errstate(invalid="ignore"):  # an input's infinities: NotFinite, not a warning
            return np.concatenate([outputs, post(outputs)], axis=1)

    if collect is None:
        return (lambda arrays: both(run(arrays))), None
    return run, (lambda started: both(collect(started)))


def _run_on(thread: Executor, run, arrays):
    return thread.submit(run, arrays).result()


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


async def on_own_thread(fn, *args):
    """``fn(*args)`` on a new thread, which ends with it (asyncio.to_thread's threads stay).

    For PyTorch work off the thread the models run on (loading, training, the GPU
    warm-up): its CPU thread pool (OpenMP) keeps a team of threads for every thread that
    has run a parallel operation, for as long as that thread lives, and once the teams hold
    more threads than there are cores, idle ones sleep at once rather than wait for the
    next operation, so that every small operation of a forward pass waits for them to wake."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="load")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    finally:
        pool.shutdown(wait=False)  # its thread ends once fn returns


DAEMON_THREAD = "abandonable"  # on_daemon_thread's threads' name


async def on_daemon_thread(fn, *args):
    """``fn(*args)`` on a new thread, as ``on_own_thread``, that the process does not wait
    for at exit: work that a stopping service abandons (the embedded default's build, which
    stops itself at its next step, while an export in between runs for seconds)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run():
        try:
            outcome = (done.set_result, fn(*args))
        except BaseException as e:
            outcome = (done.set_exception, e)

        def settle():
            if not done.done():  # (cancelled: the service stopped waiting)
                outcome[0](outcome[1])

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=run, daemon=True, name=DAEMON_THREAD).start()
    return await done
