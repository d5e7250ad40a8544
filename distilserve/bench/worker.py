"""Measures one prepared artifact in a process of its own, so that its peak memory is its
own: ``python -m distilserve.bench.worker SPEC_JSON`` prints one JSON line.

It imports only what its backend needs (onnxruntime alone for ONNX), then warms up and
times repeated runs of random token ids.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from distilserve.bench.memory import peak_rss_mb


def measure(spec: dict) -> dict:
    from distilserve.models.runtime import open_backend

    started = time.perf_counter()
    device, dtype = spec.get("device", "cpu"), spec.get("dtype", "fp32")
    backend = open_backend(spec["backend"], spec["folder"], spec["artifact"], spec["threads"],
                           spec.get("num_iterations"), device, dtype,
                           spec.get("dtypes", ("fp32",)))
    load_s = time.perf_counter() - started
    rng = np.random.default_rng(0)

    depth = spec.get("depth")  # a recursive model's iterations (None: its own)
    if depth is not None and backend.depth is None:
        raise SystemExit(f"{backend.name}: this artifact's depth is fixed")

    def batch(size: int, length: int) -> dict[str, np.ndarray]:
        ids = rng.integers(1000, 30000, (size, length), dtype=np.int64)
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                  "token_type_ids": np.zeros_like(ids)}
        if depth is not None:
            arrays["num_iterations"] = np.array(depth, dtype=np.int64)
        return arrays

    size, length = spec["batch_size"], spec["length"]
    if spec.get("cuda_graphs") and not backend.use_graphs([(size, length), (1, length)]):
        raise SystemExit(f"CUDA graphs need the torch or TorchScript backend on a GPU, not "
                         f"{backend.name} on {backend.device}")
    batches = [batch(size, length) for _ in range(spec["batches"])]
    backend.run(batches[0])  # warm-up, at the timed shape (TorchScript specialises to it;
    # with cuda_graphs, its graph is captured)
    rates = []
    for _ in range(spec["repeats"]):
        t = time.perf_counter()
        for b in batches:
            backend.run(b)
        rates.append(size * len(batches) / (time.perf_counter() - t))
    one = batch(1, length)
    backend.run(one)
    latencies = []
    for _ in range(spec["latency_runs"]):
        t = time.perf_counter()
        backend.run(one)
        latencies.append((time.perf_counter() - t) * 1000)
    gpu = {}
    if backend.device.startswith("cuda"):  # every run ends in a copy to the host: synchronised
        import torch

        gpu = {"peak_gpu_mb": torch.cuda.max_memory_allocated() / 2 ** 20,
               "gpu": torch.cuda.get_device_name()}
    return {
        **gpu,
        "sentences_per_s": statistics.median(rates),
        "sentences_per_s_min": min(rates), "sentences_per_s_max": max(rates),
        "latency_ms_p50": float(np.percentile(latencies, 50)),
        "latency_ms_p95": float(np.percentile(latencies, 95)),
        "peak_rss_mb": peak_rss_mb(),
        "load_s": load_s,
    }


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec.get("mode") == "training":
        from distilserve.bench import training

        print(json.dumps(training.measure(spec)))
    else:
        print(json.dumps(measure(spec)))
