"""ONNX Runtime backend: the CPU, or a GPU through the CUDA execution provider when
``onnxruntime-gpu`` is installed (the ``gpu`` extra). ONNX artifacts compute in fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from distilserve.models.runtime.base import Backend, BackendError, choose_dtype

FP32 = "ONNX Runtime runs the graph as exported, in fp32"


def has_cuda_provider() -> bool:
    """Whether this onnxruntime runs on a GPU (onnxruntime-gpu)."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


class OnnxBackend(Backend):
    name = "onnx"

    def __init__(self, path: Path, threads: int = 0, num_iterations: int | None = None,
                 device: str = "cpu", dtype: str = "fp32"):
        has_cuda = has_cuda_provider()
        if device == "auto":
            device = "cuda" if has_cuda else "cpu"
        if device.startswith("cuda") and not has_cuda:
            raise BackendError(f"device {device} asked for an ONNX model, but this "
                               "onnxruntime has no CUDA execution provider: install "
                               "onnxruntime-gpu (pip install 'distilserve[gpu]'), or export "
                               "with --format torch")
        self.device = device
        try:
            self.dtype, _ = choose_dtype(dtype, "cpu" if device == "cpu" else "cuda", ("fp32",))
        except BackendError as e:  # (the embedded default's models, with DISTILSERVE_DTYPE)
            raise BackendError(f"{e}: {FP32}; export with --format torchscript or torch "
                               "to run in fp16 or bf16, as its family allows") from None
        self.dtype_reason = FP32
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads  # 0: onnxruntime's choice (all cores)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        # idle pool threads sleep instead of spinning: a spinning pool takes the cores that
        # the other models' runs, HTTP handling and tokenisation need (loadtests/RESULTS.md)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": index}))
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        if "num_iterations" in self.input_names:  # the loop kept: depth chosen at run time
            if num_iterations is None:
                raise BackendError(f"{path.name} keeps its loop: its trained depth "
                                   "(the manifest's num_iterations) is needed")
            self.depth = num_iterations
            self.trained = np.array(num_iterations, dtype=np.int64)

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {k: inputs[k] for k in self.input_names if k in inputs}
        if self.depth is not None and "num_iterations" not in feed:
            feed["num_iterations"] = self.trained
        return self.session.run(None, feed)[0]
