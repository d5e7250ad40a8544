"""Dynamic batching for one model: a bounded queue of single inputs, merged into batches
bounded by a batch size and a token budget, grouped by length so that little is padding,
run one batch at a time on the model's own inference thread.

While a batch runs, new inputs queue up; the next batch takes them all at once. So a lone
request never waits for company (unless ``max_wait`` asks it to), many clients get large
batches, and a request queued behind a large one waits for a batch, not for all of it
(each batch starts from the request with the fewest inputs started). The model's thread
also tokenises, all the texts that arrived since the last batch in one call, and starts
the next batch as soon as one ends: the event loop only queues inputs and hands out
results. On a GPU a second thread waits for each batch's outputs, so that inputs
arriving meanwhile are tokenised and started at once, queued on the device behind the
running batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class QueueFull(Exception):
    """The model's queue cannot take the request's inputs now."""


class OverQueue(Exception):
    """A request with more inputs than the model's queue holds: it could never be queued."""


class Stopped(Exception):
    """The batcher has stopped (its model was unloaded or replaced): it takes nothing more."""


class InputFailed(Exception):
    """One input the model cannot answer. Its message names it as ``input N``, its
    position among the inputs queued; a route whose queued inputs are not the client's
    (a rerank's query and documents, zero-shot's pairs) names it in the client's terms
    with ``said``."""

    def __init__(self, index: int, *facts):
        super().__init__(index, *facts)  # (the args: pickled across Ray as they are)
        self.index, self.facts = index, facts

    def __str__(self) -> str:
        return self.said(f"input {self.index}")

    def said(self, who: str) -> str:
        raise NotImplementedError


class InputTooLong(InputFailed):
    """An input over the model's max_length tokens, not to be truncated: (index, tokens,
    max_length)."""

    def said(self, who: str) -> str:
        tokens, max_length = self.facts
        return (f"{who} has {tokens} tokens, more than the model's max_length {max_length}; "
                "send truncate: true or a shorter text")


class NotFinite(InputFailed):
    """An input whose outputs hold a NaN or an infinity: numbers past the range of the
    model's dtype, as CMOW's products pass float32's on long inputs (JSON carried them as
    nulls: embeddings and scores of null). (index, tokens)."""

    def said(self, who: str) -> str:
        return (f"{who}: the model's outputs for its {self.facts[0]} tokens are not finite "
                "(its numbers passed the range of its dtype, as CMOW's products do on long "
                "inputs); send a shorter text")


class Request:
    """What the inputs of one request share: how many of them have started, and its
    priority (lower first)."""

    __slots__ = ("started", "priority")

    def __init__(self, priority: int = 0):
        self.started, self.priority = 0, priority


@dataclass
class Item:
    """One input: its text (or pair), then its encoding (``.ids``, ``.type_ids``), and the
    future its result goes to."""

    text: str | tuple[str, str]
    truncation: str | None  # "right", "left" (the end or the start is cut), None: not cut
    future: asyncio.Future | None
    index: int = 0  # its position in the request
    encoding: Any = None
    error: Exception | None = None
    launched: bool = False  # in a batch that is running
    enqueued: float = field(default_factory=time.perf_counter)
    tokenized_s: float = 0.0  # how long the call that tokenised it took
    started: float = 0.0  # when its batch started, and when its outputs were ready
    finished: float = 0.0
    request: Request = field(default_factory=Request)
    depth: int | None = None  # a recursive model's iterations for it (None: its own)

    @property
    def length(self) -> int:
        return len(self.encoding.ids)


def pad(encodings: list, depth: int | None = None) -> dict[str, np.ndarray]:
    """Right-pads encodings (``.ids``, ``.type_ids``): int64 [B, T] arrays, T the longest;
    with ``depth``, also ``num_iterations`` (Backend's), an int64 scalar."""
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encodings):
        n = len(e.ids)
        ids[row, :n] = e.ids
        types[row, :n] = e.type_ids
        mask[row, :n] = 1
    arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if depth is not None:
        arrays["num_iterations"] = np.array(depth, dtype=np.int64)
    return arrays


# On the CPU an input joins a batch only if the padding it brings costs less than running
# it apart would: its own tokens and a forward pass's fixed cost, some 32 tokens' worth
# (loadtests/RESULTS.md has the measurement). A GPU's fixed cost is
# thousands of tokens: None, any.
CPU_PADDING = 32


@dataclass
class Postprocessed:
    """A batch's outputs [B, X] with what every request does to them [B, X'] (a unit
    vector, a classifier's scores): its row ``i`` is input i's pair of them."""

    outputs: np.ndarray
    postprocessed: np.ndarray

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        return self.outputs[row], self.postprocessed[row]


def not_finite(outputs: Any, batch: list[Item]) -> list[Item]:
    """The inputs of a batch whose outputs are not all finite: their rows of [B, ...] (of a
    row per token, [B, T, X], their own tokens', not the padding's), or their arrays of a
    list (fill-mask's). One check of the whole batch where all are finite."""
    if isinstance(outputs, Postprocessed):  # (what the outputs give, the outputs give too)
        outputs = outputs.outputs
    if isinstance(outputs, np.ndarray):
        if outputs.dtype.kind != "f" or np.isfinite(outputs).all():
            return []
        rows = [outputs[row, :item.length] if outputs.ndim > 2 else outputs[row]
                for row, item in enumerate(batch)]
    elif isinstance(outputs, list):
        rows = outputs
    else:
        return []
    return [item for item, row in zip(batch, rows) if not np.isfinite(row).all()]


def take_batch(pending: list[Item], max_size: int, max_tokens: int, max_padding: int | None = None,
               width: Callable[[int], int] = lambda tokens: tokens) -> list[Item]:
    """The oldest input of the request of the lowest priority with the fewest inputs
    started (so that a request queued behind a large one waits for a batch, not for all of
    it; ``pending`` is oldest first), then the queued inputs of its depth closest to it in
    length (its own request's first; inputs of different depths never share a forward
    pass), as long as the padded batch stays within ``max_size`` inputs and ``max_tokens``
    tokens, and each adds at most ``max_padding`` padded tokens more than its own length
    (None: any; a long input among short ones, or a short one among long ones, waits for a
    batch of its own length).
    A batch's length is ``width(its longest input's tokens)``: where the backend rounds it
    up (Backend.batch_width), an input within the rounding pads the others no further."""
    first = min(pending, key=lambda it: (it.request.priority, it.request.started))
    batch, widest = [first], width(first.length)
    rest = (it for it in pending if it is not first and it.depth == first.depth)
    for item in sorted(rest, key=lambda it: (abs(it.length - first.length),
                                             it.request is not first.request)):
        if len(batch) == max_size:
            break
        new_width = max(widest, width(item.length))
        padded = new_width * (len(batch) + 1)
        if padded > max_tokens or (max_padding is not None and padded - widest * len(batch)
                                   > item.length + max_padding):
            continue
        batch.append(item)
        widest = new_width
    return batch


def time_spent(items: list[Item]) -> tuple[float, float, float]:
    """Where a request's inputs spent their time from being queued to the last of their
    outputs, in seconds: (tokenising: the call that tokenised them, waiting, running: the
    time any of their batches ran, overlapping ones counted once)."""
    if len(items) == 1:
        it = items[0]
        running = it.finished - it.started
        return it.tokenized_s, max(0.0, it.finished - it.enqueued - it.tokenized_s - running), \
            running
    tokenizing = max(it.tokenized_s for it in items)
    running, end = 0.0, float("-inf")
    for start, stop in sorted({(it.started, it.finished) for it in items}):
        running += max(0.0, stop - max(start, end))
        end = max(end, stop)
    total = max(it.finished for it in items) - min(it.enqueued for it in items)
    return tokenizing, max(0.0, total - tokenizing - running), running


class Batcher:
    """Batches run on the model's own thread, which tokenises (``encode(texts, truncation)``
    -> encodings) and runs (``run(arrays)`` -> [B, ...] outputs) one batch after another
    without waiting for the event loop; the loop only queues inputs and is handed each
    batch's results.

    With ``collect`` (a GPU), ``run`` only starts a batch on the device and ``collect(what
    run returned)`` waits for its outputs, on a second thread: the first tokenises and
    starts the next batch as soon as inputs arrive, while the device runs the last one.
    At most ``IN_FLIGHT`` batches are started and not yet collected (the device's
    backend stages a batch's inputs in one of two buffers, in turn)."""

    IN_FLIGHT = 2

    def __init__(self, encode: Callable[[list, str | None], list],
                 run: Callable[[dict[str, np.ndarray]], Any], max_length: int,
                 max_size: int, max_tokens: int, max_queue: int, max_wait_s: float = 0.0,
                 on_batch: Callable[[int, float, int | None], None] = lambda *batch: None,
                 on_depth: Callable[[int], None] = lambda depth: None, name: str = "model",
                 collect: Callable[[Any], np.ndarray] | None = None, max_padding: int | None = None,
                 width: Callable[[int], int] = lambda tokens: tokens):
        self.encode, self.run, self.collect, self.name = encode, run, collect, name
        self.max_length, self.max_size, self.max_tokens = max_length, max_size, max_tokens
        self.max_padding, self.width = max_padding, width  # see take_batch
        self.max_queue, self.max_wait_s = max_queue, max_wait_s
        self.on_batch, self.on_depth = on_batch, on_depth
        # shared by the threads, under self.lock: the queue, and with collect the batches
        # started and not yet collected, oldest first. The starting thread waits for
        # inputs or for room on the device, the collecting thread for a started batch.
        self.pending: list[Item] = []
        self.in_flight: deque[tuple[list[Item], Any, float]] = deque()
        self.lock = threading.Lock()
        self.inputs, self.room, self.started = (threading.Condition(self.lock)
                                                for _ in range(3))
        self.stopping = self.launcher_done = False
        self.threads: list[threading.Thread] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.threads = [threading.Thread(target=self._work, name=f"infer-{self.name}",
                                         daemon=True)]
        if self.collect is not None:
            self.threads.append(threading.Thread(target=self._collect_each,
                                                 name=f"collect-{self.name}", daemon=True))
        for thread in self.threads:
            thread.start()

    async def stop(self) -> None:
        """Finishes what is queued, then stops."""
        with self.lock:
            self.stopping = True
            for waiting in (self.inputs, self.room, self.started):
                waiting.notify_all()
        for thread in self.threads:
            await asyncio.to_thread(thread.join)

    def submit(self, texts: list, truncation: str | None, encodings: list | None = None,
               depth: int | None = None, priority: int = 0) -> list[Item]:
        """Queues a request's texts together (with their ``encodings`` when the caller has
        tokenised them: the thread does not again; ``depth``: a recursive model's iterations
        for them, None: its own; ``priority``: lower starts first), or raises QueueFull
        for all of them (OverQueue if they are more than it ever holds; Stopped once
        ``stop`` began)."""
        if len(texts) > self.max_queue:
            raise OverQueue(f"{len(texts)} inputs at once are more than its queue holds "
                            f"({self.max_queue}, DISTILSERVE_MAX_QUEUE)")
        loop = asyncio.get_running_loop()
        encodings = encodings or [None] * len(texts)
        request = Request(priority)
        items = [Item(text, truncation, loop.create_future(), i, enc, request=request,
                      depth=depth) for i, (text, enc) in enumerate(zip(texts, encodings))]
        with self.lock:
            if self.stopping:  # its threads are finishing what was queued before
                raise Stopped(f"model {self.name!r} has stopped")
            if len(self.pending) + len(items) > self.max_queue:
                raise QueueFull(f"{len(self.pending)} inputs queued, limit {self.max_queue}")
            self.pending.extend(items)
            depth = len(self.pending)
            self.inputs.notify()
        self.on_depth(depth)
        return items

    # on the model's threads -------------------------------------------------------------
    def _work(self) -> None:
        """Tokenises and starts batches (and without ``collect`` finishes them)."""
        while True:
            with self.lock:
                while not ((fresh := self._fresh()) and self._room()):
                    if not fresh and self.stopping:  # nothing left to start
                        self.launcher_done = True
                        self.started.notify()
                        return
                    (self.room if fresh else self.inputs).wait()
                if self.max_wait_s and not self.in_flight:  # an idle model waits for company:
                    # until the batch is full, the wait is over, or stop() (Triton's delay)
                    deadline = time.monotonic() + self.max_wait_s
                    while (len(self._fresh()) < self.max_size and not self.stopping
                           and (left := deadline - time.monotonic()) > 0):
                        self.inputs.wait(left)
                # inputs whose client has gone are dropped before inference
                self.pending = [it for it in self.pending if it.launched or not it.future.done()]
                fresh = self._fresh()
            step = None
            if fresh:
                try:
                    step = self._launch(fresh)
                except Exception as e:  # whatever goes wrong fails these inputs, never hangs them
                    for item in fresh:
                        item.error = item.error or e
            if step is not None and self.collect is not None:
                with self.lock:
                    self.in_flight.append(step)
                    self.started.notify()
                step = None
            if step is not None or any(it.error is not None for it in fresh):
                self._finish(*(step or ([], None, 0.0)))  # the batch, and any failures

    def _collect_each(self) -> None:
        """With ``collect``: waits for each started batch, oldest first, and finishes it."""
        while True:
            with self.lock:
                while not self.in_flight and not self.launcher_done:
                    self.started.wait()
                if not self.in_flight:
                    return
                step = self.in_flight[0]
            self._finish(*step)
            with self.lock:
                self.in_flight.popleft()  # its staging buffer may be used again
                self.room.notify()

    def _room(self) -> bool:
        return len(self.in_flight) < self.IN_FLIGHT

    def _fresh(self) -> list[Item]:
        """Queued inputs not yet in a batch, less those already failed."""
        return [it for it in self.pending if not it.launched and it.error is None]

    def _launch(self, pending: list[Item]) -> tuple[list[Item], Any, float] | None:
        """Tokenises what is new, chooses a batch, starts it: (batch, what ``run``
        returned, when it started); None when no input is ready."""
        new = [it for it in pending if it.encoding is None]
        for truncation in dict.fromkeys(it.truncation for it in new):  # in order, once each
            fresh = [it for it in new if it.truncation == truncation]
            began = time.perf_counter()
            encodings = self._encode_each(fresh, truncation)
            took = time.perf_counter() - began
            for item, enc in zip(fresh, encodings):
                item.tokenized_s = took
                if isinstance(enc, Exception):
                    item.error = enc
                    continue
                item.encoding = enc
                if len(enc.ids) > self.max_length:
                    item.error = InputTooLong(item.index, len(enc.ids), self.max_length)
        ready = [it for it in pending if it.error is None]
        if not ready:
            return None
        batch = take_batch(ready, self.max_size, self.max_tokens, self.max_padding, self.width)
        for item in batch:
            item.launched = True
            item.request.started += 1
        started = time.perf_counter()
        try:
            outputs = self.run(pad([it.encoding for it in batch], batch[0].depth))
        except Exception as e:  # a model failure fails its batch, not the service
            outputs = e
        return batch, outputs, started

    def _finish(self, batch: list[Item], outputs: Any, started: float) -> None:
        """Collects a started batch (with ``collect``), takes it and every failed input off
        the queue, and hands their results to the event loop."""
        if self.collect is not None and batch and not isinstance(outputs, Exception):
            try:
                outputs = self.collect(outputs)
            except Exception as e:
                outputs = e
        if not isinstance(outputs, Exception):
            for item in not_finite(outputs, batch):
                item.error = NotFinite(item.index, item.length)
        finished = time.perf_counter()
        with self.lock:
            taken = {id(it) for it in batch}
            failed = [it for it in self.pending if it.error is not None and id(it) not in taken]
            self.pending = [it for it in self.pending
                            if id(it) not in taken and it.error is None]
            depth = len(self.pending)
        self.loop.call_soon_threadsafe(self._deliver, batch, outputs, failed, started,
                                       finished, depth)

    def _encode_each(self, items: list[Item], truncation: str | None) -> list:
        """Their encodings, in one call; if that call fails, one call each, so that a text
        the tokenizer refuses fails alone (its exception in its place), not its cohort."""
        texts = [it.text for it in items]
        try:
            return self.encode(texts, truncation)
        except Exception:
            pass
        out = []
        for text in texts:
            try:
                out.append(self.encode([text], truncation)[0])
            except Exception as e:
                out.append(e)
        return out

    # back on the event loop -------------------------------------------------------------
    def _deliver(self, batch: list[Item], outputs: Any, failed: list[Item], started: float,
                 finished: float, depth: int) -> None:
        self.on_depth(depth)
        for item in failed:
            if not item.future.done():
                item.future.set_exception(item.error)
        if isinstance(outputs, Exception):
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(outputs)
            return
        if batch:
            self.on_batch(len(batch), finished - started, batch[0].depth)
        for row, item in enumerate(batch):
            item.started, item.finished = started, finished
            if item.future.done():
                continue
            if item.error is not None:  # (NotFinite)
                item.future.set_exception(item.error)
            else:
                item.future.set_result(outputs[row])
