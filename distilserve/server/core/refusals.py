"""A request the core will not carry out, said without a transport."""

from __future__ import annotations

# why, each a transport maps to its own code (HTTP: distilserve/server/errors.py; gRPC:
# distilserve/server/routes/grpc_calls.py)
REASONS = (
    "not_found",  # no served model of that name, or none that can do it
    "wrong_task",  # the named model cannot do it
    "ambiguous",  # several served models can and none is named
    "bad_request",  # what the service will not do as asked (a model's load that failed, ...)
    "invalid",  # a value the model or the service cannot take
    "too_large",  # more inputs, characters or answer than the limits allow
    "input_too_long",  # an input longer than the model reads, and not to be cut
    "not_finite",  # the model's outputs for an input are not finite numbers
    "overloaded",  # the model's queue is full: retry after retry_after
    "unavailable",  # not serving now (loading, shutting down): retry after retry_after
    "client_closed",  # the client went away before its answer
)


class Refusal(Exception):
    """``reason`` (one of REASONS, or a transport's own kind), ``message`` in a client's
    words, ``retry_after`` in seconds where trying again later will do, and ``input`` the
    input refused where one is (as the message names it: "input 1", "document 0")."""

    def __init__(self, reason: str, message: str, retry_after: int | None = None,
                 input: str | None = None):
        super().__init__(message)
        self.reason, self.message, self.retry_after = reason, message, retry_after
        self.input = input


class ModelLoadError(Exception):
    """A model folder that cannot be served; the message says why."""
