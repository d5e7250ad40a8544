"""Prometheus collectors, in a registry of the app's own (no global state). Under
``distilserve serve --workers N`` (PROMETHEUS_MULTIPROC_DIR set before the workers start)
prometheus-client keeps every worker's values in files of that folder, and /metrics,
whichever worker answers it, renders the sum over all of them. The same series, per
model, are Triton's statistics (``statistics``: the Open Inference Protocol's
/v2/models/stats), Triton's own Prometheus series (nv_inference_*, for the dashboards
made for Triton: ``triton_series``) and Text Embeddings Inference's (te_*, for TEI's:
``tei_series``), so all of them say the same of every worker."""

from __future__ import annotations

import asyncio
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import Metric, UnknownMetricFamily
from prometheus_client.samples import Sample

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# why the service closes a connection (distilserve/server/connections.py): past a cap when accepted,
# or a deadline passed
CLOSED = ("over_capacity", "client_over_capacity", "header_timeout", "body_timeout",
          "keep_alive_timeout")
VERSION = "1"  # each model's one version, as Triton's statistics and series name it
# the ASGI scope's key for when the request arrived (time.perf_counter(), set by the app's
# outermost middleware)
STARTED = "distilserve.started"


class Turn:
    """Per-request observations made on a running event loop, added up over the loop's
    turn and written to their series together when it ends (the loop's next callback), or
    before this process's values are read (``Metrics.render``, ``statistics``). Under
    ``--workers`` every write to a series is a write to the worker's file of values
    (prometheus-client's multiprocess mode), costing a request about as much as the rest
    of counting it, while at many clients one turn answers tens of requests: a histogram's
    observations of a turn become one write to its sum and one to each bucket they fell
    in. Off an event loop (a model's thread) a value is written at once."""

    def __init__(self):
        self.pending: list = []  # the values observed this turn
        self.scheduled = None  # the loop whose next callback writes them

    def defer(self, value) -> bool:
        """Whether ``value``'s observation waits for the end of the turn (it is then
        among ``pending``); False off an event loop."""
        loop = asyncio._get_running_loop()
        if loop is None:
            return False
        if self.scheduled is not loop:
            self.scheduled = loop
            loop.call_soon(self.write)
        if not value.dirty:
            value.dirty = True
            self.pending.append(value)
        return True

    def write(self) -> None:
        self.scheduled = None
        pending, self.pending = self.pending, []
        for value in pending:
            value.dirty = False
            value.write()


class TurnHistogram:
    """A Histogram's child (one label set's) observed through a Turn. It adds a turn's
    observations into the child's own sum and buckets (prometheus-client's ``_sum``,
    ``_buckets`` and ``_upper_bounds``; a bucket's count is its own, made cumulative
    when rendered), as ``Histogram.observe`` adds one."""

    __slots__ = ("child", "turn", "bounds", "sum", "counts", "dirty")

    def __init__(self, child, turn: Turn):
        self.child, self.turn, self.bounds = child, turn, child._upper_bounds
        self.sum, self.counts, self.dirty = 0.0, [0] * len(self.bounds), False

    def observe(self, amount: float) -> None:
        if amount != amount or not self.turn.defer(self):  # NaN: no bucket, as observe
            self.child.observe(amount)
            return
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bound >= amount

    def write(self) -> None:
        self.child._sum.inc(self.sum)
        for bucket, count in zip(self.child._buckets, self.counts):
            if count:
                bucket.inc(count)
        self.sum, self.counts = 0.0, [0] * len(self.bounds)


class TurnCounter:
    """A Counter's child counted through a Turn."""

    __slots__ = ("child", "turn", "amount", "dirty")

    def __init__(self, child, turn: Turn):
        self.child, self.turn, self.amount, self.dirty = child, turn, 0.0, False

    def inc(self, amount: float = 1) -> None:
        if not self.turn.defer(self):
            self.child.inc(amount)
            return
        self.amount += amount

    def write(self) -> None:
        self.child.inc(self.amount)
        self.amount = 0.0


class TurnGauge:
    """A Gauge's child set through a Turn: the turn's last value is written."""

    __slots__ = ("child", "turn", "value", "dirty")

    def __init__(self, child, turn: Turn):
        self.child, self.turn, self.value, self.dirty = child, turn, 0.0, False

    def set(self, value: float) -> None:
        if not self.turn.defer(self):
            self.child.set(value)
            return
        self.value = value

    def write(self) -> None:
        self.child.set(self.value)


@dataclass(frozen=True)
class ModelSeries:
    """One model's series, looked up once (``labels()`` costs as much as the counting, and
    these are counted per request or per batch); a request's (queued, tokenized, answered,
    failed, ran, postprocessed, last) are written through the Metrics' Turn."""

    queue_depth: Any  # inputs waiting (a Gauge's child)
    queued: Any  # seconds a request waited (a Histogram's child)
    tokenized: Any  # seconds its inputs were tokenised
    batch_size: Any
    inference: Any
    rejected: Any  # inputs refused, queue full (a Counter's child)
    truncated: Any  # inputs cut to max_length (a Counter's child)
    answered: Any  # seconds a request took with the model, answered (a Histogram's child)
    failed: Any  # the same, failed
    ran: Any  # seconds any of a request's batches ran
    postprocessed: Any  # seconds from a request's outputs to its answer
    last: Any  # when a request was last answered (Unix seconds, a Gauge's child)
    by_size: Callable[[int], Any]  # a batch size's forward passes (a Summary's child)
    by_depth: Callable[[int], Any]  # forward passes at a depth (a Counter's child)

    def observe_batch(self, size: int, seconds: float, depth: int | None = None) -> None:
        """A forward pass of ``size`` inputs; ``depth``: the iterations a recursive model
        whose depth may vary ran for it."""
        self.batch_size.observe(size)
        self.inference.observe(seconds)
        self.by_size(size).observe(seconds)
        if depth is not None:
            self.by_depth(depth).inc()

    def observe_result(self, result, seconds: float) -> None:
        """A request answered in ``seconds`` with the model: where its time went (an
        engine's Result)."""
        self.answered.observe(seconds)
        self.queued.observe(result.queued_s)
        self.tokenized.observe(result.tokenize_s)
        self.ran.observe(result.inference_s)
        self.last.set(time.time())


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
        self.with_model = Histogram("distilserve_model_request_seconds", "time a request "
                                    "spent with the model (tokenised, waiting, run), by "
                                    "outcome", ["model", "outcome"], buckets=LATENCY_BUCKETS,
                                    registry=r)
        self.ran = Histogram("distilserve_request_inference_seconds", "time any of a "
                             "request's batches ran", ["model"], buckets=LATENCY_BUCKETS,
                             registry=r)
        self.postprocessed = Histogram("distilserve_postprocess_seconds", "time from a "
                                       "request's outputs to its answer (pooling, scores, "
                                       "entities, the response)", ["model"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.last = Gauge("distilserve_last_request_timestamp_seconds", "when a request "
                          "was last answered", ["model"], registry=r, multiprocess_mode="max")
        self.by_size = Summary("distilserve_batch_seconds", "forward pass time by batch "
                               "size", ["model", "size"], registry=r)
        self.by_depth = Counter("distilserve_batches_by_iterations", "forward passes of a "
                                "recursive model whose depth may vary, by the iterations "
                                "they ran", ["model", "iterations"], registry=r)
        self.connections_closed = Counter(
            "distilserve_connections_closed", "connections the service closed, by why: past "
            "a cap when accepted (over_capacity, client_over_capacity), or a deadline passed "
            "(header_timeout, body_timeout, keep_alive_timeout)", ["reason"], registry=r)
        for reason in CLOSED:  # each series there from the start, at 0
            self.connections_closed.labels(reason)
        self._per_request: dict[tuple[str, int], tuple] = {}
        self.turn = Turn()  # the per-request observations' writes, a turn's together

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """An HTTP request answered. Its route's counter and histogram are looked up once
        (``labels()`` costs as much as the counting, and this runs for every request)."""
        children = self._per_request.get((route, status))
        if children is None:
            children = self._per_request[route, status] = (
                TurnCounter(self.requests.labels(route, str(status)), self.turn),
                TurnHistogram(self.latency.labels(route), self.turn))
        children[0].inc()
        children[1].observe(seconds)

    def model(self, name: str) -> ModelSeries:
        """The series of the model served as ``name``."""
        def by(metric) -> Callable[[int], Any]:
            """The model's child of ``metric`` for a number (its second label), looked up
            once."""
            children: dict[int, Any] = {}

            def child(value: int):
                found = children.get(value)
                if found is None:
                    found = children[value] = metric.labels(name, str(value))
                return found

            return child

        def per_request(child):  # observed on the event loop, once or more a request
            return TurnHistogram(child, self.turn)

        return ModelSeries(
            self.queue_depth.labels(name), per_request(self.queued.labels(name)),
            per_request(self.tokenized.labels(name)), self.batch_size.labels(name),
            self.inference.labels(name), self.rejected.labels(name),
            self.truncated.labels(name), per_request(self.with_model.labels(name, "success")),
            per_request(self.with_model.labels(name, "failure")),
            per_request(self.ran.labels(name)), per_request(self.postprocessed.labels(name)),
            TurnGauge(self.last.labels(name), self.turn), by(self.by_size), by(self.by_depth))

    def _everyone(self) -> CollectorRegistry:
        """The registry of this process, or with several workers one of all of them (this
        turn's observations here written first)."""
        if asyncio._get_running_loop() is not None:
            self.turn.write()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return registry
        return self.registry

    def render(self) -> bytes:
        """The series (every worker's), and Triton's and TEI's names for them, collected
        once."""
        families = list(self._everyone().collect())
        return generate_latest(_Collected(families + triton_series(families)
                                          + tei_series(families)))

    def statistics(self, names: list[str]) -> list[dict]:
        """Triton's statistics (its statistics extension) of the models ``names``."""
        return triton_statistics((sample for family in self._everyone().collect()
                                  for sample in family.samples), names)


def _duration(count: float = 0, seconds: float = 0) -> dict:
    return {"count": int(count), "ns": round(seconds * 1e9)}


def triton_statistics(samples: Iterable, names: list[str]) -> list[dict]:
    """Triton's statistics of the models ``names`` (in that order), from the samples of
    Metrics' series (prometheus-client's: name, labels, value): per request, the outcome,
    waiting (queue), tokenising (compute_input), its batches' run (compute_infer) and the
    answer made of the outputs (compute_output); per batch size, its forward passes."""
    seen: dict[tuple, float] = {}
    for name, labels, value, *_ in samples:
        if "model" in labels:
            key = (name, labels["model"], labels.get("outcome") or labels.get("size"))
            seen[key] = seen.get(key, 0) + value

    def duration(series: str, model: str, label: str | None = None) -> dict:
        return _duration(seen.get((series + "_count", model, label), 0),
                         seen.get((series + "_sum", model, label), 0))

    answer = []
    for model in names:
        sizes = sorted(int(size) for series, m, size in seen
                       if series == "distilserve_batch_seconds_count" and m == model)
        batches = [{"batch_size": size, "compute_infer": duration(
            "distilserve_batch_seconds", model, str(size))} for size in sizes]
        answer.append({
            "name": model, "version": VERSION,
            "last_inference": round(seen.get(
                ("distilserve_last_request_timestamp_seconds", model, None), 0) * 1000),
            "inference_count": sum(b["batch_size"] * b["compute_infer"]["count"]
                                   for b in batches),
            "execution_count": sum(b["compute_infer"]["count"] for b in batches),
            "inference_stats": {
                "success": duration("distilserve_model_request_seconds", model, "success"),
                "fail": duration("distilserve_model_request_seconds", model, "failure"),
                "queue": duration("distilserve_queue_seconds", model),
                "compute_input": duration("distilserve_tokenize_seconds", model),
                "compute_infer": duration("distilserve_request_inference_seconds", model),
                "compute_output": duration("distilserve_postprocess_seconds", model),
                "cache_hit": _duration(), "cache_miss": _duration()},
            "batch_stats": batches})
    return answer


# Triton's per-model series: (name, help, its value in a model's statistics)
TRITON_SERIES = [
    ("nv_inference_request_success", "successful requests",
     lambda s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_request_failure", "failed requests",
     lambda s: s["inference_stats"]["fail"]["count"]),
    ("nv_inference_count", "inputs run", lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "batches run", lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "requests' time with the model, microseconds",
     lambda s: (s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"])
     / 1000),
    *((f"nv_inference_{part}_duration_us", f"requests' {what} time, microseconds",
       lambda s, part=part: s["inference_stats"][part]["ns"] / 1000)
      for part, what in (("queue", "waiting"), ("compute_input", "tokenising"),
                         ("compute_infer", "batches' run"),
                         ("compute_output", "postprocessing"))),
]


def triton_series(families: list) -> list:
    """Triton's Prometheus series of every model in ``families`` (labels model and
    version), computed from its statistics, so that the dashboards and alerts made for
    Triton read this service. Untyped: prometheus-client writes a counter's name with
    _total, which Triton's names have not."""
    samples = [sample for family in families for sample in family.samples]
    models = sorted({sample.labels["model"] for sample in samples if "model" in sample.labels})
    statistics = triton_statistics(samples, models)
    out = []
    for name, help_text, value in TRITON_SERIES:
        family = UnknownMetricFamily(name, help_text, labels=["model", "version"])
        for stats in statistics:
            family.add_metric([stats["name"], VERSION], value(stats))
        out.append(family)
    return out


# TEI's series, each one of ours under TEI's name (labelled by model, which TEI, serving
# one, has not): (TEI's name, ours, a label's value its samples must have, or None)
TEI_SERIES = [
    ("te_request_duration", "distilserve_model_request_seconds", ("outcome", "success")),
    ("te_request_tokenization_duration", "distilserve_tokenize_seconds", None),
    ("te_request_queue_duration", "distilserve_queue_seconds", None),
    ("te_request_inference_duration", "distilserve_request_inference_seconds", None),
    ("te_batch_next_size", "distilserve_batch_size", None),
    ("te_queue_size", "distilserve_queue_depth", None),
]
# TEI's counters (untyped: Rust's exporter writes them without _total): requests with a
# model, answered and failed, counted from our series of their time
TEI_COUNTERS = [("te_request_count", ("success", "failure")),
                ("te_request_success", ("success",)), ("te_request_failure", ("failure",))]


def tei_series(families: list) -> list:
    """Text Embeddings Inference's Prometheus series, so that the dashboards and alerts
    made for TEI read this service: its request histograms (seconds) and queue size as
    ours are, under its names, and its request counters."""
    ours = {family.name: family for family in families}
    out = []
    for name, source, only in TEI_SERIES:
        family = ours.get(source)
        if family is None:
            continue
        renamed = Metric(name, family.documentation, family.type)
        for s in family.samples:  # (their _created: left out, TEI has none)
            if not s.name.endswith("_created") and (only is None
                                                    or s.labels.get(only[0]) == only[1]):
                labels = {k: v for k, v in s.labels.items() if only is None or k != only[0]}
                renamed.samples.append(Sample(name + s.name[len(source):], labels, s.value,
                                              s.timestamp, s.exemplar))
        out.append(renamed)
    counted: dict[tuple[str, str], float] = {}  # (model, outcome) -> requests
    for s in ours["distilserve_model_request_seconds"].samples:
        if s.name.endswith("_count"):
            key = (s.labels["model"], s.labels["outcome"])
            counted[key] = counted.get(key, 0) + s.value
    for name, outcomes in TEI_COUNTERS:
        family = UnknownMetricFamily(name, f"requests with a model: {' or '.join(outcomes)}",
                                     labels=["model"])
        for model in sorted({model for model, _ in counted}):
            family.add_metric([model], sum(counted.get((model, o), 0) for o in outcomes))
        out.append(family)
    return out


class _Collected:
    """Metric families collected already, as generate_latest takes them (a registry)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families
