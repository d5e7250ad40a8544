"""int8: ONNX Runtime's dynamic quantisation, keeping the FFN's down-projections in fp32
(the README has the measured trade-off)."""

from __future__ import annotations

from pathlib import Path

import onnx


def _nodes(graph: onnx.GraphProto):
    """Every node, including those inside Loop bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)


def quantize_int8(src: Path, dst: Path) -> list[str]:
    """ONNX Runtime dynamic int8, per channel (per-tensor, the default, hurt embeddings).

    MatMuls whose weight narrows the width (K > N: the FFN's down-projection, which reads
    the GELU's long-tailed output) stay fp32: quantising them too costs more agreement
    with fp32 than it gains speed (figures in the README's Export section). Returns their
    names."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    keep = [n.name for n in _nodes(graph) if n.op_type == "MatMul" and n.input[1] in dims
            and len(dims[n.input[1]]) == 2 and dims[n.input[1]][0] > dims[n.input[1]][1]]
    quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                     nodes_to_exclude=keep, extra_options={"EnableSubgraph": True})
    return keep
