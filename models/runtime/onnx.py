"""ONNX Runtime backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from models.runtime.base import Backend


class OnnxBackend(Backend):
    name = "onnx"

    def __init__(self, path: Path, threads: int = 0, num_iterations: int | None = None):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads  # 0: onnxruntime's choice (all cores)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        # idle pool threads sleep instead of spinning: on a few cores a spinning pool takes
        # the CPU that HTTP handling and tokenisation need between batches
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.num_iterations = num_iterations

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {k: inputs[k] for k in self.input_names if k in inputs}
        if "num_iterations" in self.input_names:  # the loop kept: depth chosen at run time
            feed["num_iterations"] = np.array(self.num_iterations, dtype=np.int64)
        return self.session.run(None, feed)[0]
