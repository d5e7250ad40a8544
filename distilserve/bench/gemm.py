"""The machine's matrix-multiply rates, per library and dtype: the reference each
measured row's efficiency is scored against."""

from __future__ import annotations

import time
from collections.abc import Callable


def fastest(fn: Callable[[], object], runs: int,
            sync: Callable[[], object] = lambda: None) -> float:
    """The shortest of ``runs`` timed calls of ``fn``, after one untimed warm-up; ``sync``
    ends each call (``torch.cuda.synchronize``: a GPU's work is asynchronous)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_rates(threads: int, runs: int = 5) -> dict[str, float]:
    """The machine's matmul rates in FLOP/s (an int8 multiply-add counted as two), per
    library, dtype and shape: fp32 large square products and one shaped like a 768-wide
    encoder's FFN at batch 256 x 64 (torch's and ONNX Runtime's), the FFN in bf16 (torch,
    on the CPU's bf16 matrix units where it has them) and in int8 (ONNX Runtime's
    MatMulInteger, uint8 x int8, as its dynamic quantisation runs). The best of each dtype
    is the reference for the efficiency of the rows computed in it (``reference_rates``)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper

    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads

    def onnx_rate(node: str, a: np.ndarray, b: np.ndarray, a_type, out_type) -> float:
        (m, k), n = a.shape, b.shape[1]
        graph = helper.make_graph(
            [helper.make_node(node, ["a", "b"], ["c"])], "gemm",
            [helper.make_tensor_value_info("a", a_type, [m, k])],
            [helper.make_tensor_value_info("c", out_type, [m, n])],
            initializer=[onnx.numpy_helper.from_array(b, "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  ir_version=8)
        session = ort.InferenceSession(model.SerializeToString(), options)
        return 2 * m * k * n / fastest(lambda: session.run(None, {"a": a}), runs)

    ffn, ffn_name = (16384, 768, 3072), "ffn 16384x768x3072"
    shapes = {"square 2048": (2048, 2048, 2048), ffn_name: ffn}
    rates = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates[f"torch {name}"] = 2 * m * k * n / fastest(lambda a=a, b=b: a @ b, runs)
        rates[f"onnxruntime {name}"] = onnx_rate(
            "MatMul", np.ascontiguousarray(a.numpy()), b.numpy(), TensorProto.FLOAT,
            TensorProto.FLOAT)
    m, k, n = ffn
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    rates[f"torch bf16 {ffn_name}"] = 2 * m * k * n / fastest(lambda: a @ b, runs)
    g = np.random.default_rng(0)
    rates[f"onnxruntime int8 {ffn_name}"] = onnx_rate(
        "MatMulInteger", g.integers(0, 256, (m, k), dtype=np.uint8),
        g.integers(-128, 128, (k, n), dtype=np.int8), TensorProto.UINT8, TensorProto.INT32)
    return rates


def rate_dtype(name: str) -> str:
    """The dtype of one of ``gemm_rates``' (or ``gpu_gemm_rates``') rates, by its name."""
    return next((d for d in ("int8", "bf16", "fp16") if f" {d} " in f" {name} "), "fp32")


def reference_rates(rates: dict[str, float]) -> dict[str, float]:
    """The best rate of each dtype, in FLOP/s."""
    best: dict[str, float] = {}
    for name, rate in rates.items():
        best[rate_dtype(name)] = max(rate, best.get(rate_dtype(name), 0.0))
    return best


def compute_dtype(backend: str, dtype: str) -> str:
    """What a row computes in: an int8 artifact in int8, ONNX Runtime's in fp32 (it runs
    the graph as exported), the torch backends in the run's dtype."""
    return "int8" if backend == "onnx-int8" else "fp32" if backend == "onnx" else dtype


def gpu_gemm_rates(device: str, dtype: str, runs: int = 10) -> dict[str, float]:
    """The GPU's matmul rate in FLOP/s at the compute dtype (square 8192 and the FFN shape)."""
    import torch

    from distilserve.models.runtime.torch_device import TORCH_DTYPES

    rates = {}
    for name, (m, k, n) in {"square 8192": (8192, 8192, 8192),
                            "ffn 16384x768x3072": (16384, 768, 3072)}.items():
        a = torch.randn(m, k, device=device, dtype=TORCH_DTYPES[dtype])
        b = torch.randn(k, n, device=device, dtype=TORCH_DTYPES[dtype])
        rates[f"torch {dtype} {name}"] = 2 * m * k * n / fastest(
            lambda a=a, b=b: a @ b, runs, lambda: torch.cuda.synchronize(device))
    return rates
