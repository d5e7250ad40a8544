"""The Open Inference Protocol's tensors (KServe's V2 protocol, Triton's HTTP/REST API), as
JSON and as Triton's binary tensor data extension. Pure functions, tested without a server;
distilserve/server/routes/oip/http_routes.py serves them.

A tensor is ``{"name", "datatype", "shape", "data"}``, its data in row-major order. With
the binary extension the body is the JSON header and then the tensors' bytes, one after
another; the header's length is the ``Inference-Header-Content-Length`` HTTP header, and a
tensor sent that way has ``"parameters": {"binary_data_size": n}`` and no ``data``.
tritonclient sends its inputs and asks for its outputs that way unless told not to.

    {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                 "parameters": {"binary_data_size": 20}}]}
    \\x05\\x00\\x00\\x00Hello\\x07\\x00\\x00\\x00a world   BYTES: each element's length in
                                                  4 bytes, little-endian, then its bytes
"""

from __future__ import annotations

import struct

import numpy as np

# the datatypes these models answer in: FP32 numbers, BYTES texts (each UTF-8)
FP32, BYTES = "FP32", "BYTES"
LENGTH = struct.Struct("<I")  # a BYTES element's length


class TensorError(ValueError):
    """A request's tensor that cannot be read as the model's input, in a client's words."""


def split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary data after it (none without the HTTP header)."""
    if header_length is None:
        return body, memoryview(b"")
    if not header_length.isdecimal() or int(header_length) > len(body):
        raise TensorError(f"Inference-Header-Content-Length {header_length!r} is not a "
                          f"length within the body's {len(body)} bytes")
    return body[:int(header_length)], memoryview(body)[int(header_length):]


def binary_parts(tensors: list[dict], data: memoryview) -> list[memoryview | None]:
    """Each tensor's binary data (None for one sent as JSON), in the order sent; all of
    the binary data is theirs."""
    parts, at = [], 0
    for tensor in tensors:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is None:
            parts.append(None)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 \
                or at + size > len(data):
            raise TensorError(f"input {tensor.get('name')!r}: binary_data_size {size!r} is "
                              f"not a size within the {len(data) - at} bytes left")
        parts.append(data[at:at + size])
        at += size
    if at != len(data):
        raise TensorError(f"{len(data) - at} bytes after the inputs' binary data")
    return parts


def _flat(data, rank: int) -> list:
    """Row-major data of a tensor of ``rank`` dimensions, nested as deep as that or flat,
    as a flat list (a list nested deeper stays an element)."""
    out = data if isinstance(data, list) else [data]
    for _ in range(rank - 1):
        if not any(isinstance(item, list) for item in out):
            break
        out = [x for item in out for x in (item if isinstance(item, list) else (item,))]
    return out


def texts(tensor: dict, binary: memoryview | None) -> list[str]:
    """A BYTES tensor of shape [N] or [N, 1] as N texts: its JSON data (strings) or its
    binary data (length-prefixed UTF-8)."""
    name, shape = tensor.get("name"), tensor.get("shape")
    if tensor.get("datatype") != BYTES:
        raise TensorError(f"input {name!r}: datatype {tensor.get('datatype')!r}; this model "
                          f"takes texts, datatype {BYTES} (each element UTF-8)")
    if not (isinstance(shape, list) and len(shape) in (1, 2) and shape[1:] in ([], [1])
            and all(isinstance(n, int) and not isinstance(n, bool) for n in shape)
            and shape[0] >= 1):
        raise TensorError(f"input {name!r}: shape {shape!r}; texts are [N] or [N, 1], N >= 1")
    if binary is not None:
        elements = _bytes_elements(name, binary)
    elif "data" in tensor:
        elements = _flat(tensor["data"], len(shape))
    else:
        raise TensorError(f"input {name!r} has neither data nor binary_data_size")
    if len(elements) != shape[0]:
        raise TensorError(f"input {name!r}: {len(elements)} elements where its shape "
                          f"{shape} says {shape[0]}")
    out = []
    for i, element in enumerate(elements):
        if isinstance(element, bytes | memoryview):
            try:
                element = bytes(element).decode("utf-8")
            except UnicodeDecodeError as e:
                raise TensorError(f"input {name!r}: element {i} is not UTF-8 (byte "
                                  f"{e.start})") from None
        if not isinstance(element, str):
            raise TensorError(f"input {name!r}: element {i} is {type(element).__name__}, "
                              "not a string")
        out.append(element)
    return out


def _bytes_elements(name, data: memoryview) -> list[memoryview]:
    elements, at = [], 0
    while at < len(data):
        if at + LENGTH.size > len(data):
            raise TensorError(f"input {name!r}: binary data ends inside an element's length")
        (size,) = LENGTH.unpack_from(data, at)
        at += LENGTH.size
        if at + size > len(data):
            raise TensorError(f"input {name!r}: element {len(elements)} of {size} bytes "
                              f"passes the end of its {len(data)} bytes")
        elements.append(data[at:at + size])
        at += size
    return elements


def _bytes_data(values: list[str]) -> bytes:
    encoded = [v.encode("utf-8") for v in values]
    return b"".join(LENGTH.pack(len(e)) + e for e in encoded)


def classes(scores: np.ndarray, labels: list[str], k: int) -> list[list[str]]:
    """Triton's classification extension: each row's ``k`` best classes, highest first, as
    "score:index:label" (the score as C's %f writes it), [N, k]."""
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[f"{row[i]:f}:{i}:{labels[i]}" for i in order] for row, order in zip(scores, best)]


def encoded(name: str, value: np.ndarray | list[str] | list[list[str]], binary: bool
            ) -> tuple[dict, bytes | None]:
    """An output tensor (name -> FP32 array, or texts: BYTES [N] or [N, k]): its JSON, with
    its data there, or (``binary``) its binary data's size there and the bytes apart."""
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value, dtype="<f4")
        tensor = {"name": name, "datatype": FP32, "shape": list(value.shape)}
        raw = value.tobytes() if binary else None
        flat = value.reshape(-1)
    else:
        rows = bool(value) and isinstance(value[0], list)  # [N, k]
        flat = _flat(value, 2)
        tensor = {"name": name, "datatype": BYTES,
                  "shape": [len(value)] + ([len(value[0])] if rows else [])}
        raw = _bytes_data(flat) if binary else None
    if raw is None:
        tensor["data"] = flat
    else:
        tensor["parameters"] = {"binary_data_size": len(raw)}
    return tensor, raw


def response(header: dict, outputs: dict[str, np.ndarray | list[str] | list[list[str]]],
             binary: set[str]) -> tuple[dict, bytes]:
    """The response's JSON ``header`` with its ``outputs`` (encoded), those named in
    ``binary`` as binary data after the header (the bytes returned, in the outputs'
    order)."""
    tensors, data = [], []
    for name, value in outputs.items():
        tensor, raw = encoded(name, value, name in binary)
        tensors.append(tensor)
        if raw is not None:
            data.append(raw)
    return {**header, "outputs": tensors}, b"".join(data)
