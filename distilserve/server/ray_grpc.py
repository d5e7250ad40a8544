"""gRPC on Ray Serve: the services of the gRPC port (distilserve/server/routes/grpc_server.py) through
Ray Serve's own gRPC proxy, which forwards each call to the ingress deployment's method
of the call's name.

- ``add_servicers``, named in Ray Serve's ``grpc_options.grpc_servicer_functions``
  (``distilserve ray --grpc-port`` does so; a Serve config names it), gives the proxy the
  services: the Open Inference Protocol's, TEI's tei.v1 and grpc.health.v1's Health.
- ``GrpcIngress`` is the ingress with a method for each of their RPCs (their names are
  unique across the services), each running the servicer that ``distilserve serve``'s
  gRPC port runs, on the ingress's app: the same models, tensors, API key, limits, errors
  and metrics. Ray Serve's context stands in for grpc's (RayContext).
- Ray Serve's proxy listens for gRPC on every interface; on a local instance
  (``init_local``), on the HTTP host alone (distilserve/server/ray_hooks.py).

Streams run as on the gRPC port (Ray Serve carries client, server and bidirectional
streams). Ray Serve's proxy answers its own probes (``ray.serve.RayServeAPIService``) and
server reflection.
"""

from __future__ import annotations

import sys

import grpc
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from distilserve.server.ray_deployments import Ingress
from distilserve.server.routes.grpc_server import Health
from distilserve.server.routes.oip import grpc_services as oip_grpc
from distilserve.server.routes.tei import grpc_services as tei_grpc

# Ray Serve pickles a call's message between the proxy and the ingress, by its class's
# module, and tritonclient's messages name theirs as generated: "grpc_service_pb2" (tei.v1's
# "tei_pb2" is imported so by distilserve/server/routes/tei/grpc_services.py)
sys.modules.setdefault("grpc_service_pb2", service_pb2)
sys.modules.setdefault("model_config_pb2", model_config_pb2)

# the services: (add the servicer to a server, the servicer's class, its descriptor)
SERVICES = [
    (service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, oip_grpc.Inference,
     service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]),
    *((tei_grpc.adder(made), made, tei_grpc.pb.DESCRIPTOR.services_by_name[made.__name__])
      for made in tei_grpc.SERVICERS),
    (health_pb2_grpc.add_HealthServicer_to_server, Health,
     health_pb2.DESCRIPTOR.services_by_name["Health"]),
]
# the services whose health Health says (all but itself)
CHECKED = [d.full_name for _, made, d in SERVICES if made is not Health]


def add_servicers(servicer, server) -> None:
    """Ray Serve's servicer function (``distilserve.server.ray_grpc.add_servicers``): every service
    above, added to the proxy's ``server`` (``servicer``: Ray Serve's stand-in, whose
    methods it replaces by its forwarding to the ingress)."""
    for add, _, _ in SERVICES:
        add(servicer, server)


class Aborted(Exception):
    """A call ended with a status (RayContext.abort); Ray Serve sends the status set."""


class RayContext:
    """What the servicers use of grpc.aio's ServicerContext, on Ray Serve's
    RayServegRPCContext, which the proxy applies to the call once the method returns."""

    def __init__(self, context):
        self.context = context

    def invocation_metadata(self):
        return self.context.invocation_metadata()

    # set_code and set_details: what the generated servicers' UNIMPLEMENTED methods call
    def set_code(self, code: grpc.StatusCode) -> None:
        self.context.set_code(code)

    def set_details(self, details: str) -> None:
        self.context.set_details(details)

    def set_trailing_metadata(self, metadata) -> None:
        """Added to what was set before (initial metadata included), not in its place."""
        kept = [(k, v) for k, v in self.context.trailing_metadata() if k != "request_id"]
        self.context.set_trailing_metadata(kept + list(metadata))

    async def send_initial_metadata(self, metadata) -> None:
        """Ray Serve's proxy sends no initial metadata: it goes with the trailing."""
        self.set_trailing_metadata(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        self.context.set_code(code)
        self.context.set_details(details)
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        raise Aborted(details)


def _rpc(method):
    """The ingress's method for the RPC ``method`` (its descriptor): the servicer's, on Ray
    Serve's context (``grpc_context``, which Ray Serve passes by that name). A call ended
    with a status (an ApiError's, or the UNIMPLEMENTED of a method the servicer leaves to
    its generated base) returns, its status set, rather than raising: Ray Serve would log
    each refusal as a failure, twice, with its traceback."""
    name, empty = method.name, message_factory.GetMessageClass(method.output_type)
    if method.server_streaming:
        async def rpc(self, request, grpc_context):
            try:
                async for answer in self.servicer(name)(request, RayContext(grpc_context)):
                    yield answer
            except (Aborted, NotImplementedError):
                if not grpc_context.code():
                    raise
    else:
        async def rpc(self, request, grpc_context):
            try:
                return await self.servicer(name)(request, RayContext(grpc_context))
            except (Aborted, NotImplementedError):
                if not grpc_context.code():
                    raise
                return empty()  # (the client raises the status set, not this)
    rpc.__name__ = rpc.__qualname__ = name
    return rpc


class GrpcIngress(Ingress):
    """The ingress (distilserve/server/ray_serve.py's), taking the gRPC calls Ray Serve's proxy
    forwards too."""

    def servicer(self, name: str):
        """The bound method of the RPC ``name``, its servicer made on the first call."""
        servicers = getattr(self, "servicers", None)
        if servicers is None:
            app, key = self.fastapi_app, self.settings.bearer_key()
            servicers = self.servicers = {}
            for _, made, descriptor in SERVICES:
                one = Health(app, CHECKED) if made is Health else made(app, key)
                servicers.update((m.name, getattr(one, m.name)) for m in descriptor.methods)
        return servicers[name]


for _, _, _descriptor in SERVICES:
    for _method in _descriptor.methods:
        # (a name unique across the services, and not one the ingress has already)
        assert not hasattr(GrpcIngress, _method.name), _method.name
        setattr(GrpcIngress, _method.name, _rpc(_method))

