"""How ``distilserve serve`` logs: lines of text (the default), or with
DISTILSERVE_LOG_FORMAT=json one JSON object a line for log collectors (Loki, Elasticsearch,
Cloud Logging): distilserve's own messages and uvicorn's, its access log too
(DISTILSERVE_ACCESS_LOG), in every worker process, each written while a request was
answered with that request's id. python-json-logger writes them."""

from __future__ import annotations

import copy
import logging
import logging.config
import random
from contextvars import ContextVar

import uvicorn.config
from pythonjsonlogger.core import RESERVED_ATTRS

TEXT = "%(asctime)s %(levelname)s %(message)s"
# the id of the request being answered (distilserve.server.middleware.RequestId sets it in the
# request's task; distilserve/server/routes/grpc_server.py in a gRPC call's)
REQUEST_ID: ContextVar[str | None] = ContextVar("distilserve_request_id", default=None)


def request_id(given: str) -> str:
    """A request's id: the one its client gave (printable ASCII, at most 200 characters; a
    proxy's, e.g. ingress-nginx's), else a new one: 128 random bits in hex, as a UUID's,
    from ``random`` (seeded per process, again in a forked child) rather than uuid4's
    os.urandom, whose system call lets go of the GIL, so that under load the event loop
    waits to take it back (loadtests/RESULTS.md)."""
    return (given if 0 < len(given) <= 200 and given.isascii() and given.isprintable()
            else f"{random.getrandbits(128):032x}")


class RequestIds(logging.Filter):
    """Records written while a request is answered (uvicorn's access record among them)
    carry its id, ``request_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (request_id := REQUEST_ID.get()) is not None:
            record.request_id = request_id
        return True


class AccessFields(logging.Filter):
    """uvicorn's access records (``'%s - "%s %s HTTP/%s" %d'``) with their parts as
    fields of their own: client, method, path, status."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 5:
            record.client, record.method, record.path, _, record.status = record.args
        return True


def json_config() -> dict:
    """A logging.config.dictConfig: every record as {"time" (ISO 8601, UTC), "level",
    "logger", "message", and what else it carries (an exception's traceback as
    "exc_info", the request's id as "request_id")}; access records on stdout, the rest on
    stderr, as uvicorn's own."""
    def handler(stream: str, *filters: str) -> dict:
        return {"class": "logging.StreamHandler", "formatter": "json",
                "stream": f"ext://sys.{stream}", "filters": list(filters)}

    return {
        "version": 1, "disable_existing_loggers": False,
        "filters": {"access": {"()": AccessFields}, "request": {"()": RequestIds}},
        "formatters": {"json": {
            "()": "pythonjsonlogger.json.JsonFormatter", "timestamp": "time",
            "fmt": ["levelname", "name", "message"],
            "rename_fields": {"levelname": "level", "name": "logger"},
            # uvicorn's records carry their message again, with terminal colours
            "reserved_attrs": [*RESERVED_ATTRS, "color_message"]}},
        "handlers": {"default": handler("stderr", "request"),
                     "access": handler("stdout", "access", "request")},
        "loggers": {"uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
                    "uvicorn.access": {"handlers": ["access"], "level": "INFO",
                                       "propagate": False}},
        "root": {"handlers": ["default"], "level": "INFO"},
    }


def text_config() -> dict:
    """A logging.config.dictConfig: uvicorn's own, and every other record (distilserve's)
    a line of TEXT on stderr."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["formatters"]["text"] = {"format": TEXT}
    config["handlers"]["text"] = {"class": "logging.StreamHandler", "formatter": "text",
                                  "stream": "ext://sys.stderr"}
    config["root"] = {"handlers": ["text"], "level": "INFO"}
    return config


def configure(log_format: str) -> dict:
    """Sets this process's logging up; returns it as uvicorn's ``log_config``, so that its
    worker processes (which start afresh) log alike."""
    config = json_config() if log_format == "json" else text_config()
    logging.config.dictConfig(config)
    return config
