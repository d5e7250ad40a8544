"""The Open Inference Protocol's errors: the service's errors on the protocol's routes
(made by the routes, the API key or the body limit alike) in the protocol's shape,
``{"error": "message"}``."""

from __future__ import annotations

import gzip

import orjson


class OipErrors:
    """ASGI middleware: the errors of the protocol's routes (``protocols``), wherever they
    were made (the routes, the API key, the body limit), as the protocol writes them:
    ``{"error": "message"}`` where the service writes ``{"error": {"type", "message"}}``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not protocols(scope["path"]):
            return await self.app(scope, receive, send)
        held: dict | None = None  # an error's start, sent with its reshaped body
        chunks: list[bytes] = []

        async def reshaping(message):
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if held is None:
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            headers = [(k, v) for k, v in held["headers"]
                       if k.lower() not in (b"content-length", b"content-encoding")]
            encoded = dict(held["headers"]).get(b"content-encoding") == b"gzip"
            whole = b"".join(chunks)
            body = reshaped(gzip.decompress(whole) if encoded else whole)
            await send({**held, "headers": [*headers, (b"content-length",
                                                       str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaping)


def protocols(path: str) -> bool:
    """Whether ``path`` is one of the protocol's (/v2, its health, models and repository)."""
    return path == "/v2" or path.startswith(("/v2/health/", "/v2/models", "/v2/repository/"))


# the protocol's error, as the OpenAPI document says it (distilserve/server/app.py: document)
ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "string"}},
                "required": ["error"], "title": "OipError"}


def reshaped(body: bytes) -> bytes:
    """A service error's body in the protocol's shape (another body as it is)."""
    try:
        sent = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    error = sent.get("error") if isinstance(sent, dict) else None
    if not isinstance(error, dict) or "message" not in error:
        return body
    return orjson.dumps({**sent, "error": error["message"]})
