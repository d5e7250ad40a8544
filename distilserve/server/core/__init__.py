"""The service's core: what serving a model means, said without a transport. It takes and
returns plain Python values and raises ``Refusal``s; the HTTP routes, the gRPC services
and Ray's deployments each map those to their wire once. Nothing here imports fastapi,
starlette, grpc or ray (tests/test_layers.py checks)."""
