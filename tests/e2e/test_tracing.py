"""End to end: with DISTILSERVE_OTLP_ENDPOINT the service sends a span per request to an
OTLP/HTTP collector (here one on 127.0.0.1 that keeps what it is sent), children of the
caller's traceparent, with the route, status, request id and where the time went."""

from __future__ import annotations

import http.server
import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests import web
from tests.conftest import running_server

TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture
def collector():
    """An OTLP/HTTP endpoint on 127.0.0.1: its URL and the spans posted to /v1/traces."""
    spans = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path == "/v1/traces":
                sent = ExportTraceServiceRequest.FromString(body)
                spans.extend((resource.resource, span) for resource in sent.resource_spans
                             for scoped in resource.scope_spans for span in scoped.spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", spans
    server.shutdown()
    server.server_close()


def _attributes(span) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_each_request_is_a_span_of_the_callers_trace(exports, tiny_checkpoints, tmp_path, collector):
    endpoint, spans = collector
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    with running_server(tmp_path / "repo", otlp_endpoint=endpoint,
                        otlp_service_name="embedder") as url:
        traced = web.post(url + "/v1/embed", json={"inputs": "a sentence"}, headers={
            "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "x-request-id": "req-1"})
        assert traced.status_code == 200
        assert web.post(url + "/v1/embed", json={"model": "nope", "inputs": "x"}
                          ).status_code == 404
        assert web.get(url + "/health").status_code == 200  # a probe: no span
    # the service's shutdown sent what was left
    by_route = {span.name: (resource, span) for resource, span in spans}
    assert set(by_route) == {"POST /v1/embed"} and len(spans) == 2, [s.name for _, s in spans]
    resource, span = next((r, s) for r, s in spans if s.trace_id.hex() == TRACE_ID)
    assert span.parent_span_id.hex() == PARENT_ID  # a child of the caller's span
    assert span.kind == span.SPAN_KIND_SERVER
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == \
        "embedder"
    attributes = _attributes(span)
    assert attributes["http.route"] == "/v1/embed"
    assert attributes["http.response.status_code"] == 200
    assert attributes["distilserve.request_id"] == "req-1"
    assert attributes["distilserve.tokens"] == 4  # [CLS] a sentence [SEP]
    assert attributes["distilserve.inference_ms"] > 0
    assert attributes["distilserve.compute_type"] == "cpu"
    (refused,) = [s for _, s in spans if s.trace_id.hex() != TRACE_ID]
    assert _attributes(refused)["http.response.status_code"] == 404  # a trace of its own
    assert "distilserve.inference_ms" not in _attributes(refused)  # nothing ran


def test_without_an_endpoint_nothing_is_traced():
    from distilserve.server.app import create_app
    from distilserve.server.middleware import RequestMetrics
    from distilserve.server.settings import Settings

    app = create_app(Settings())
    assert [m.kwargs["tracing"] for m in app.user_middleware if m.cls is RequestMetrics] == [None]


def test_each_grpc_call_is_a_span_of_the_callers_trace(exports, tiny_checkpoints, tmp_path, collector):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from distilserve.server.routes.tei.grpc_services import pb, pb_grpc
    from tests.conftest import unallocated_port

    endpoint, spans = collector
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    port = unallocated_port()
    with running_server(tmp_path / "repo", otlp_endpoint=endpoint, grpc_port=port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="a sentence"), metadata=(
                ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"), ("x-request-id", "req-2")))
            with pytest.raises(grpc.RpcError):
                pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="x"),
                                                 metadata=(("model", "nope"),))
            inference = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert inference.ServerLive(service_pb2.ServerLiveRequest()).live  # a probe
    assert sorted(s.name for _, s in spans) == ["tei.v1.Embed/Embed"] * 2
    (span,) = [s for _, s in spans if s.trace_id.hex() == TRACE_ID]
    assert span.parent_span_id.hex() == PARENT_ID and span.kind == span.SPAN_KIND_SERVER
    attributes = _attributes(span)
    assert (attributes["rpc.system"], attributes["rpc.service"], attributes["rpc.method"]) \
        == ("grpc", "tei.v1.Embed", "Embed")
    assert (attributes["rpc.grpc.status_code"], attributes["distilserve.request_id"]) == (
        0, "req-2")
    assert attributes["distilserve.tokens"] == 4 and attributes["distilserve.inference_ms"] > 0
    (refused,) = [s for _, s in spans if s.trace_id.hex() != TRACE_ID]
    assert _attributes(refused)["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
