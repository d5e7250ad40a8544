"""Runners: what runs a model's inputs once its engine (distilserve/server/engine.py) has
them. The same small interface for each: ``start``, ``stop``, ``infer`` (texts in, a
``Result`` out), ``describe`` (where and how it runs), ``batch_limits`` and ``depth``.
``LocalRunner`` holds the runtime backend here, behind a batching queue (batching.py),
with its warm-up and CUDA graphs; Ray Serve's runner (distilserve/server/ray_deployments.py)
sends the inputs to replicas that each hold a LocalRunner."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from safetensors.numpy import load_file

from distilserve.models.io.manifest import DECODER
from distilserve.models.runtime.base import Backend
from distilserve.models.tasks import PAIRED, PER_TOKEN
from distilserve.server.core import postprocess
from distilserve.server.core.batching import (
    CPU_PADDING,
    Batcher,
    InputFailed,
    InputTooLong,
    OverQueue,
    Postprocessed,
    QueueFull,
    Stopped,
    pad,
    time_spent,
)
from distilserve.server.core.refusals import ModelLoadError
from distilserve.server.core.threads import on_own_thread
from distilserve.server.core.tokenisation import TokenIds

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


@dataclass(frozen=True)
class Limits:
    """How a runner batches: inputs and padded tokens per forward pass, the queue's bound,
    how long a batch waits to fill, and the padded tokens up to which a GPU's batches run
    from CUDA graphs."""

    batch_size: int
    batch_tokens: int
    max_queue: int
    max_wait_s: float
    cuda_graph_tokens: int = 0


class Runner(Protocol):
    batch_limits: tuple[int, int]  # (inputs, padded tokens) per forward pass
    depth: int | None  # a recursive model's depth a request may lower; None: fixed

    async def start(self, warmup: bool = True) -> None: ...

    async def stop(self) -> None: ...

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0) -> Result: ...

    def describe(self) -> dict: ...


def warmup_shapes(max_size: int, max_tokens: int, max_length: int) -> list[tuple[int, int]]:
    """The [B, T] batches a warm-up runs on a GPU, within the batch limits: first the one
    that needs the most memory (the longest inputs, as many as the token budget allows),
    then every power of two of B and of T (from 8), largest first."""
    longest = min(max_length, max_tokens)
    first = (min(max_size, max_tokens // longest), longest)

    def powers(limit: int, start: int) -> list[int]:
        return sorted({limit, *(2 ** k for k in range(start, limit.bit_length()))})

    rest = sorted(((b, t) for b in powers(max_size, 0) for t in powers(longest, 3)
                   if b * t <= max_tokens and (b, t) != first), reverse=True)
    return [first, *rest]


class LocalRunner:
    """``model``'s runtime backend here, behind a batching queue on the model's own thread
    (a PyTorch model on the CPU on ``cpu_thread``, where one is given): the model's outputs
    checked against its manifest first, then its decoder (fill-mask), batch limits, CUDA
    graphs on a GPU. ``model`` is its engine: its card (task, labels, manifest, lengths,
    what a batch postprocesses), its tokenisation (``text``) and its metrics (``series``)."""

    def __init__(self, model, backend: Backend, limits: Limits,
                 cpu_thread: Executor | None = None):
        self.model, self.backend = model, backend
        # a recursive model's trained depth where a request may ask for fewer iterations
        # (its backend runs the loop kept, or its checkpoint); None: its depth is fixed
        self.depth = backend.depth
        self.graph_tokens = 0  # batches up to that many padded tokens run from CUDA graphs
        self._check_outputs()  # before any CUDA graph: the warm-up captures them in order
        self._queue(limits, cpu_thread)

    def describe(self) -> dict:
        """Where and how it runs."""
        info = {"backend": self.backend.name, "device": self.backend.device,
                "dtype": self.backend.dtype, "dtype_reason": self.backend.dtype_reason}
        if self.graph_tokens:
            info["cuda_graph_tokens"] = self.graph_tokens
        # an int8 export, run as such (not its checkpoint, run on a GPU in its place)
        if self.model.manifest.quantization and self.backend.name == "onnx":
            info["quantization"] = "int8"
        return info

    def _filled(self, b: int, t: int) -> dict[str, np.ndarray]:
        """A batch of ``b`` inputs of ``t`` tokens of text (no padding), [B, T] each."""
        return pad([TokenIds([self.model.text.filler] * t, [0] * t)] * b)

    def _check_outputs(self) -> None:
        """One input of max_length tokens, straight to the backend, must run and give what
        the manifest says: a manifest edited by hand, or another model's artifact, is
        refused here, naming the folder, rather than failing requests (a max_length past
        the model's positions, labels that are not its outputs, a depth not its own)."""
        t, trained = self.model.max_length, self.model.manifest.num_iterations
        if None not in (self.depth, trained) and self.depth != trained:
            raise ModelLoadError(f"{self.model.folder}: its manifest says num_iterations "
                                 f"{trained}, where its model runs {self.depth}: re-export it")
        # a loop kept in ONNX runs the manifest's depth: past the model's, it fails here
        at = f" at {trained} iterations" if self.depth else ""
        try:
            out = self.backend.run(self._filled(1, t))
        except Exception as e:
            raise ModelLoadError(f"{self.model.folder}: an input of its max_length ({t} tokens"
                                 f"{at}, more than the model takes?) failed: "
                                 f"{type(e).__name__}: {e}".split("\n")[0]) from None
        width = {"embed": self.model.manifest.dimensions, "classify": len(self.model.labels),
                 "ner": len(self.model.labels), "qa": 2}.get(self.model.task)  # fill-mask's: hidden
        want = ((1, t) if self.model.per_token or self.model.task == "fill-mask" else (1,)) + (width,)
        if len(out.shape) != len(want) or any(w not in (None, o) for o, w in
                                              zip(out.shape, want)):
            said = ", ".join(f"{k} {v}" for k, v in (
                ("task", self.model.task), ("labels", len(self.model.labels)),
                ("dimensions", self.model.manifest.dimensions),
                ("token_embeddings", self.model.manifest.token_embeddings)) if v)
            raise ModelLoadError(
                f"{self.model.folder}: its artifact gives outputs of shape {list(out.shape)} for "
                f"one input of {t} tokens, where its manifest ({said}) says "
                f"{['?' if w is None else w for w in want]}: re-export it")

    def _queue(self, limits: Limits, cpu_thread: Executor | None) -> None:
        """The backend's batching queue (on the model's own thread; a PyTorch model on the
        CPU runs on ``cpu_thread``, where one is given), and its CUDA graphs on a GPU."""
        name = self.model.name
        # fill-mask: the language-model head's decoder, which its batches run (see decoding)
        self.decoder = (open_decoder(self.model.folder, self.backend) if self.model.task == "fill-mask"
                        else None)
        # the batch limits, decided here and read from here wherever they are reported
        self.batch_limits = batch_size, batch_tokens = limits.batch_size, limits.batch_tokens
        self.shapes = warmup_shapes(batch_size, batch_tokens, self.model.max_length)
        tokens = limits.cuda_graph_tokens
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
        if self.model.task == "fill-mask":
            run, collect = decoding(self, run, collect)
        if self.model.batch_postprocess is not None:
            run, collect = postprocessing(run, collect, self.model.batch_postprocess)
        self.batcher = Batcher(
            self.model.text.tokenize, run,
            self.model.max_length, batch_size,
            batch_tokens, limits.max_queue, limits.max_wait_s,
            on_depth=self.model.series.queue_depth.set,  # (on_batch once warmed up: start)
            name=name, collect=collect,
            max_padding=CPU_PADDING if self.backend.device.startswith("cpu") else None,
            width=self.backend.batch_width)

    async def start(self, warmup: bool = True) -> None:
        if warmup and self.backend.device != "cpu":
            await on_own_thread(self._warm_shapes)
        self.batcher.start()
        if warmup:  # first runs allocate and optimise; do them before traffic
            # (a pair of one token each: question answering keeps its question whole)
            sample = ("warm", "up") if self.model.task in PAIRED else "warm up"
            for _ in range(2):
                await self.infer([sample], "right")
        self.batcher.on_batch = self._observe_batch  # what the clients' inputs ran

    def _observe_batch(self, size: int, seconds: float, depth: int | None) -> None:
        self.model.series.observe_batch(size, seconds, depth or self.depth)

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
                        f"{self.model.folder}: a warm-up batch of {b} inputs x {t} tokens failed "
                        f"on {self.backend.device}{hint}: {type(e).__name__}: {e}") from None
                slowest = max(slowest, (time.perf_counter() - started, (b, t)))
        log.info("warmed %s on %s: %d batch shapes twice in %.2f s, the slowest run %d x %d "
                 "in %.0f ms", self.model.name, self.backend.device, len(self.shapes),
                 time.perf_counter() - began, *slowest[1], slowest[0] * 1000)

    async def stop(self) -> None:
        await self.batcher.stop()

    def queue(self, texts: list, truncation: str | None, encodings: list | None,
              iterations: int | None, priority: int = 0) -> list:
        """The inputs queued together for the model's thread (Batcher.submit), at a
        recursive model's ``iterations`` (None: its own), at ``priority`` (lower first);
        QueueFull counted as rejected, and ModelUnavailable once its batcher has stopped
        (the model unloaded or replaced since it was chosen)."""
        try:
            return self.batcher.submit(texts, truncation, encodings, iterations if (
                self.depth is not None and iterations != self.depth) else None, priority)
        except QueueFull:
            self.model.series.rejected.inc(len(texts))
            raise
        except Stopped:
            raise ModelUnavailable("it was unloaded or replaced") from None

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0) -> Result:
        """The texts' raw outputs, each cut to max_length as ``truncation`` says (see
        tokenize); with None, an input longer is refused before anything is queued. With
        ``windows`` (size, stride): each input runs as its windows (see windows), each an
        input of the batches, and its outputs are its windows' (a list of them).
        ``iterations``: a recursive model's depth for them, 1 to ``self.depth`` (None: its
        own; the caller checks it); ``priority``: lower starts first (queue). Texts to
        truncate are tokenised on the model's thread, with the batch."""
        inputs = await prepare(self.model, texts, truncation, windows, self.batcher.max_queue)
        items = self.queue(inputs.queued, truncation, inputs.encodings, iterations, priority)
        raw = await outcomes(items, inputs.owners)
        tokenized, waited, running = time_spent(items)
        inputs.tokenizing += tokenized  # on the model's thread
        return assemble(self.model, inputs, raw, [item.encoding for item in items], waited,
                        running, self.backend.device)


@dataclass
class Inputs:
    """A request's inputs as its runner queues them: one per text, or per window of one."""

    texts: list  # the request's
    truncation: str | None
    queued: list  # what is queued: the texts, or each window's text
    encodings: list | None  # their encodings, where tokenised before they are queued
    tokenizing: float  # seconds spent tokenising them
    groups: list | None = None  # with windows: each text's windows
    owners: list | None = None  # with windows: each window's text


async def prepare(model, texts: list, truncation: str | None,
                  windows: tuple[int, int] | None, max_queue: int,
                  tokenize: Callable | None = None) -> Inputs:
    """``texts`` (their ``windows``, where given) tokenised for ``model`` (an engine: its
    ``text``, ``max_length``) before they are queued: all of them by ``tokenize(texts,
    truncation)`` where given (a front end's TurnTokenizer), else those not to be truncated
    (checked against max_length: InputTooLong) and windows, the rest left to the batch's
    thread. OverQueue for more windows than the queue holds."""
    began = time.perf_counter()
    inputs = Inputs(texts, truncation, texts, None, 0.0)
    if windows is not None:
        inputs.groups = await asyncio.to_thread(model.text.windows, texts, *windows)
        inputs.encodings = [window for group in inputs.groups for window in group]
        inputs.owners = [i for i, group in enumerate(inputs.groups) for _ in group]
        inputs.queued = [texts[i] for i in inputs.owners]
        if len(inputs.encodings) > max_queue:
            raise OverQueue(f"{len(inputs.encodings)} windows of {len(texts)} input(s) are "
                            f"more than its queue holds ({max_queue}, "
                            "DISTILSERVE_MAX_QUEUE), a smaller stride makes fewer")
    elif tokenize is not None or truncation is None:
        try:
            inputs.encodings = await (tokenize(texts, truncation) if tokenize is not None else
                                      asyncio.to_thread(model.text.tokenize, texts, truncation))
        except Exception:
            if tokenize is not None:
                raise
            inputs.encodings = None  # the model's thread encodes them one by one: the bad fail
        for i, enc in enumerate(inputs.encodings or []):
            if len(enc.ids) > model.max_length:
                raise InputTooLong(i, len(enc.ids), model.max_length)
    inputs.tokenizing = time.perf_counter() - began
    return inputs


# a front end's request of up to this many texts is tokenised on its event loop, with the
# others of its turn (TurnTokenizer): a thread's hand-over costs more than a few texts do
INLINE = 4


async def outcomes(items: list, owners: list | None = None) -> list:
    """The outputs of a request's queued items, in order; where one fails (an input too
    long, the client gone), the rest are dropped from the queue and its error raised (a
    window's named as its text, ``owners``)."""
    futures = [item.future for item in items]
    try:  # one input: no gather
        return [await futures[0]] if len(items) == 1 else await asyncio.gather(*futures)
    except BaseException as e:
        for item in items:
            item.future.cancel()
        if owners is not None and isinstance(e, InputFailed):
            raise type(e)(owners[e.index], *e.facts) from None
        raise


def assemble(model, inputs: Inputs, raw: list, encodings: list, waited: float,
             running: float, device: str) -> Result:
    """A request's Result from its inputs' raw outputs (each an output, or with the
    model's batch_postprocess a pair of it and its postprocessed copy) and their
    ``encodings``: a row per token cut to the input's tokens, NER's and the like's paired
    with their encodings, a text's windows' outputs gathered as its list."""
    truncation = inputs.truncation
    if truncation is not None and (cut := sum(1 for e in encodings if e.overflowing)):
        model.series.truncated.inc(cut)  # the Rust encodings' overflowing: what was cut
    outputs = [r[: len(e.ids)] if model.per_token else r for r, e in zip(raw, encodings)]
    postprocessed = None
    if model.batch_postprocess is not None:  # each (its output, postprocessed)
        postprocessed = [post for _, post in outputs]
        outputs = [output for output, _ in outputs]
    if model.task in PER_TOKEN:  # postprocessed with their encodings
        outputs = list(zip(outputs, encodings))
    if inputs.groups is not None:  # each input's windows
        ran = iter(outputs)
        outputs = [[next(ran) for _ in group] for group in inputs.groups]
    texts = inputs.texts
    characters = sum(len(t) if isinstance(t, str) else 0 if isinstance(t, list)
                     else len(t[0]) + len(t[1]) for t in texts)  # text, ids, pair
    return Result(outputs, sum(len(e.ids) for e in encodings), characters,
                  inputs.tokenizing, waited, running, device, postprocessed)


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


def decoding(runner: LocalRunner, run, collect) -> tuple:
    """A fill-mask model's batches: ``run`` and ``collect`` (a GPU's, or None) such that a
    batch's outputs are, per input, its mask tokens' logits [M, V], the language-model
    head's decoder run once per batch on all its mask tokens (postprocess.decode_masks),
    on the model's thread; with ``collect``, the batch's token ids go with what ``run``
    started."""
    def decode(ids: np.ndarray, vectors: np.ndarray) -> list[np.ndarray]:
        return postprocess.decode_masks(ids, vectors, runner.model.text.mask_id,
                                         runner.decoder)

    if collect is None:
        return (lambda arrays: decode(arrays["input_ids"], run(arrays))), None
    return ((lambda arrays: (run(arrays), arrays["input_ids"])),
            (lambda started: decode(started[1], collect(started[0]))))


def postprocessing(run, collect, post: Callable[[np.ndarray], np.ndarray]) -> tuple:
    """``run`` and ``collect`` (a GPU's, or None) such that a batch's outputs [B, X] come
    with ``post`` of them, each input's row a pair (its output, postprocessed): once per
    batch, on the model's thread. Done per request on the event loop, such small numpy
    calls cost a fifth of one process's throughput at 512 clients (loadtests/RESULTS.md)."""
    def both(outputs: np.ndarray) -> Postprocessed:
        with np.errstate(invalid="ignore"):  # an input's infinities: NotFinite, not a warning
            return Postprocessed(outputs, post(outputs))

    if collect is None:
        return (lambda arrays: both(run(arrays))), None
    return run, (lambda started: both(collect(started)))


def _run_on(thread: Executor, run, arrays):
    return thread.submit(run, arrays).result()
