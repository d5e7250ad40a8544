"""How ``distilserve serve`` logs: lines of text (the default), or with
DISTILSERVE_LOG_FORMAT=json one JSON object a line for log collectors (Loki, Elasticsearch,
Cloud Logging): distilserve's own messages and uvicorn's, its access log too
(DISTILSERVE_ACCESS_LOG), in every worker process. python-json-logger writes them."""

from __future__ import annotations

import logging
import logging.config

from pythonjsonlogger.core import RESERVED_ATTRS

TEXT = "%(asctime)s %(levelname)s %(message)s"


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
    "exc_info")}; access records on stdout, the rest on stderr, as uvicorn's own."""
    def handler(stream: str, *filters: str) -> dict:
        return {"class": "logging.StreamHandler", "formatter": "json",
                "stream": f"ext://sys.{stream}", "filters": list(filters)}

    return {
        "version": 1, "disable_existing_loggers": False,
        "filters": {"access": {"()": AccessFields}},
        "formatters": {"json": {
            "()": "pythonjsonlogger.json.JsonFormatter", "timestamp": "time",
            "fmt": ["levelname", "name", "message"],
            "rename_fields": {"levelname": "level", "name": "logger"},
            # uvicorn's records carry their message again, with terminal colours
            "reserved_attrs": [*RESERVED_ATTRS, "color_message"]}},
        "handlers": {"default": handler("stderr"), "access": handler("stdout", "access")},
        "loggers": {"uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
                    "uvicorn.access": {"handlers": ["access"], "level": "INFO",
                                       "propagate": False}},
        "root": {"handlers": ["default"], "level": "INFO"},
    }


def configure(log_format: str) -> dict | None:
    """Sets this process's logging up; returns what uvicorn's ``log_config`` should be,
    so that its worker processes log alike (None: uvicorn's own text format)."""
    if log_format == "json":
        config = json_config()
        logging.config.dictConfig(config)
        return config
    logging.basicConfig(level=logging.INFO, format=TEXT)
    return None
