"""Python clients for distilserve (httpx): ``DistilServeClient`` and
``AsyncDistilServeClient``, with the routes as methods, typed exceptions, and retries with
backoff on 429 and 503. Imports nothing from distilserve.server or distilserve.models."""

from distilserve.client.api import (
                        AsyncDistilServeClient,
                        BadRequest,
                        ConnectionFailed,
                        DistilServeClient,
                        DistilServeError,
                        NotFound,
                        Overloaded,
                        PayloadTooLarge,
                        TimedOut,
                        Unauthorized,
                        Unavailable,
)

__all__ = ["AsyncDistilServeClient", "BadRequest", "ConnectionFailed", "DistilServeClient",
           "DistilServeError", "NotFound", "Overloaded", "PayloadTooLarge", "TimedOut",
           "Unauthorized", "Unavailable"]
