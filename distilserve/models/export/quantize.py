"""int8: ONNX Runtime's dynamic quantisation, keeping the FFN's down-projections in fp32
(the results pages have the measured trade-off)."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from distilserve.models.runtime.tracing import leaving_out


def _nodes(graph: onnx.GraphProto):
    """Every node, including those inside Loop bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)


def _read_weights_directly(graph: onnx.GraphProto) -> None:
    """The exporter stores a weight that several nodes use once and hands it to all but
    the first through Identity nodes: in an unrolled recursive model (MiniALBERT,
    F-ALBERT), every reuse of the shared layer after the first. ONNX Runtime's quantiser
    quantises only MatMuls that read a weight (an initializer) itself, so those reuses
    stayed fp32; here they read it directly (it is still stored once, and quantised once)."""
    weights = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {n.output[0]: n.input[0] for n in graph.node
             if n.op_type == "Identity" and n.input[0] in weights and n.output[0] not in outputs}
    for node in _nodes(graph):
        node.input[:] = [alias.get(name, name) for name in node.input]
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    del graph.node[:]
    graph.node.extend(kept)


def quantize_int8(src: Path, dst: Path) -> list[str]:
    """ONNX Runtime dynamic int8, per channel (per-tensor, the default, hurt embeddings).

    MatMuls whose weight narrows the width (K > N: the FFN's down-projection, which reads
    the GELU's long-tailed output) stay fp32: quantising them too costs more agreement
    with fp32 than it gains speed (figures on the results pages). Returns their
    names."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    _read_weights_directly(model.graph)
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    keep = [n.name for n in _nodes(model.graph) if n.op_type == "MatMul" and n.input[1] in dims
            and len(dims[n.input[1]]) == 2 and dims[n.input[1]][0] > dims[n.input[1]][1]]
    # onnxruntime.quantization logs to the root logger
    with leaving_out(logging.getLogger(), _no_pre_processing_advice):
        quantize_dynamic(model, str(dst), per_channel=True, weight_type=QuantType.QInt8,
                         nodes_to_exclude=keep, extra_options={"EnableSubgraph": True})
    return keep


def _no_pre_processing_advice(record: logging.LogRecord) -> bool:
    """ONNX Runtime advises its pre-processing (symbolic shape inference, graph
    optimisation) before any quantisation; that inference fails on a kept loop
    ("Incomplete symbolic shape inference"), and the exported graphs quantise as they
    are. The advice is left out; any other message is not."""
    return "pre-processing before quantization" not in record.getMessage()
