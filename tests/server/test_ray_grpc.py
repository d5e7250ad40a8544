"""distilserve/server/ray_grpc.py and ray_hooks.py without a Ray instance: the ingress has a
method for every RPC the gRPC port serves, a refused call ends with its status on Ray
Serve's context, and a local instance's gRPC proxy binds the host it is given."""

from __future__ import annotations

import asyncio
import inspect
from unittest.mock import Mock

import grpc
import pytest

pytest.importorskip("ray.serve")
ray_grpc = pytest.importorskip("distilserve.server.ray_grpc")

from ray.serve._private import default_impl  # noqa: E402

from distilserve.server import ray_hooks  # noqa: E402
from distilserve.server.routes import grpc_server  # noqa: E402


class Recorder:
    """A grpc.aio server's add_insecure_port and add_generic_rpc_handlers, recorded."""

    def __init__(self):
        self.ports, self.methods = [], {}

    def add_insecure_port(self, address):
        self.ports.append(address)

    def add_generic_rpc_handlers(self, handlers):
        for handler in handlers:
            self.methods.update(handler._method_handlers)

    def add_registered_method_handlers(self, service, handlers):
        self.methods.update({f"/{service}/{name}": h for name, h in handlers.items()})


def test_the_ingress_takes_every_rpc_the_grpc_port_serves():
    proxy, port = Recorder(), Recorder()
    ray_grpc.add_servicers(Mock(), proxy)  # what Ray Serve's proxy is given (a Mock, as Ray's)
    # what distilserve serve's gRPC port registers (grpc_server.start), reflection aside
    for module in (ray_grpc.oip_grpc, ray_grpc.tei_grpc):
        module.add(port, None, None)
    ray_grpc.health_pb2_grpc.add_HealthServicer_to_server(grpc_server.Health(None, []), port)
    assert set(proxy.methods) == set(port.methods) and len(proxy.methods) > 30
    for path, handler in proxy.methods.items():
        method = getattr(ray_grpc.GrpcIngress, path.rpartition("/")[2])
        assert "grpc_context" in inspect.signature(method).parameters, path
        streams = handler.unary_stream is not None or handler.stream_stream is not None
        assert inspect.isasyncgenfunction(method) == streams, path


class Context:
    """Ray Serve's RayServegRPCContext, as far as RayContext uses it."""

    def __init__(self):
        self._code, self._details = None, ""
        self._trailing = [("request_id", "r1")]

    def invocation_metadata(self):
        return [("authorization", "Bearer x")]

    def code(self):
        return self._code

    def set_code(self, code):
        self._code = code

    def set_details(self, details):
        self._details = details

    def trailing_metadata(self):
        return self._trailing

    def set_trailing_metadata(self, metadata):
        self._trailing = metadata


def run_rpc(name, servicer):
    (method,) = [m for _, _, d in ray_grpc.SERVICES for m in d.methods if m.name == name]
    rpc = ray_grpc._rpc(method)

    class Ingress:
        def servicer(self, called):
            assert called == name
            return servicer

    context = Context()
    if inspect.isasyncgenfunction(rpc):
        async def collect():
            return [a async for a in rpc(Ingress(), "message", grpc_context=context)]
        return asyncio.run(collect()), context
    return asyncio.run(rpc(Ingress(), "message", grpc_context=context)), context


def test_a_refused_call_returns_with_its_status_set_where_ray_would_log_a_failure():
    async def refused(message, context):
        assert context.invocation_metadata() == [("authorization", "Bearer x")]
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", (("retry-after", "1"),))
        raise AssertionError("abort returned")

    answer, context = run_rpc("ModelInfer", refused)
    assert answer == ray_grpc.service_pb2.ModelInferResponse()  # the status is the answer
    assert (context.code(), context._details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    assert context.trailing_metadata() == [("retry-after", "1")]  # (Ray adds its request id)


def test_a_stream_answers_until_refused_and_initial_metadata_goes_with_the_trailing():
    async def stream(messages, context):
        await context.send_initial_metadata((("x-total-time", "3"),))
        yield "first"
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input 1 is too long")

    answers, context = run_rpc("EmbedStream", stream)
    assert answers == ["first"] and context.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert context.trailing_metadata() == [("x-total-time", "3")]


def test_the_proxy_binds_the_host_a_local_instance_gives_it(monkeypatch):
    monkeypatch.setattr(default_impl, "add_grpc_address", default_impl.add_grpc_address)
    server = Recorder()
    monkeypatch.delenv(ray_hooks.GRPC_HOST, raising=False)
    ray_hooks.bind_proxy_to_host()  # not told: Ray Serve's own, every interface
    default_impl.add_grpc_address(server, "[::]:9000")
    for host in ("127.0.0.1", "::1"):
        monkeypatch.setenv(ray_hooks.GRPC_HOST, host)
        ray_hooks.bind_proxy_to_host()
        default_impl.add_grpc_address(server, "[::]:9000")
    assert server.ports == ["[::]:9000", "127.0.0.1:9000", "[::1]:9000"]


def test_a_failure_that_set_no_status_is_raised_for_ray_serve_to_answer():
    async def broken(message, context):
        raise NotImplementedError("a bug, not a refusal")

    with pytest.raises(NotImplementedError, match="a bug"):
        run_rpc("ModelInfer", broken)
