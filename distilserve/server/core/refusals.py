"""A request the core will not carry out, said without a transport."""

from __future__ import annotations

# why, each a transport maps to its own code (HTTP: distilserve/server/errors.py)
REASONS = (
    "not_found",  # no served model of that name, or none that can do it
    "wrong_task",  # the named model cannot do it
    "ambiguous",  # several served models can and none is named
    "unavailable",  # not serving now (loading, shutting down): retry after retry_after
)


class Refusal(Exception):
    """``reason`` (one of REASONS, or a transport's own kind), ``message`` in a client's
    words, ``retry_after`` in seconds where trying again later will do."""

    def __init__(self, reason: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.reason, self.message, self.retry_after = reason, message, retry_after


class ModelLoadError(Exception):
    """A model folder that cannot be served; the message says why."""
