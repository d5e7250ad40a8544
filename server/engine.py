"""One served model: tokenise -> batching queue -> runtime backend -> postprocess.

Nothing here knows about HTTP: errors are ``ApiError``-free exceptions that the routes
translate (``InputTooLong``, ``QueueFull``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from models.checkpoint import CheckpointError, read_json
from models.runtime import open_backend
from server import postprocess
from server.batching import Batcher, Item, QueueFull
from server.metrics import Metrics
from server.settings import Settings

__all__ = ["Engine", "InputTooLong", "ModelLoadError", "QueueFull", "load_engine"]

REQUIRED = ("task", "family", "backend", "max_length")


class InputTooLong(Exception):
    """An input over the model's max_length tokens, with truncate false."""


class ModelLoadError(Exception):
    """A model folder that cannot be served; the message says why."""


@dataclass
class Result:
    """What a request gets back: one output per input, and where its time went."""

    outputs: list
    tokens: int
    queued_s: float
    inference_s: float


def read_manifest(folder: Path) -> dict:
    file = folder / "manifest.json"
    try:
        manifest = read_json(file, "write model folders with distilserve export")
    except CheckpointError as e:
        raise ModelLoadError(str(e)) from None
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise ModelLoadError(f"{file}: lacks {', '.join(missing)}")
    artifact = manifest.get("artifact") or "checkpoint"
    if Path(artifact).name != artifact:
        raise ModelLoadError(f"{file}: artifact {artifact!r} must be a file in the folder")
    return manifest


class Engine:
    def __init__(self, name: str, folder: Path, manifest: dict, settings: Settings,
                 metrics: Metrics):
        self.name, self.folder, self.manifest = name, folder, manifest
        self.task, self.family = manifest["task"], manifest["family"]
        self.labels: list[str] = manifest.get("labels") or []
        self.max_length = int(manifest["max_length"])
        threads = settings.threads or os.cpu_count() or 1
        try:
            self.backend = open_backend(manifest["backend"], folder, manifest.get("artifact"),
                                        threads, manifest.get("num_iterations"))
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder / "checkpoint"))
        except Exception as e:
            raise ModelLoadError(f"{folder}: {type(e).__name__}: {e}") from None
        self.word_aware = bool(getattr(getattr(self.tokenizer, "_tokenizer", None) and
                                       self.tokenizer._tokenizer.model,
                                       "continuing_subword_prefix", None))
        # transformers re-configures the Rust tokenizer's truncation on each call; two
        # threads doing so at once fail ("Already borrowed"), so calls take turns
        self.tokenizer_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"infer-{name}")
        self.metrics = metrics
        self.batcher = Batcher(
            self.backend.run, self.executor, settings.max_batch_size,
            settings.max_batch_tokens, settings.max_queue, settings.max_wait_ms / 1000,
            on_batch=lambda size, s: metrics.observe_batch(name, size, s),
            on_depth=lambda depth: metrics.queue_depth.labels(name).set(depth))

    def describe(self) -> dict:
        info = {"id": self.name, "object": "model", "owned_by": "distilserve",
                "task": self.task, "family": self.family, "backend": self.manifest["backend"],
                "max_length": self.max_length}
        for key in ("loop", "pooling", "dimensions", "parameters"):
            if self.manifest.get(key) is not None:
                info[key] = self.manifest[key]
        if self.task != "embed":
            info["labels"] = self.labels
        return info

    async def start(self, warmup: bool = True) -> None:
        self.batcher.start()
        if warmup:  # first runs allocate and optimise; do them before traffic
            sample = "warm up" if self.task != "classify" else ("warm up", "pair")
            for _ in range(2):
                await self.run([sample], truncate=True)

    async def stop(self) -> None:
        await self.batcher.stop()
        self.executor.shutdown(wait=True)

    # tokenise -----------------------------------------------------------------------
    def tokenize(self, texts: list, truncate: bool) -> list:
        """Texts (or pairs) -> transformers encodings, in the request's order."""
        kwargs = dict(truncation=truncate, max_length=self.max_length if truncate else None,
                      return_offsets_mapping=self.task == "ner",
                      return_special_tokens_mask=self.task == "ner")
        with self.tokenizer_lock:
            encodings = [self.tokenizer(text[0], text[1], **kwargs) if isinstance(text, tuple)
                         else self.tokenizer(text, **kwargs) for text in texts]
        for i, enc in enumerate(encodings):
            if len(enc["input_ids"]) > self.max_length:
                raise InputTooLong(f"input {i} has {len(enc['input_ids'])} tokens, more than "
                                   f"{self.name}'s max_length {self.max_length}; send "
                                   f"truncate: true or a shorter text")
        return encodings

    # run ----------------------------------------------------------------------------
    async def run(self, texts: list, truncate: bool) -> Result:
        encodings = await asyncio.to_thread(self.tokenize, texts, truncate)
        inputs = [(e["input_ids"], e.get("token_type_ids") or [0] * len(e["input_ids"]))
                  for e in encodings]
        try:
            items: list[Item] = self.batcher.submit(inputs)
        except QueueFull:
            self.metrics.rejected.labels(self.name).inc(len(inputs))
            raise
        try:
            raw = await asyncio.gather(*(item.future for item in items))
        except asyncio.CancelledError:  # the client went away: drop what is queued
            for item in items:
                item.future.cancel()
            raise
        outputs = [r[: len(e["input_ids"])] if self.task == "ner" else r
                   for r, e in zip(raw, encodings)]
        if self.task == "ner":
            outputs = list(zip(outputs, encodings))
        return Result(outputs, sum(len(e["input_ids"]) for e in encodings),
                      max(it.queued_s for it in items), max(it.inference_s for it in items))

    # postprocess ----------------------------------------------------------------------
    def entities(self, text: str, output, strategy: str) -> list[dict]:
        logits, enc = output
        info = postprocess.TokenInfo(
            ids=enc["input_ids"], tokens=self.tokenizer.convert_ids_to_tokens(enc["input_ids"]),
            offsets=enc["offset_mapping"], special=enc["special_tokens_mask"],
            unk_id=self.tokenizer.unk_token_id, word_aware=self.word_aware)
        return postprocess.entities(text, info, np.asarray(logits), self.labels, strategy)


def load_engine(name: str, folder: Path, settings: Settings, metrics: Metrics) -> Engine:
    return Engine(name, folder, read_manifest(folder), settings, metrics)
