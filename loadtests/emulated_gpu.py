"""A stand-in for a GPU, to study the service's batching on a machine without one:
``python -m loadtests.emulated_gpu serve [distilserve serve flags]`` serves with every
model's backend replaced by it (in the shared engine process too), and ``python -m
loadtests.peer --emulate-gpu`` (or loadtests.engines) measures that service.

Its ``launch`` takes ``LAUNCH_S`` without the GIL and queues the batch on the device; the
device runs batches one after another, each ``FIXED_S`` + ``PER_INPUT_S`` per input;
``collect`` waits for the batch. The times are those of a MiniLM-sized model run from CUDA
graphs (the default on a GPU) in fp16 on an H100: one sentence in-process, tokenising
included, and batches of 256 (loadtests/GPU_RESULTS.md has the measurements). The outputs
are ones of the model's output shape (an embedding, a logit per label, or a row per token:
NER's labels, QA's start and end, fill-mask's vectors before the decoder): only timing is
emulated. (Ones, not zeros: a zero embedding has no length, and its normalisation would
take the slow path that postprocess.normalize keeps for lengths out of float32's range.)"""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
from safetensors import safe_open

from distilserve.models.io.manifest import DECODER, Manifest
from distilserve.models.runtime.base import INPUT_NAMES, Backend

LAUNCH_S, FIXED_S, PER_INPUT_S = 0.0001, 0.0003, 16e-6


class EmulatedGpu(Backend):
    name, device, dtype, asynchronous = "emulated", "emulated-gpu", "fp16", True

    def __init__(self, width: int = 384, per_token: bool = False):
        self.width, self.per_token = width, per_token
        self.queue: queue.Queue[tuple[int, threading.Event]] = queue.Queue()
        threading.Thread(target=self._device, name="emulated-gpu", daemon=True).start()

    def _device(self) -> None:
        while True:
            size, done = self.queue.get()
            time.sleep(FIXED_S + PER_INPUT_S * size)
            done.set()

    def launch(self, inputs: dict[str, np.ndarray]) -> tuple[tuple[int, ...], threading.Event]:
        np.stack([inputs[k] for k in INPUT_NAMES])  # staging, as the torch backends do
        time.sleep(LAUNCH_S)
        done = threading.Event()
        batch, length = inputs["input_ids"].shape
        self.queue.put((batch, done))
        return (batch, length, self.width) if self.per_token else (batch, self.width), done

    def collect(self, launched: tuple[tuple[int, ...], threading.Event]) -> np.ndarray:
        shape, done = launched
        done.wait()
        return np.ones(shape, dtype=np.float32)

    @classmethod
    def like(cls, folder: Path) -> EmulatedGpu:
        """One with the output shape of the model in ``folder``."""
        manifest = Manifest.read(folder)
        if manifest.task == "embed":
            return cls(manifest.dimensions or 384, per_token=manifest.token_embeddings)
        if manifest.task == "qa":  # each token's start and end
            return cls(2, per_token=True)
        if manifest.task == "fill-mask":  # each token's vector before the decoder [V, E]
            with safe_open(folder / DECODER, "np") as decoder:
                return cls(decoder.get_slice("weight").get_shape()[1], per_token=True)
        return cls(len(manifest.labels), per_token=manifest.task == "ner")

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.collect(self.launch(inputs))


def emulate() -> None:
    """Every model of this process opened on the stand-in."""
    import distilserve.server.engine

    distilserve.server.engine.open_backend = lambda kind, folder, *args, **kwargs: EmulatedGpu.like(folder)


def app_from_environment():
    """A worker's app (``--workers N``), its models on the stand-in."""
    from distilserve.server import app

    emulate()
    return app.app_from_environment()


def main(argv: list[str]) -> int:
    """``serve [flags]`` as distilserve's, its workers and shared engine process on the
    stand-in too; or ``engine SOCKET``: that engine process."""
    from distilserve.server import cli
    from distilserve.server.cli import serve
    from distilserve.server.engine_process import process, supervisor

    emulate()
    if argv[:1] == ["engine"]:
        return process.main(argv[1:])
    supervisor.COMMAND = [sys.executable, "-m", "loadtests.emulated_gpu", "engine"]
    serve.WORKER_APP = "loadtests.emulated_gpu:app_from_environment"
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
