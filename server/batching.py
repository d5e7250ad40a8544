"""Dynamic batching for one model: a bounded queue of single inputs, merged into batches
bounded by a batch size and a token budget, grouped by length so that little is padding,
run one batch at a time on the model's own inference thread.

While a batch runs, new inputs queue up; the next batch takes them all at once. So a lone
request never waits for company (unless ``max_wait`` asks it to), and many clients get
large batches. The model's thread also tokenises, all the texts that arrived since the
last batch in one call, and starts the next batch as soon as one ends: the event loop only
queues inputs and hands out results.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class QueueFull(Exception):
    """The model's queue cannot take the request's inputs now."""


class InputTooLong(Exception):
    """An input over the model's max_length tokens, with truncate false."""

    @classmethod
    def of(cls, index: int, tokens: int, max_length: int) -> InputTooLong:
        return cls(f"input {index} has {tokens} tokens, more than the model's max_length "
                   f"{max_length}; send truncate: true or a shorter text")


@dataclass
class Item:
    """One input: its text (or pair), then its encoding (``.ids``, ``.type_ids``), and the
    future its result goes to."""

    text: str | tuple[str, str]
    truncate: bool
    future: asyncio.Future | None
    index: int = 0  # its position in the request
    encoding: Any = None
    error: Exception | None = None
    launched: bool = False  # in a batch that is running
    enqueued: float = field(default_factory=time.perf_counter)
    queued_s: float = 0.0
    inference_s: float = 0.0

    @property
    def length(self) -> int:
        return len(self.encoding.ids)


def pad(encodings: list) -> dict[str, np.ndarray]:
    """Right-pads encodings (``.ids``, ``.type_ids``): int64 [B, T] arrays, T the longest."""
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encodings):
        n = len(e.ids)
        ids[row, :n] = e.ids
        types[row, :n] = e.type_ids
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def take_batch(pending: list[Item], max_size: int, max_tokens: int) -> list[Item]:
    """The oldest input, then the queued inputs closest to it in length, as long as the
    padded batch stays within ``max_size`` inputs and ``max_tokens`` tokens."""
    first = pending[0]
    batch, width = [first], first.length
    for item in sorted(pending[1:], key=lambda it: abs(it.length - first.length)):
        if len(batch) == max_size:
            break
        new_width = max(width, item.length)
        if new_width * (len(batch) + 1) > max_tokens:
            continue
        batch.append(item)
        width = new_width
    return batch


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


class Batcher:
    """Batches run on the model's own thread, which tokenises (``encode(texts, truncate)``
    -> encodings) and runs (``run(arrays)`` -> [B, ...] outputs) one batch after another
    without waiting for the event loop; the loop only queues inputs and is handed each
    batch's results.

    With ``collect`` (a GPU), ``run`` only starts a batch on the device and ``collect(what
    run returned)`` waits for its outputs: the thread then tokenises and starts the next
    batch while the device runs the last one, and collects that one afterwards."""

    def __init__(self, encode: Callable[[list, bool], list],
                 run: Callable[[dict[str, np.ndarray]], Any], max_length: int,
                 max_size: int, max_tokens: int, max_queue: int, max_wait_s: float = 0.0,
                 on_batch: Callable[[int, float], None] = lambda size, seconds: None,
                 on_depth: Callable[[int], None] = lambda depth: None, name: str = "model",
                 collect: Callable[[Any], np.ndarray] | None = None):
        self.encode, self.run, self.collect, self.name = encode, run, collect, name
        self.max_length, self.max_size, self.max_tokens = max_length, max_size, max_tokens
        self.max_queue, self.max_wait_s = max_queue, max_wait_s
        self.on_batch, self.on_depth = on_batch, on_depth
        self.pending: list[Item] = []  # shared with the thread: under self.changed
        self.changed = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._work, name=f"infer-{self.name}",
                                       daemon=True)
        self.thread.start()

    async def stop(self) -> None:
        """Finishes what is queued, then stops."""
        with self.changed:
            self.stopping = True
            self.changed.notify()
        if self.thread is not None:
            await asyncio.to_thread(self.thread.join)

    def submit(self, texts: list, truncate: bool, encodings: list | None = None) -> list[Item]:
        """Queues a request's texts together (with their ``encodings`` when the caller has
        tokenised them: the thread does not again), or raises QueueFull for all of them."""
        loop = asyncio.get_running_loop()
        encodings = encodings or [None] * len(texts)
        items = [Item(text, truncate, loop.create_future(), i, enc)
                 for i, (text, enc) in enumerate(zip(texts, encodings))]
        with self.changed:
            if len(self.pending) + len(items) > self.max_queue:
                raise QueueFull(f"{len(self.pending)} inputs queued, limit {self.max_queue}")
            self.pending.extend(items)
            depth = len(self.pending)
            self.changed.notify()
        self.on_depth(depth)
        return items

    # on the model's thread --------------------------------------------------------------
    def _work(self) -> None:
        launched = None  # with overlap: the batch on the device, collected after the next
        while True:
            with self.changed:
                while launched is None and not self._fresh() and not self.stopping:
                    self.changed.wait()
                if launched is None and not self._fresh():  # stopping, and nothing left
                    return
                waiting = len(self._fresh())
            if self.max_wait_s and launched is None and waiting < self.max_size:
                time.sleep(self.max_wait_s)
            with self.changed:  # inputs whose client has gone are dropped before inference
                self.pending = [it for it in self.pending if it.launched or not it.future.done()]
                fresh = self._fresh()
            step = None
            if fresh:
                try:
                    step = self._launch(fresh)
                except Exception as e:  # whatever goes wrong fails these inputs, never hangs them
                    for item in fresh:
                        item.error = item.error or e
            if launched is not None:  # the device ran it while this thread prepared the next
                self._finish(*launched)
            launched = None
            if step is not None and self.collect is not None:
                launched = step
            elif step is not None:
                self._finish(*step)
            elif fresh:
                self._finish([], None, 0.0)  # hands out the failures

    def _fresh(self) -> list[Item]:
        return [it for it in self.pending if not it.launched]

    def _launch(self, pending: list[Item]) -> tuple[list[Item], Any, float] | None:
        """Tokenises what is new, chooses a batch, starts it: (batch, what ``run``
        returned, when it started); None when no input is ready."""
        for truncate in (True, False):
            fresh = [it for it in pending if it.encoding is None and it.truncate is truncate]
            if not fresh:
                continue
            for item, enc in zip(fresh, self._encode_each(fresh, truncate)):
                if isinstance(enc, Exception):
                    item.error = enc
                    continue
                item.encoding = enc
                if len(enc.ids) > self.max_length:
                    item.error = InputTooLong.of(item.index, len(enc.ids), self.max_length)
        ready = [it for it in pending if it.error is None]
        if not ready:
            return None
        batch = take_batch(ready, self.max_size, self.max_tokens)
        for item in batch:
            item.launched = True
        started = time.perf_counter()
        try:
            outputs = self.run(pad([it.encoding for it in batch]))
        except Exception as e:  # a model failure fails its batch, not the service
            outputs = e
        return batch, outputs, started

    def _finish(self, batch: list[Item], outputs: Any, started: float) -> None:
        """Collects a launched batch (with overlap), takes it and every failed input off
        the queue, and hands their results to the event loop."""
        if self.collect is not None and batch and not isinstance(outputs, Exception):
            try:
                outputs = self.collect(outputs)
            except Exception as e:
                outputs = e
        finished = time.perf_counter()
        with self.changed:
            taken = {id(it) for it in batch}
            failed = [it for it in self.pending if it.error is not None and id(it) not in taken]
            self.pending = [it for it in self.pending
                            if id(it) not in taken and it.error is None]
            depth = len(self.pending)
        self.loop.call_soon_threadsafe(self._deliver, batch, outputs, failed, started,
                                       finished, depth)

    def _encode_each(self, items: list[Item], truncate: bool) -> list:
        """Their encodings, in one call; if that call fails, one call each, so that a text
        the tokenizer refuses fails alone (its exception in its place), not its cohort."""
        texts = [it.text for it in items]
        try:
            return self.encode(texts, truncate)
        except Exception:
            pass
        out = []
        for text in texts:
            try:
                out.append(self.encode([text], truncate)[0])
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
            self.on_batch(len(batch), finished - started)
        for row, item in enumerate(batch):
            item.queued_s, item.inference_s = started - item.enqueued, finished - started
            if not item.future.done():
                item.future.set_result(outputs[row])
