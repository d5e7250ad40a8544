"""distilserve/server/ray_serve.py and ray_deployments.py without a Ray instance: what a
replica's failures become, and the deployment options a Scaling gives."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from distilserve.server.engine import InputTooLong, ModelUnavailable, QueueFull, load_engine
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings

ray_serve = pytest.importorskip("distilserve.server.ray_serve")
ray_deployments = pytest.importorskip("distilserve.server.ray_deployments")
exceptions = pytest.importorskip("ray.exceptions")


class FakeHandle:
    """A DeploymentHandle whose ``infer.remote`` raises what a replica would."""

    def __init__(self, error: BaseException):
        self.infer = self
        self.error = error

    def remote(self, *args):
        async def fail():
            raise self.error
        return fail()


@pytest.fixture(scope="module")
def folder(exports, tiny_checkpoints, tmp_path_factory):
    target = tmp_path_factory.mktemp("ray-unit") / "embed"
    exports(tiny_checkpoints["bert", "embed"], target, "onnx", check=False)
    return target


def remote(folder, error):
    return ray_deployments.remote_engine(folder, Settings(), Metrics(), FakeHandle(error),
                                         REPLICA, (32, 512))


# what a replica's engine says of where and how it runs (ModelReplica.describe)
REPLICA = {"backend": "onnx", "device": "cuda:0", "dtype": "fp16", "dtype_reason": "asked"}


@pytest.mark.parametrize("cause", [QueueFull("3 inputs queued, limit 2"),
                                   InputTooLong(0, 600, 256)])
def test_an_error_the_replica_raised_is_raised_as_itself(folder, cause):
    wrapped = exceptions.RayTaskError("run", "Traceback ...", cause)
    with pytest.raises(type(cause)) as raised:
        asyncio.run(remote(folder, wrapped).infer(["x"], "right"))
    assert str(raised.value) == str(cause)  # no Ray traceback in the client's message


def test_a_dead_replica_is_model_unavailable(folder):
    with pytest.raises(ModelUnavailable, match="replica is gone"):
        asyncio.run(remote(folder, exceptions.ActorDiedError()).infer(["x"], "right"))


def test_the_remote_engine_validates_as_a_local_one_does(folder):
    engine = remote(folder, RuntimeError("never called"))
    assert engine.task == "embed" and engine.text.vocab_size > 1000
    described = engine.describe()  # the card here; where and how it runs, the replica's
    assert (described["id"], described["task"]) == ("embed", "embed")
    assert {k: described[k] for k in REPLICA} == REPLICA
    assert not hasattr(engine.runner, "batcher")  # no backend here: the replicas have it


def test_a_replica_uses_the_cpus_ray_reserves_for_it_unless_told_otherwise():
    two = ray_serve.Scaling(replica_cpus=2)
    assert two.replica_settings(Settings()).threads == 2
    assert ray_serve.Scaling(replica_cpus=0.5).replica_settings(Settings()).threads == 1
    assert two.replica_settings(Settings(threads=3)).threads == 3


def test_a_shortfall_is_what_the_first_replicas_reserve_past_what_ray_has():
    assert ray_serve.Scaling(replica_cpus=0.5).shortfall(4, {"CPU": 2.0}) is None
    reserved, fits = ray_serve.Scaling(replicas=2).shortfall(3, {"CPU": 4.0})
    assert reserved == ("the replicas reserve 6 CPUs (3 models, 2 replicas each, 1 CPU a "
                        "replica) and Ray has 4")
    assert fits == "--replica-cpus 0.66 fits them, or fewer replicas"
    # GPUs where Ray has none; autoscaling starts at its minimum
    reserved, fits = ray_serve.Scaling(replica_gpus=1).shortfall(1, {"CPU": 8.0})
    assert reserved.endswith("reserve 1 GPU (1 model, 1 replica each, 1 GPU a replica) "
                             "and Ray has 0") and fits == "--replica-gpus 0 fits them"
    autoscaled = ray_serve.Scaling(min_replicas=0, max_replicas=8)
    assert autoscaled.shortfall(3, {"CPU": 1.0}) is None


def test_scaling_options():
    fixed = ray_serve.Scaling(replicas=3, replica_gpus=0.5).options()
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"]["num_gpus"] == 0.5
    auto = ray_serve.Scaling(min_replicas=1, max_replicas=4, target_ongoing=16).options()
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                          "target_ongoing_requests": 16}
    with pytest.raises(ValueError, match="both"):
        ray_serve.Scaling(max_replicas=4)


def test_a_local_instance_gives_the_proxy_a_minute_to_start_and_its_grpc_a_host(monkeypatch):
    calls = []
    monkeypatch.setattr(ray_serve.ray, "init", lambda **options: calls.append(options))
    monkeypatch.delenv(ray_serve.PROXY_READY_CHECK_TIMEOUT, raising=False)
    ray_serve.init_local(num_cpus=2)
    monkeypatch.setenv(ray_serve.PROXY_READY_CHECK_TIMEOUT, "300")
    ray_serve.init_local(grpc_host="0.0.0.0")
    # the proxy's start, and the host its gRPC binds (distilserve/server/ray_hooks.py: the HTTP host)
    assert [c["runtime_env"]["env_vars"] for c in calls] == [
        {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "DISTILSERVE_RAY_GRPC_HOST": "127.0.0.1"},
        {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "300", "DISTILSERVE_RAY_GRPC_HOST": "0.0.0.0"}]
    assert all(c["runtime_env"]["worker_process_setup_hook"]
               == "distilserve.server.ray_hooks.bind_proxy_to_host" for c in calls)
    assert all(c["_node_ip_address"] == "127.0.0.1" for c in calls)
    assert calls[0]["num_cpus"] == 2


class LocalHandle:
    """A DeploymentHandle whose replica is an engine here, its answers pickled as Ray's."""

    def __init__(self, engine):
        self.infer, self.engine = self, engine

    def remote(self, *args):
        async def run():
            return pickle.loads(pickle.dumps(await self.engine.infer(*args)))
        return run()


def test_question_answering_makes_its_windows_on_the_replica(exports, tmp_path):
    from distilserve.models.io import checkpoint

    squad = tmp_path / "squad"
    exports(checkpoint.save(checkpoint.new("bert", "tiny", "qa"), tmp_path / "ck"),
            squad, "onnx")
    replica = load_engine("squad", squad, Settings(threads=1), Metrics())
    engine = ray_deployments.remote_engine(squad, Settings(threads=4), Metrics(),
                                          LocalHandle(replica), replica.describe(),
                                          replica.batch_limits)
    # the ingress reports (TEI's /info, Triton's config) the limits the replica batches at,
    # not its own settings'
    assert engine.batch_limits == replica.batch_limits == (32, 512)
    assert Settings(threads=4).batch_limits("cpu") == (32, 2048)
    pairs = [("Where?", "word " * 60)]

    async def go():
        await replica.start(warmup=False)
        try:
            return await engine.infer(pairs, None, (24, 4))
        finally:
            await replica.stop()

    (windows,) = asyncio.run(go()).outputs
    assert [e.ids for _, e in windows] == [w.ids for w in engine.text.windows(pairs, 24, 4)[0]]


def test_ray_serves_proxy_labels_each_request_with_its_routes_path():
    """Ray Serve's HTTP proxy labels its metrics with the route a request matches, in a
    Starlette app of the ingress's route paths that it builds without distilserve's code:
    a path with a converter of distilserve's own would fail that app (every request then
    labelled "/")."""
    import re

    from ray.serve._private.thirdparty.get_asgi_route_name import (
        extract_route_patterns,
        get_asgi_route_name,
    )
    from starlette.applications import Starlette
    from starlette.routing import Route

    from distilserve.server.app import create_app

    patterns = extract_route_patterns(create_app(Settings()))
    converters = {c for p in patterns for c in re.findall(r"{\w+:(\w+)}", p.path)}
    assert converters <= {"str", "path", "int", "float", "uuid"}  # Starlette's own

    async def nothing(request):
        pass

    app = Starlette(routes=[Route(p.path, nothing, methods=p.methods) for p in patterns])
    for method, path, route in (
            ("POST", "/v1/embeddings", "/v1/embeddings"),
            ("GET", "/v1/models/owner/name", "/v1/models/{model_id:path}"),
            ("POST", "/v2/models/m/versions/1/infer",
             "/v2/models/{model_name}/versions/{model_version}/infer")):
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        assert get_asgi_route_name(app, scope) == route
