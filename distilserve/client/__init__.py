"""Python clients for distilserve (httpx): ``DistilServeClient`` and
``AsyncDistilServeClient``, with the routes as methods, typed exceptions, and retries with
backoff on 429 and 503. Imports nothing from distilserve.server or distilserve.models."""

from distilserve.client.api import (
                        AsyncDistilServeClient,
                        BadRequest,
                        DistilServeClient,
                        DistilServeError,
                        NotFound,
                        Overloaded,
                        PayloadTooLarge,
                        Unauthorized,
                        Unavailable,
)

__all__ = ["AsyncDistilServeClient", "BadRequest", "DistilServeClient", "DistilServeError",
           "NotFound", "Overloaded", "PayloadTooLarge", "Unauthorized", "Unavailable"]
