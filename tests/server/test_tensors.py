"""The Open Inference Protocol's tensors as JSON and as Triton's binary tensor data, read
and written without a server; the bytes as tritonclient writes and reads them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from distilserve.server.routes.oip import tensors

TEXTS = ["The cat sat.", "Ünïcödé ✓", ""]


def _binary(texts: list[str]) -> bytes:
    return serialize_byte_tensor(np.array(texts, dtype=object)).item()  # as tritonclient


def _deep(depth: int) -> list:
    data = "a"
    for _ in range(depth):
        data = [data]
    return data


def test_texts_from_json_data_flat_or_nested():
    assert tensors.texts({"name": "text", "datatype": "BYTES", "shape": [3],
                          "data": TEXTS}, None) == TEXTS
    assert tensors.texts({"name": "t", "datatype": "BYTES", "shape": [3, 1],
                          "data": [[t] for t in TEXTS]}, None) == TEXTS


def test_texts_from_tritonclients_binary_data():
    body = json.dumps({"inputs": [{"name": "a", "parameters": {"binary_data_size": 4}},
                                  {"name": "b", "data": ["x"]}]}).encode()
    data = _binary(TEXTS)
    header, rest = tensors.split(body + data, str(len(body)))
    assert header == body and bytes(rest) == data
    sent = json.loads(header)["inputs"]
    sent[0]["parameters"]["binary_data_size"] = len(data)
    first, second = tensors.binary_parts(sent, rest)
    assert second is None  # sent as JSON
    tensor = {"name": "a", "datatype": "BYTES", "shape": [3]}
    assert tensors.texts(tensor, first) == TEXTS


def test_without_the_header_length_the_whole_body_is_json():
    header, rest = tensors.split(b'{"inputs": []}', None)
    assert header == b'{"inputs": []}' and len(rest) == 0


@pytest.mark.parametrize("tensor, binary, message", [
    ({"datatype": "FP32", "shape": [1], "data": [1.0]}, None, "datatype 'FP32'"),
    ({"datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}, None, "shape [1, 2]"),
    ({"datatype": "BYTES", "shape": [0], "data": []}, None, "N >= 1"),
    ({"datatype": "BYTES", "shape": [True], "data": ["a"]}, None, "shape [True]"),
    ({"datatype": "BYTES", "shape": [2], "data": ["a"]}, None, "1 elements"),
    ({"datatype": "BYTES", "shape": [1], "data": [5]}, None, "element 0 is int"),
    ({"datatype": "BYTES", "shape": [1]}, None, "neither data nor binary_data_size"),
    ({"datatype": "BYTES", "shape": [1]}, b"\x09\x00\x00\x00hi", "passes the end"),
    ({"datatype": "BYTES", "shape": [1]}, b"\x02\x00", "inside an element's length"),
    ({"datatype": "BYTES", "shape": [1]}, b"\x02\x00\x00\x00\xff\xfe", "not UTF-8"),
    ({"datatype": "BYTES", "shape": [2]}, _binary(["a"]), "1 elements"),
    # nested deeper than its shape: an element that is a list, however deep (no recursion)
    ({"datatype": "BYTES", "shape": [1, 1], "data": [[["a"]]]}, None, "element 0 is list"),
    ({"datatype": "BYTES", "shape": [1], "data": _deep(5000)}, None, "element 0 is list"),
])
def test_what_is_not_texts_is_refused_saying_why(tensor, binary, message):
    with pytest.raises(tensors.TensorError, match=re.escape(message)):
        tensors.texts({"name": "text", **tensor},
                      None if binary is None else memoryview(binary))


@pytest.mark.parametrize("length, message", [("9", "not a length within"),
                                              ("x", "not a length within")])
def test_a_header_length_past_the_body_is_refused(length, message):
    with pytest.raises(tensors.TensorError, match=message):
        tensors.split(b"{}", length)


@pytest.mark.parametrize("size, message", [(7, "not a size within"), (-1, "not a size"),
                                           ("3", "not a size"), (True, "not a size"),
                                           (2, "1 bytes after")])
def test_binary_sizes_must_account_for_the_binary_data(size, message):
    with pytest.raises(tensors.TensorError, match=message):
        tensors.binary_parts([{"name": "a", "parameters": {"binary_data_size": size}}],
                             memoryview(b"abc"))


def test_outputs_as_json_and_as_binary_data_read_back_as_sent():
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    outputs = {"embedding": vectors, "label": ["a", "Ünïcödé"]}
    as_json, data = tensors.response({"model_name": "m"}, outputs, set())
    assert data == b""
    embedding, label = as_json["outputs"]
    assert (embedding["datatype"], embedding["shape"]) == ("FP32", [2, 3])
    np.testing.assert_array_equal(np.asarray(embedding["data"]), vectors.reshape(-1))
    assert (label["datatype"], label["shape"], label["data"]) == ("BYTES", [2], outputs["label"])

    header, data = tensors.response({"model_name": "m"}, outputs, {"embedding", "label"})
    assert header["model_name"] == "m"
    sizes = [t["parameters"]["binary_data_size"] for t in header["outputs"]]
    assert all("data" not in t for t in header["outputs"]) and sum(sizes) == len(data)
    np.testing.assert_array_equal(
        np.frombuffer(data[:sizes[0]], "<f4").reshape(2, 3), vectors)
    assert [b.decode() for b in deserialize_bytes_tensor(data[sizes[0]:])] == outputs["label"]


def test_only_the_outputs_named_binary_are_binary():
    header, data = tensors.response({}, {"a": np.ones((1, 2), np.float32), "b": ["x"]}, {"b"})
    a, b = header["outputs"]
    assert "data" in a and b["parameters"]["binary_data_size"] == len(data) == 5


def test_classes_are_tritons_classification_strings_best_first():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    assert tensors.classes(scores, ["a", "b", "c"], 2) == [
        ["0.700000:1:b", "0.200000:2:c"], ["0.500000:0:a", "0.250000:1:b"]]  # ties: in order
    header, data = tensors.response({}, {"scores": tensors.classes(scores, list("abc"), 2)},
                                    {"scores"})
    (tensor,) = header["outputs"]
    assert (tensor["datatype"], tensor["shape"]) == ("BYTES", [2, 2])
    assert deserialize_bytes_tensor(data)[2] == b"0.500000:0:a"  # row-major
