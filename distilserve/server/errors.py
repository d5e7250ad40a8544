"""One error shape, {"error": {"type", "message"}}, and the handlers that produce it (the
inference routes' fast path, distilserve/server/routes/fast_path.py, renders the same responses)."""

from __future__ import annotations

import json
import sys
from typing import get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from pydantic_core.core_schema import ErrorType
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from distilserve.server.core.refusals import Refusal

# the core's refusals in HTTP's words: reason -> (status, the error type in the body)
HTTP = {"not_found": (404, "model_not_found"), "wrong_task": (400, "wrong_task"),
        "ambiguous": (400, "invalid_request"), "bad_request": (400, "invalid_request"),
        "invalid": (422, "invalid_request"),
        "too_large": (413, "payload_too_large"), "input_too_long": (413, "input_too_long"),
        "not_finite": (422, "not_finite"), "overloaded": (429, "overloaded"),
        "unavailable": (503, "unavailable"), "client_closed": (499, "client_closed")}


class ApiError(Refusal):
    """An error a client can act on, in HTTP's words. ``kind`` is the error type in the
    body."""

    def __init__(self, status: int, kind: str, message: str, headers: dict | None = None):
        super().__init__(kind, message)
        self.status, self.kind, self.headers = status, kind, headers

    @classmethod
    def of(cls, refusal: Refusal) -> ApiError:
        """A core's refusal as HTTP says it (an ApiError as it is)."""
        if isinstance(refusal, ApiError):
            return refusal
        status, kind = HTTP[refusal.reason]
        headers = None if refusal.retry_after is None else {
            "Retry-After": str(refusal.retry_after)}
        return cls(status, kind, refusal.message, headers)


def body(kind: str, message: str) -> dict:
    return {"error": {"type": kind, "message": message}}


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    """Every error's body (documented in the OpenAPI document; built by ``body``)."""

    error: ErrorDetail


WHY = {
    400: "the model does not do this task, or several models do and none is named",
    401: "DISTILSERVE_API_KEY is set and 'Authorization: Bearer KEY' is missing or wrong",
    404: "no served model of that name, or none does the task",
    413: "too many inputs, an input too long (characters, or tokens with truncate false), "
         "or a body over the limit",
    422: "malformed JSON, wrong types or values, or values the model cannot take",
    429: "the model's queue is full: retry after Retry-After seconds",
    503: "the models are still loading or the service is shutting down: retry after "
         "Retry-After seconds",
}


def responses(*statuses: int) -> dict:
    """The OpenAPI ``responses`` of a route for the errors it can return."""
    return {status: {"model": ErrorBody, "description": WHY[status]} for status in statuses}


INFERENCE = responses(400, 401, 404, 413, 422, 429, 503)  # every route that runs a model


def _field(part) -> bool:
    """Whether a part of an error's location is a field's name (snake_case) or an index,
    not a union's branch (list[int], str, a model's name)."""
    return isinstance(part, int) or (part.isidentifier() and part.islower()
                                     and part not in ("str", "int", "float", "bool"))


def _location(loc) -> str:
    """body.documents.0.RerankDocument.text -> documents.0.text: field names and indices,
    not the union branches between them."""
    return ".".join(str(p) for p in loc if p != "body" and _field(p)) or "body"


def _closest_branches(errors: list[dict]) -> list[dict]:
    """The errors, less those of a union's branches other than the one the value came
    closest to: the branch with the deepest error (it matched most of the value's
    structure), then one whose errors are all of values of the right type (a number too
    large, not a number where a list is due), then the one with the fewest; ties all
    kept. [-1, 5] for a text, texts or token ids fails every branch, token ids' only at
    "input.0: ... greater than or equal to 0", which alone is said (not "a valid string"
    and "a valid list" twice each)."""
    branches: dict[tuple, dict[str, list[dict]]] = {}  # a location's branches' errors
    for e in errors:
        loc = tuple(e.get("loc", ()))
        branch = next((i for i, p in enumerate(loc) if p != "body" and not _field(p)), None)
        if branch is not None:
            branches.setdefault(loc[:branch], {}).setdefault(loc[branch], []).append(e)
    farther = set()
    for tried in branches.values():
        reach = {name: (max(len(e["loc"]) for e in its),
                        not any(e["type"].endswith("_type") for e in its), -len(its))
                 for name, its in tried.items()}
        closest = max(reach.values())
        farther.update(id(e) for name, its in tried.items() if reach[name] < closest
                       for e in its)
    return [e for e in errors if id(e) not in farther]


def json_content_type(headers) -> bool:
    """No Content-Type, application/json or any +json type: a body FastAPI reads as JSON."""
    kind = headers.get("content-type", "").partition(";")[0].strip().lower()
    return kind in ("", "application/json") or kind.endswith("+json")


def unparseable(error: Exception) -> str:
    """Why a body is not JSON, in a client's words."""
    if isinstance(error, json.JSONDecodeError):
        # some of json's messages end in " at" ("Unterminated string starting at")
        return f"malformed JSON: {error.msg.removesuffix(' at')} at character {error.pos}"
    if isinstance(error, UnicodeDecodeError):
        return f"malformed JSON: the body is not UTF-8 (byte {error.start})"
    if isinstance(error, RecursionError):
        return "malformed JSON: nested too deeply"
    if isinstance(error, ValueError):  # what json.loads raises besides the two above
        return f"malformed JSON: a number of more than {sys.get_int_max_str_digits()} digits"
    return f"malformed JSON: {error}"


def not_json(content_type: str) -> str:
    return (f"the body must be JSON, sent with Content-Type: application/json (this one was "
            f"sent as {content_type!r}; curl -d sends application/x-www-form-urlencoded: add "
            "-H 'Content-Type: application/json')")


def api_error(exc: Refusal) -> JSONResponse:
    exc = ApiError.of(exc)
    return JSONResponse(body(exc.kind, exc.message), exc.status, headers=exc.headers)


def http_error(exc: StarletteHTTPException) -> JSONResponse:
    kind = {404: "not_found", 405: "method_not_allowed",
            413: "payload_too_large"}.get(exc.status_code, "http_error")
    return JSONResponse(body(kind, str(exc.detail)), exc.status_code,
                        headers=getattr(exc, "headers", None))


def refused(error: ValidationError, prefix: str = "") -> Refusal:
    """A value that did not validate as a body (or, with ``prefix``, as its parameters),
    refused naming each field as ``invalid`` says it."""
    return Refusal("invalid", prefix + invalid(error.errors()))


def invalid(errors: list[dict]) -> str:
    """A 422's message: pydantic's errors, each where it is (``field.0.field: why``)."""
    problems = []
    for e in _closest_branches(errors):
        loc = e.get("loc", ())
        if isinstance(e.get("input"), list | dict) and loc and loc[-1] == "str":
            continue  # the union's string branch, for a value that is a list or object
        if e.get("type") == "json_invalid":
            problems.append(f"malformed JSON: {e.get('ctx', {}).get('error', e['msg'])}")
        else:
            sent = _sent(e.get("input")) if e.get("type") in PYDANTICS else ""  # not ours
            problems.append(f"{_location(loc)}: {e['msg']}{sent}")
    return "; ".join(dict.fromkeys(problems))


PYDANTICS = frozenset(get_args(ErrorType)) - {"value_error", "assertion_error"}


def _sent(value) -> str:
    """What the client sent where it was refused, as JSON, where that is short (a
    number, a boolean, null, a short string)."""
    if isinstance(value, bool | int | float | None) or isinstance(value, str) and len(value) <= 40:
        said = json.dumps(value, ensure_ascii=False)
        return f" (sent {said})" if len(said) <= 42 else ""
    return ""


def _allowed(routes, scope) -> list[str]:
    """The methods some route takes at the scope's path."""
    return [method for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
            if any(route.matches({**scope, "method": method})[0] is Match.FULL
                   for route in routes)]


def install(app: FastAPI) -> None:
    @app.exception_handler(Refusal)
    async def on_refusal(request: Request, exc: Refusal):
        return api_error(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        if not json_content_type(request.headers) and any(
                _location(e.get("loc", ())) == "body" for e in exc.errors()):
            # FastAPI validated the body's bytes, unparsed (against each model of a union
            # body): "a valid dictionary", it says
            return JSONResponse(body("invalid_request",
                                     not_json(request.headers["content-type"])), 422)
        return JSONResponse(body("invalid_request", invalid(exc.errors())), 422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:  # no route there (a model not found is a Refusal)
            exc.detail = f"no route {where} (GET /openapi.json lists them)"
        if exc.status_code == 405:  # Starlette's Allow names the methods of the first
            # route of the path (GET / and POST / are two), not of all of them
            allowed = ", ".join(_allowed(request.app.router.routes, request.scope))
            exc.headers = {**(exc.headers or {}), "Allow": allowed}
            exc.detail = f"no route {where}: {request.url.path} takes {allowed}"
        return http_error(exc)

    @app.exception_handler(Exception)
    async def on_internal_error(request: Request, exc: Exception):
        return JSONResponse(body("internal_error", f"{type(exc).__name__}: {exc}"), 500)
