"""distilserve/server/routes/oip/errors.py's OipErrors: the protocol's routes' errors in
its shape, whole however they were sent; other routes' and answers that are not errors as they are."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from distilserve.server.routes.oip.errors import OipErrors

ERROR = json.dumps({"error": {"type": "invalid_request", "message": "bad"}}).encode()


def sent(path: str, status: int, chunks: list[bytes], headers=()) -> tuple[dict, bytes]:
    """(the response's start, its body) as OipErrors passes them on."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk,
                        "more_body": i < len(chunks) - 1})

    out = []

    async def send(message):
        out.append(message)

    asyncio.run(OipErrors(app)({"type": "http", "path": path}, None, send))
    return out[0], b"".join(m.get("body", b"") for m in out[1:])


@pytest.mark.parametrize("chunks, headers", [
    ([ERROR], ()), ([ERROR[:10], ERROR[10:]], ()),
    ([gzip.compress(ERROR)], [(b"content-encoding", b"gzip")])])
def test_a_protocol_routes_error_is_its_message(chunks, headers):
    start, body = sent("/v2/models/embed/infer", 422, chunks, headers)
    assert json.loads(body) == {"error": "bad"}
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()
    assert b"content-encoding" not in dict(start["headers"])


@pytest.mark.parametrize("path, status, body", [
    ("/v1/embed", 422, ERROR), ("/v2/embed", 422, ERROR),  # (Cohere's, not the protocol's)
    ("/v2/models/embed", 200, b'{"name": "embed"}')])
def test_other_answers_are_as_they_were(path, status, body):
    assert sent(path, status, [body])[1] == body
