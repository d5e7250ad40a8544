"""The frames between the front ends and the engine process, over a Unix socket: each
frame the messages of one turn of the sender's event loop, a header (JSON) and the numpy
arrays it describes, prefixed by the two lengths. A request carries token ids, a reply
each input's outputs (an array, or a pair of them: an output and its postprocessed copy)
or the refusal of the whole request; a message with no id is the engine's news (its models
changed)."""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import orjson

from distilserve.server.core.batching import (
    InputTooLong,
    NotFinite,
    OverQueue,
    QueueFull,
)
from distilserve.server.core.refusals import Refusal
from distilserve.server.core.runner import ModelUnavailable

LENGTHS = struct.Struct("<II")  # the header's bytes, the arrays' bytes
# the failures a reply names, each rebuilt as the exception the engine's batcher raised
FAILURES = {"queue_full": QueueFull, "over_queue": OverQueue,
            "unavailable": ModelUnavailable}
INPUT_FAILURES = {"input_too_long": InputTooLong, "not_finite": NotFinite}


def frame(parts: list[tuple[dict, list[np.ndarray]]]) -> bytes:
    """One frame of several messages, each a header and its arrays: the headers (each with
    how many arrays are its), the arrays' dtypes and shapes, then the arrays' bytes."""
    arrays = [np.ascontiguousarray(a) for _, part in parts for a in part]
    head = orjson.dumps({"parts": [{**header, "n": len(part)} for header, part in parts],
                         "arrays": [[a.dtype.str, a.shape] for a in arrays]})
    body = b"".join(a.data for a in arrays)
    return LENGTHS.pack(len(head), len(body)) + head + body


async def read(reader: asyncio.StreamReader) -> list[tuple[dict, list[np.ndarray]]]:
    """The next frame's messages: each header and its arrays (writable copies);
    IncompleteReadError at the end of the stream."""
    head, size = LENGTHS.unpack(await reader.readexactly(LENGTHS.size))
    return unpack(head, await reader.readexactly(head + size))


def unpack(head: int, data: bytes | memoryview) -> list[tuple[dict, list[np.ndarray]]]:
    """A frame's messages from its bytes after the two lengths (``head``: the first,
    its header's bytes)."""
    header = orjson.loads(memoryview(data)[:head])
    body, arrays, at = bytearray(memoryview(data)[head:]), [], 0
    for dtype, shape in header["arrays"]:
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        arrays.append(np.frombuffer(body, dtype, count, at).reshape(shape))
        at += count * dtype.itemsize
    messages, taken = [], 0
    for part in header["parts"]:
        n = part.pop("n")
        messages.append((part, arrays[taken:taken + n]))
        taken += n
    return messages


class Outbox:
    """Messages to a stream, sent together once per turn of the event loop: one frame and
    one system call for all the requests (or replies) of a turn."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer, self.parts = writer, []

    def send(self, header: dict, arrays: list = ()) -> None:
        if not self.parts:
            asyncio.get_running_loop().call_soon(self._flush)
        self.parts.append((header, arrays))

    def _flush(self) -> None:
        parts, self.parts = self.parts, []
        if not self.writer.is_closing():
            self.writer.write(frame(parts))


def token_ids(encodings: list) -> list[np.ndarray]:
    """Encodings (``.ids``, ``.type_ids``) as two int32 arrays, end to end."""
    if len(encodings) == 1:
        return [np.asarray(encodings[0].ids, np.int32),
                np.asarray(encodings[0].type_ids, np.int32)]
    return [np.concatenate([np.asarray(e.ids, np.int32) for e in encodings]),
            np.concatenate([np.asarray(e.type_ids, np.int32) for e in encodings])]


def split(ids: np.ndarray, types: np.ndarray, lengths: list[int]) -> list[tuple]:
    """``token_ids``' arrays back as each input's (ids, type ids)."""
    if len(lengths) == 1:
        return [(ids, types)]
    out, start = [], 0
    for n in lengths:
        out.append((ids[start:start + n], types[start:start + n]))
        start += n
    return out


def outputs(raw: list) -> tuple[list[np.ndarray], bool]:
    """Each input's output (or pair of them) as arrays end to end, and whether pairs."""
    pairs = bool(raw) and isinstance(raw[0], tuple)
    return ([a for pair in raw for a in pair] if pairs else list(raw)), pairs


def unpack_outputs(arrays: list[np.ndarray], pairs: bool) -> list:
    return list(zip(arrays[::2], arrays[1::2])) if pairs else arrays


def failure(error: Exception) -> dict:
    """A reply's header for ``error``: its kind, message and facts."""
    for kind, cls in INPUT_FAILURES.items():
        if isinstance(error, cls):
            return {"failed": kind, "index": error.index, "facts": list(error.facts)}
    for kind, cls in FAILURES.items():
        if isinstance(error, cls):
            return {"failed": kind, "message": str(error)}
    if isinstance(error, Refusal):  # (a load or unload by request)
        return {"failed": "refusal", "reason": error.reason, "message": error.message,
                "retry_after": error.retry_after}
    return {"failed": "error", "message": f"{type(error).__name__}: {error}"}


def raise_failure(header: dict) -> None:
    """Raises the exception a reply's header names, if any."""
    kind = header.get("failed")
    if kind is None:
        return
    if kind in INPUT_FAILURES:
        raise INPUT_FAILURES[kind](header["index"], *header["facts"])
    if kind in FAILURES:
        raise FAILURES[kind](header["message"])
    if kind == "refusal":
        raise Refusal(header["reason"], header["message"], header["retry_after"])
    raise EngineError(header["message"])


class EngineError(Exception):
    """A failure in the engine process other than a refusal: the batch's model raised."""
