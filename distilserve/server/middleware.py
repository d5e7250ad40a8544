"""The service's own ASGI middlewares, outermost first as distilserve/server/app.py stacks them (with
CORS between the second and the third): each request's id (RequestId), its metrics and
span (RequestMetrics), the body limit (BodyLimit), the API key (ApiKey), compressed
bodies (Decompress) and compressed answers (Gzip)."""

from __future__ import annotations

import hmac
import time
import zlib

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware
from starlette.routing import Match

from distilserve.server import errors, logs
from distilserve.server.core.inference import client_closed
from distilserve.server.core.refusals import Refusal
from distilserve.server.metrics import STARTED, Metrics
from distilserve.server.routes.fast_path import replay
from distilserve.server.tracing import SPAN, Tracing

# a request body's Content-Encoding, decompressed: zlib's wbits for its format (HTTP's
# deflate is zlib's format)
ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """A request body sent with Content-Encoding ``encoding`` (one of ENCODINGS), as sent:
    at most ``limit`` bytes of it decompressed (a 413 past them, never more in memory), a
    422 for what is not one whole stream of that encoding."""
    inflate = zlib.decompressobj(ENCODINGS[encoding])
    try:
        body = inflate.decompress(data, limit + 1)
    except zlib.error as e:
        raise errors.ApiError(422, "invalid_request", f"the body is not {encoding} data "
                              f"(Content-Encoding: {encoding}): {e}") from None
    if len(body) > limit:
        raise errors.ApiError(413, "payload_too_large", "the request body decompresses to "
                              f"over the limit of {limit} bytes (DISTILSERVE_MAX_BODY_BYTES)")
    if not inflate.eof or inflate.unused_data:
        raise errors.ApiError(422, "invalid_request", f"the body is not one whole {encoding} "
                              "stream: " + ("data after its end" if inflate.eof else
                                            "it ends before the stream does"))
    return body


def takes_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header's value takes gzip: it names gzip (or x-gzip)
    with a weight above 0 (RFC 9110, 12.5.3). "gzip;q=0" refuses it, and an unreadable
    weight takes it as refused: an answer sent as it is is always acceptable."""
    for element in accept_encoding.split(","):
        coding, *parameters = element.split(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        weight = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if weight > 0:
            return True
    return False


class Gzip(GZipMiddleware):
    """Starlette's GZipMiddleware for a client whose Accept-Encoding takes gzip
    (takes_gzip); Starlette's alone looks for "gzip" in it, and gzipped answers to
    "gzip;q=0", which says the opposite."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not takes_gzip(", ".join(
                value.decode("latin-1") for name, value in scope["headers"]
                if name == b"accept-encoding")):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class BodyLimit:
    """Refuses request bodies over the limit with 413: at once when Content-Length says
    so, and while reading a body sent without one (chunked) once it passes the limit."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _message(self, size: str) -> str:
        return (f"request body of {size} bytes is over the limit of {self.limit} "
                "(DISTILSERVE_MAX_BODY_BYTES)")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length", "")
        if length.isdecimal() and int(length) > self.limit:
            response = JSONResponse(errors.body("payload_too_large",
                                                self._message(str(int(length)))), 413)
            return await response(scope, receive, send)
        received = 0

        async def receive_limited():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # the route's body read fails with this 413
                raise HTTPException(413, self._message(f"over {self.limit}"))
            return message

        return await self.app(scope, receive_limited, send)


class Decompress:
    """A body sent compressed (Content-Encoding gzip or deflate, as tritonclient's
    request_compression_algorithm sends it) is read whole and decompressed, within the
    body limit too, and the app given it as if sent so; another encoding is a 415. Inside
    the API key (nothing is decompressed for a client without it) and the body limit (what
    is sent is held to it as it is read)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        encoding = "identity"
        if scope["type"] == "http":
            encoding = Headers(scope=scope).get("content-encoding", encoding).strip().lower()
        if encoding == "identity":
            return await self.app(scope, receive, send)
        try:
            if encoding not in ENCODINGS:
                raise errors.ApiError(415, "unsupported_media_type", f"Content-Encoding "
                                      f"{encoding!r} is not served: send the body as it "
                                      "is, or with gzip or deflate")
            sent = []
            while (message := await receive())["type"] != "http.disconnect":
                sent.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            else:  # gone before its body arrived
                raise client_closed()
            body = decompress(b"".join(sent), encoding, self.limit)
        except HTTPException as e:  # over the limit as it was read (BodyLimit)
            return await errors.http_error(e)(scope, receive, send)
        except Refusal as e:
            return await errors.api_error(e)(scope, receive, send)
        kept = [(k, v) for k, v in scope["headers"]
                if k not in (b"content-encoding", b"content-length")]
        scope = {**scope, "headers": [*kept, (b"content-length", str(len(body)).encode())]}
        return await self.app(scope, replay(body, receive), send)


class ApiKey:
    """401 unless ``Authorization: Bearer KEY`` matches DISTILSERVE_API_KEY (when one is
    set), on every request of a method the service serves (GET, HEAD, POST) but a GET (or
    HEAD) of a probe: POST / runs a model, and the docs and the OpenAPI document need the
    key too. Other methods (TRACE, PUT, ...) reach no route: the router's 405 answers
    them, keyed or not."""

    PUBLIC = frozenset({"/health", "/ready", "/ping", "/", "/v2/health/live",
                        "/v2/health/ready"})
    SERVED = frozenset({"GET", "HEAD", "POST"})

    @classmethod
    def public(cls, method: str, path: str) -> bool:
        return method not in cls.SERVED or path in cls.PUBLIC and method in ("GET", "HEAD")

    @staticmethod
    def accepts(key: bytes, authorization: str) -> bool:
        """Whether an Authorization header (or gRPC's authorization metadata) is ``Bearer
        KEY``."""
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1", "replace"), key)

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key and key.encode()

    async def __call__(self, scope, receive, send):
        if (self.key is None or scope["type"] != "http"
                or self.public(scope["method"], scope["path"])):
            return await self.app(scope, receive, send)
        if not self.accepts(self.key, Headers(scope=scope).get("authorization", "")):
            response = JSONResponse(
                errors.body("unauthorized", "missing or wrong API key: send "
                            "'Authorization: Bearer KEY'"), 401,
                headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class RequestId:
    """Each request's id: the client's X-Request-Id (printable ASCII, at most 200
    characters; a proxy's, e.g. ingress-nginx's), else a new one. Sent back as
    X-Request-Id, and carried by the log records written while the request is answered
    (distilserve/server/logs.py)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = logs.request_id(Headers(scope=scope).get("x-request-id", ""))
        logs.REQUEST_ID.set(request_id)  # in this request's own task
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


class RequestMetrics:
    """Counts requests by route and status and times them, for /metrics; with ``tracing``
    (DISTILSERVE_OTLP_ENDPOINT), a span each too (distilserve/server/tracing.py)."""

    def __init__(self, app, routes: list, tracing: Tracing | None = None):
        self.app, self.routes, self.tracing = app, routes, tracing

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]
        scope[STARTED] = started  # for the routes' x-total-time
        span = scope[SPAN] = self.tracing.start(scope) if self.tracing else None

        async def send_recording(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_recording)
        finally:
            metrics: Metrics = scope["app"].state.service.metrics
            route = self.route(scope)
            metrics.observe_request(route, status[0], time.perf_counter() - started)
            if span is not None:
                self.tracing.end(span, scope["method"], route, status[0])

    def route(self, scope) -> str:
        """The route that answered, else the one the path names (a 401 or a 413 is
        answered before routing), else "unmatched"."""
        route = scope.get("route") or next(
            (r for r in self.routes if r.matches(scope)[0] is not Match.NONE), None)
        return getattr(route, "path_format", "unmatched")
