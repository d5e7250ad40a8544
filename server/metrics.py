"""Prometheus collectors, in a registry of the app's own (no global state). Under
``distilserve serve --workers N`` (PROMETHEUS_MULTIPROC_DIR set before the workers start)
prometheus-client keeps every worker's values in files of that folder, and /metrics,
whichever worker answers it, renders the sum over all of them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# the ASGI scope's key for when the request arrived (time.perf_counter(), set by the app's
# outermost middleware)
STARTED = "distilserve.started"


@dataclass(frozen=True)
class ModelSeries:
    """One model's series, looked up once (``labels()`` costs as much as the counting, and
    these are counted per request or per batch)."""

    queue_depth: Any  # inputs waiting (a Gauge's child)
    queued: Any  # seconds a request waited (a Histogram's child)
    tokenized: Any  # seconds its inputs were tokenised
    batch_size: Any
    inference: Any
    rejected: Any  # inputs refused, queue full (a Counter's child)
    truncated: Any  # inputs cut to max_length (a Counter's child)

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.inference.observe(seconds)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("distilserve_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.latency = Histogram("distilserve_request_seconds", "HTTP request latency",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("distilserve_queue_depth", "inputs waiting", ["model"],
                                 registry=r, multiprocess_mode="livesum")
        self.batch_size = Histogram("distilserve_batch_size", "inputs per forward pass",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.inference = Histogram("distilserve_inference_seconds", "forward pass time",
                                   ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queued = Histogram("distilserve_queue_seconds", "time a request waited, its "
                                "inputs neither tokenised nor in a batch", ["model"],
                                buckets=LATENCY_BUCKETS, registry=r)
        self.tokenized = Histogram("distilserve_tokenize_seconds", "time a request's inputs "
                                   "were tokenised", ["model"], buckets=LATENCY_BUCKETS,
                                   registry=r)
        self.rejected = Counter("distilserve_rejected_inputs", "inputs refused, queue full",
                                ["model"], registry=r)
        self.truncated = Counter("distilserve_truncated_inputs", "inputs longer than the "
                                 "model's max_length tokens, cut to it", ["model"], registry=r)
        self._per_request: dict[tuple[str, int], tuple] = {}

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """An HTTP request answered. Its route's counter and histogram are looked up once
        (``labels()`` costs as much as the counting, and this runs for every request)."""
        children = self._per_request.get((route, status))
        if children is None:
            children = self._per_request[route, status] = (
                self.requests.labels(route, str(status)), self.latency.labels(route))
        children[0].inc()
        children[1].observe(seconds)

    def model(self, name: str) -> ModelSeries:
        """The series of the model served as ``name``."""
        return ModelSeries(*(series.labels(name) for series in (
            self.queue_depth, self.queued, self.tokenized, self.batch_size, self.inference,
            self.rejected, self.truncated)))

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # several workers: all of them
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
