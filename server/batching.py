"""Dynamic batching for one model: a bounded queue of single inputs, merged into batches
bounded by a batch size and a token budget, grouped by length so that little is padding,
run one batch at a time on the model's own inference thread.

While a batch runs, new inputs queue up; the next batch takes them all at once. So a lone
request never waits for company (unless ``max_wait`` asks it to), and many clients get
large batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np


class QueueFull(Exception):
    """The model's queue cannot take the request's inputs now."""


@dataclass
class Item:
    """One input: its token ids and types, and the future its result goes to."""

    ids: list[int]
    type_ids: list[int]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)
    queued_s: float = 0.0
    inference_s: float = 0.0

    @property
    def length(self) -> int:
        return len(self.ids)


def pad(items: list[Item]) -> dict[str, np.ndarray]:
    """Right-pads a batch: int64 [B, T] arrays, T the longest input."""
    width = max(item.length for item in items)
    ids = np.zeros((len(items), width), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, item in enumerate(items):
        ids[row, : item.length] = item.ids
        types[row, : item.length] = item.type_ids
        mask[row, : item.length] = 1
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


class Batcher:
    def __init__(self, run: Callable[[dict[str, np.ndarray]], np.ndarray], executor: Executor,
                 max_size: int, max_tokens: int, max_queue: int, max_wait_s: float = 0.0,
                 on_batch: Callable[[int, float], None] = lambda size, seconds: None,
                 on_depth: Callable[[int], None] = lambda depth: None):
        self.run, self.executor = run, executor
        self.max_size, self.max_tokens = max_size, max_tokens
        self.max_queue, self.max_wait_s = max_queue, max_wait_s
        self.on_batch, self.on_depth = on_batch, on_depth
        self.pending: list[Item] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Finishes what is queued, then stops."""
        while self.pending:
            await asyncio.sleep(0.01)
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def submit(self, inputs: list[tuple[list[int], list[int]]]) -> list[Item]:
        """Queues a request's inputs together, or raises QueueFull for all of them."""
        if len(self.pending) + len(inputs) > self.max_queue:
            raise QueueFull(f"{len(self.pending)} inputs queued, limit {self.max_queue}")
        loop = asyncio.get_running_loop()
        items = [Item(ids, types, loop.create_future()) for ids, types in inputs]
        self.pending.extend(items)
        self.on_depth(len(self.pending))
        self.wake.set()
        return items

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            if self.max_wait_s and len(self.pending) < self.max_size:
                await asyncio.sleep(self.max_wait_s)
            # inputs whose client has gone are dropped before inference
            self.pending = [it for it in self.pending if not it.future.done()]
            if not self.pending:
                self.wake.clear()
                self.on_depth(0)
                continue
            batch = take_batch(self.pending, self.max_size, self.max_tokens)
            taken = {id(it) for it in batch}
            self.pending = [it for it in self.pending if id(it) not in taken]
            self.on_depth(len(self.pending))
            started = time.perf_counter()
            try:
                outputs = await loop.run_in_executor(self.executor, self.run, pad(batch))
            except Exception as e:  # a model failure fails its batch, not the service
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            finished = time.perf_counter()
            self.on_batch(len(batch), finished - started)
            for row, item in enumerate(batch):
                item.queued_s, item.inference_s = started - item.enqueued, finished - started
                if not item.future.done():
                    item.future.set_result(outputs[row])
