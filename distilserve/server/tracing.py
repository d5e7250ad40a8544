"""OpenTelemetry traces over OTLP/HTTP (DISTILSERVE_OTLP_ENDPOINT), as TEI's
--otlp-endpoint sends them: a server span for every request but the probes and /metrics,
named by its route ("POST /v1/embed"), with its status and X-Request-Id (and one for
every gRPC call but the probes, named by its method: "tei.v1.Embed/Embed"); for a
request that ran a model, where its time went (tokenization, queue, inference, in
milliseconds, as the timing headers say) and its tokens. A request's W3C ``traceparent``
(and ``tracestate``) make its span a child of the caller's, so a trace runs from the
client through the service.

The exporter sends spans in batches from a thread of its own; the service's shutdown
sends what is left. The OpenTelemetry packages are imported only when an endpoint is set
(``pip install -c constraints.txt 'distilserve[otlp]'``; the dev install has them)."""

from __future__ import annotations

from distilserve.server import logs

SPAN = "distilserve.span"  # the request's span, in its ASGI scope
CONTEXT_HEADERS = (b"traceparent", b"tracestate")


class Tracing:
    def __init__(self, endpoint: str, service_name: str, untraced: frozenset[str]):
        """Spans to ``endpoint`` (the collector's base URL: spans go to its /v1/traces) as
        the service ``service_name``; GET requests of the paths ``untraced`` get none."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, StatusCode
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as e:
            raise RuntimeError(f"DISTILSERVE_OTLP_ENDPOINT needs OpenTelemetry's SDK and OTLP "
                               f"exporter ({e.name} is missing): pip install -c "
                               "constraints.txt 'distilserve[otlp]'") from None
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        # an export gives up after 3 s (OpenTelemetry's 10: the shutdown waited 6.6 s for
        # a collector that was not there)
        self.provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=3)))
        self.tracer = self.provider.get_tracer("distilserve")
        self.propagator = TraceContextTextMapPropagator()
        self.server, self.error = SpanKind.SERVER, StatusCode.ERROR
        self.untraced = untraced

    def start(self, scope):
        """The span of the request ``scope`` (None for a probe), begun now."""
        method, path = scope["method"], scope["path"]
        if method in ("GET", "HEAD") and path in self.untraced:
            return None
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"] if name in CONTEXT_HEADERS}
        return self._begun(f"{method} {path}", carrier,
                           {"http.request.method": method, "url.path": path})

    def start_rpc(self, service: str, method: str, metadata: dict[str, str]):
        """The span of a gRPC call (``metadata``: its own, which may carry a traceparent),
        begun now: named ``service/method``, as OpenTelemetry's gRPC conventions name it."""
        carrier = {name: value for name, value in metadata.items()
                   if name.encode() in CONTEXT_HEADERS}
        return self._begun(f"{service}/{method}", carrier, {
            "rpc.system": "grpc", "rpc.service": service, "rpc.method": method})

    def _begun(self, name: str, carrier: dict[str, str], attributes: dict):
        if (request_id := logs.REQUEST_ID.get()) is not None:  # distilserve.server.middleware.RequestId's
            attributes["distilserve.request_id"] = request_id
        return self.tracer.start_span(name, kind=self.server, attributes=attributes,
                                      context=self.propagator.extract(carrier))

    def end(self, span, method: str, route: str, status: int) -> None:
        """Names the span by its route, records its status, and ends it."""
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        self._ended(span, status)

    def end_rpc(self, span, code: int, status: int) -> None:
        """Records a gRPC call's status ``code`` (and ``status``, the HTTP one it stands
        for), and ends its span."""
        span.set_attribute("rpc.grpc.status_code", code)
        span.set_attribute("http.response.status_code", status)
        self._ended(span, status)

    def _ended(self, span, status: int) -> None:
        if status >= 500:
            span.set_status(self.error)
        span.end()

    def shutdown(self) -> None:
        """Sends the spans not sent yet."""
        self.provider.shutdown()


def record(span, result) -> None:
    """Where the request's time went (a model's run: server/core/runner.Result), on its
    span (None: not traced)."""
    if span is not None:
        span.set_attributes({
            "distilserve.tokenization_ms": result.tokenize_s * 1000,
            "distilserve.queue_ms": result.queued_s * 1000,
            "distilserve.inference_ms": result.inference_s * 1000,
            "distilserve.tokens": result.tokens, "distilserve.characters": result.characters,
            "distilserve.compute_type": result.compute_type})
