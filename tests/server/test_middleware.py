"""distilserve/server/middleware.py's middlewares on their own (plain ASGI calls): no server, no
models."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import zlib
from types import SimpleNamespace

from starlette.exceptions import HTTPException

from distilserve.server import logs
from distilserve.server.metrics import Metrics
from distilserve.server.middleware import (
    ApiKey,
    BodyLimit,
    Decompress,
    Gzip,
    RequestId,
    RequestMetrics,
    takes_gzip,
)
from distilserve.server.routes.native import embed


async def echo(scope, receive, send):
    """An app that reads the whole body and answers 200 with its length."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def call(asgi, path="/v1/embed", headers=(), chunks=(b"{}",), **scope):
    """(status, body) of one request through the ASGI app ``asgi``."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    full = {"type": "http", "method": "POST", "path": path,
            "headers": [(k.encode(), v.encode()) for k, v in headers], **scope}
    asyncio.run(asgi(full, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


def test_body_limit_by_content_length_and_while_reading():
    app = BodyLimit(echo, limit=10)
    status, body = call(app, headers=[("content-length", "11")], chunks=(b"x" * 11,))
    assert status == 413 and "request body of 11 bytes is over the limit of 10" in \
        json.loads(body)["error"]["message"]
    assert call(app, headers=[("content-length", "10")], chunks=(b"x" * 10,)) == (200, b"10")
    try:  # chunked, no length: refused once it passes the limit, as it is read
        call(app, chunks=(b"x" * 6, b"x" * 6))
        raise AssertionError("a chunked body over the limit was read")
    except HTTPException as e:  # the route's read turns this into the 413
        assert e.status_code == 413


async def headers_and_body(scope, receive, send):
    """An app that answers with the headers it was given and the body it read."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps(
        {"headers": {k.decode(): v.decode() for k, v in scope["headers"]},
         "body": body.decode()}).encode()})


def test_a_compressed_body_is_decompressed_within_the_limit():
    app = BodyLimit(Decompress(headers_and_body, limit=1000), limit=1000)  # as create_app
    text = b'{"inputs": "' + b"a" * 500 + b'"}'
    for encoding, packed in (("gzip", gzip.compress(text)), ("deflate", zlib.compress(text)),
                             ("GZip", gzip.compress(text))):
        status, body = call(app, headers=[("content-encoding", encoding),
                                          ("content-length", str(len(packed)))],
                            chunks=(packed[:10], packed[10:]))
        assert status == 200, body
        seen = json.loads(body)
        assert seen["body"] == text.decode()  # the app reads it as if sent as it is
        assert seen["headers"] == {"content-length": str(len(text))}
    status, body = call(app, headers=[("content-encoding", "identity")], chunks=(text,))
    assert status == 200 and json.loads(body)["body"] == text.decode()

    def error(encoding, data):
        status, body = call(app, headers=[("content-encoding", encoding)], chunks=(data,))
        return status, json.loads(body)["error"]

    bomb = gzip.compress(b"0" * 100_000)  # 130 bytes that decompress to 100 kB
    status, why = error("gzip", bomb)
    assert (status, why["type"]) == (413, "payload_too_large")
    assert "decompresses to over the limit of 1000 bytes" in why["message"]
    assert error("gzip", gzip.compress(text)[:-12])[0] == 422  # cut short
    status, why = error("gzip", gzip.compress(text) + b"more")
    assert status == 422 and "data after its end" in why["message"]
    status, why = error("gzip", text)
    assert status == 422 and "the body is not gzip data" in why["message"]
    assert error("deflate", gzip.compress(text))[0] == 422  # deflate is zlib's format
    status, why = error("br", text)
    assert (status, why["type"]) == (415, "unsupported_media_type")
    assert "Content-Encoding 'br' is not served" in why["message"]
    # what is sent is held to the limit too, before anything is decompressed
    big = gzip.compress(os.urandom(2000))
    status, body = call(app, headers=[("content-encoding", "gzip")],
                        chunks=(big[:600], big[600:]))
    assert status == 413 and "over the limit of 1000" in json.loads(body)["error"]["message"]


def test_an_accept_encoding_takes_gzip_where_it_names_it_with_a_weight_above_0():
    for value in ("gzip", "GZip", "deflate, gzip;q=0.5", "x-gzip", "br;q=1.0, gzip ; q=1"):
        assert takes_gzip(value), value
    for value in ("", "identity", "deflate, br", "gzip;q=0", "gzip; q=0.000", "gzip;q=zero",
                  "*", "x-gzipped"):
        assert not takes_gzip(value), value


def test_answers_are_gzipped_only_for_a_client_that_takes_gzip():
    """Starlette's middleware alone gzipped for "gzip;q=0" (it looks for "gzip" in the
    header), which refuses gzip."""
    async def large(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"[0.125]" * 200})

    app = Gzip(large, minimum_size=500)
    for accept, gzipped in (("gzip", True), ("deflate, gzip;q=0.5", True),
                            ("gzip;q=0", False), ("identity", False)):
        status, body = call(app, headers=[("accept-encoding", accept)])
        assert status == 200 and body.startswith(b"\x1f\x8b") == gzipped, accept
        assert (gzip.decompress(body) if gzipped else body) == b"[0.125]" * 200


def test_api_key_guards_all_but_the_probes():
    app = ApiKey(echo, key="sekret")
    for path in ("/v1/embed", "/docs", "/openapi.json", "/metrics", "/static-offline-docs/x"):
        status, body = call(app, path=path)
        assert status == 401 and json.loads(body)["error"]["type"] == "unauthorized", path
    for path in ("/health", "/ready", "/ping", "/"):  # the probes: read, never POSTed
        assert call(app, path=path, method="GET")[0] == 200
        assert call(app, path=path, method="HEAD")[0] == 200
        assert call(app, path=path)[0] == 401, path  # POST / runs a model
    for method in ("TRACE", "PUT", "DELETE"):  # no route serves them: the router's 405
        assert call(app, path="/v1/embed", method=method)[0] == 200, method
    assert call(app, headers=[("authorization", "Bearer sekret")])[0] == 200
    assert call(app, headers=[("authorization", "bearer sekret")])[0] == 200  # scheme: any case
    for wrong in ("Bearer nope", "Basic sekret", "sekret", "Bearer "):
        assert call(app, headers=[("authorization", wrong)])[0] == 401, wrong
    assert call(ApiKey(echo, key=None), path="/v1/embed")[0] == 200  # no key: open


def test_a_request_id_is_the_clients_or_a_new_one_and_comes_back():
    async def answer_with_the_id(scope, receive, send):  # as a log record would see it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": logs.REQUEST_ID.get().encode()})

    def ids(header: str | None) -> tuple[str, str]:
        sent = []

        async def send(message):
            sent.append(message)

        headers = [] if header is None else [(b"x-request-id", header.encode())]
        asyncio.run(RequestId(answer_with_the_id)({"type": "http", "headers": headers},
                                                  None, send))
        returned = dict(sent[0]["headers"])[b"x-request-id"].decode()
        return returned, sent[1]["body"].decode()

    assert ids("ingress-1234") == ("ingress-1234", "ingress-1234")
    for unusable in (None, "", "x" * 201, "tab\there", "caf\u00e9"):
        made, seen = ids(unusable)
        assert made == seen and len(made) == 32 and made != unusable, unusable
        assert set(made) <= set("0123456789abcdef"), made  # hex, as a UUID's
    assert ids(None)[0] != ids(None)[0]  # a new one each time
    assert logs.REQUEST_ID.get() is None  # set in the request's task, not here


def test_request_metrics_count_by_route_and_status():
    metrics = Metrics()
    state = SimpleNamespace(service=SimpleNamespace(metrics=metrics))
    route = SimpleNamespace(path_format="/v1/embed")  # a route as Starlette names it
    app = RequestMetrics(BodyLimit(echo, limit=10), routes=embed.router.routes)
    for _ in range(2):  # the second time through the children looked up the first
        call(app, app=SimpleNamespace(state=state), route=route, chunks=(b"x",))
    # answered before routing: no route in the scope, counted under the path's route
    call(app, app=SimpleNamespace(state=state), headers=[("content-length", "99")],
         chunks=(b"x" * 99,))
    call(app, "/v1/nothing", app=SimpleNamespace(state=state), chunks=(b"x",))
    text = metrics.render().decode()
    assert 'distilserve_requests_total{route="/v1/embed",status="200"} 2.0' in text
    assert 'distilserve_requests_total{route="/v1/embed",status="413"} 1.0' in text
    assert 'distilserve_request_seconds_count{route="/v1/embed"} 3.0' in text
    assert 'distilserve_requests_total{route="unmatched",status="200"} 1.0' in text
