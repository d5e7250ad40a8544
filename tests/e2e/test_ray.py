"""distilserve/server/ray_serve.py on a local Ray instance (127.0.0.1): the same answers as
`distilserve serve`, over HTTP and over gRPC (distilserve/server/ray_grpc.py), two replicas of a
model, and one of them killed under load."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import grpc
import httpx
import numpy as np
import pytest

from distilserve.models.io import checkpoint
from distilserve.server.ray_serve import GRPC_SERVICERS, Scaling, application, init_local, servable
from distilserve.server.settings import Settings
from tests import web
from tests.conftest import running_server, unallocated_port, wait_for

pytestmark = pytest.mark.slow  # a local Ray instance

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def repository(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ray-repo")
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    exports(tiny_checkpoints["minialbert", "ner"], repo / "ner", "onnx", check=False)
    mlm = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), repo.parent / "mlm")
    exports(mlm, repo / "mlm", "onnx", task="fill-mask", check=False)  # its replicas decode
    (repo / "broken").mkdir()  # no manifest: left out, as `distilserve serve` does
    return repo


@pytest.fixture(scope="module")
def ray_serve(repository):
    """Ray Serve's HTTP URL and gRPC address."""
    # Ray starts its workers at nice 15 (to yield to its own GCS and raylet): beside other
    # work at nice 0 they crawl (a replica took 230 s to start beside two busy loops);
    # this test's workers share the CPU as its server in this process does
    init_local(num_cpus=3, include_dashboard=False, object_store_memory=100 * 2**20,
               log_to_driver=False, _system_config={"worker_niceness": 0})
    try:
        port, grpc_port = unallocated_port(), unallocated_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port}, grpc_options={
            "port": grpc_port, "grpc_servicer_functions": GRPC_SERVICERS})
        # two replicas of each model (half a CPU each, of the three Ray is told of: this
        # machine has two), one thread; a batch waits up to 100 ms for company, so
        # requests are in flight on a replica most of the time (when one is killed)
        settings = Settings(threads=1, max_wait_ms=100)
        serve.run(application(servable(repository), settings, Scaling(replicas=2, replica_cpus=0.5)),
                  name="distilserve", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: web.get(url + "/ready", timeout=10).status_code == 200,
                 "the Ray Serve application to be ready")
        yield url, f"127.0.0.1:{grpc_port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_url(ray_serve):
    return ray_serve[0]


TEXTS = ["Ray serves this sentence.", "Kenji Tanaka visited Osaka with Volkswagen."]
FILL_MASK = ("/v1/fill-mask", {"model": "mlm", "inputs": ["Ray serves [MASK].",
                                                         "[MASK] visited [MASK]."]})
REQUESTS = [("/v1/embed", {"model": "embed", "inputs": TEXTS}),
            ("/v1/embeddings", {"model": "embed", "input": TEXTS[0], "dimensions": 8}),
            ("/v1/rerank", {"model": "embed", "query": "q", "documents": TEXTS}),
            ("/v1/tokenize", {"model": "ner", "inputs": TEXTS}),
            ("/v1/ner", {"model": "ner", "inputs": TEXTS, "aggregation_strategy": "none"}),
            ("/v2/models/ner/infer", {"inputs": [{"name": "text", "datatype": "BYTES",
                                                  "shape": [2], "data": TEXTS}]}),
            FILL_MASK,
            # the same errors
            ("/v1/embed", {"model": "nope", "inputs": "x"}),
            ("/v1/embed", {"model": "ner", "inputs": "x"}),
            ("/v1/embed", {"model": "embed", "inputs": "word " * 600, "truncate": False}),
            ("/v1/embed", {"model": "embed", "inputs": "x", "truncate": 0})]


def test_ray_serve_answers_as_distilserve_serve_does(ray_url, repository):
    with running_server(repository) as url:
        for route, body in REQUESTS:
            direct = web.post(url + route, json=body, timeout=60)
            on_ray = web.post(ray_url + route, json=body, timeout=60)
            assert on_ray.status_code == direct.status_code, (route, body, on_ray.text)
            assert on_ray.status_code == 200 or route != FILL_MASK[0], on_ray.text
            if direct.status_code == 200 and route in ("/v1/embed", "/v1/embeddings"):
                key = "embeddings" if route == "/v1/embed" else "data"
                a, b = direct.json()[key], on_ray.json()[key]
                if key == "data":
                    a, b = [d["embedding"] for d in a], [d["embedding"] for d in b]
                assert np.allclose(a, b, atol=1e-5)
            elif route == "/v1/rerank":
                assert [r["index"] for r in direct.json()["results"]] == [
                    r["index"] for r in on_ray.json()["results"]]
            else:
                assert on_ray.json() == direct.json(), route
        direct_models = web.get(url + "/v1/models").json()["data"]
        assert web.get(ray_url + "/v1/models").json()["data"] == direct_models
        for path in ("/v2/models/embed", "/v2/models/ner/ready"):  # the Open Inference Protocol's
            assert web.get(ray_url + path).json() == web.get(url + path).json(), path
        # Triton's statistics: the ingress counts the requests as one process does (the
        # batches are the replicas')
        for name in ("embed", "ner"):
            counts = [{k: v["count"] for k, v in web.get(
                f"{base}/v2/models/{name}/stats").json()["model_stats"][0][
                "inference_stats"].items()} for base in (url, ray_url)]
            assert counts[0] == counts[1] and counts[0]["success"] >= 2, (name, counts)
    assert web.get(ray_url + "/ready").json()["models"] == ["embed", "mlm", "ner"]


def test_ray_serve_answers_grpc_as_the_grpc_port_does(ray_serve, repository):
    import psutil
    import tritonclient.grpc as triton
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from distilserve.server.routes.tei.grpc_services import pb, pb_grpc

    def texts(values):
        tensor = triton.InferInput("text", [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array(values, dtype=object))
        return tensor

    def streamed(client, requests):  # tritonclient's ModelStreamInfer: {id: output or error}
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for model, values, request_id in requests:
            client.async_stream_infer(model, [texts(values)], request_id=request_id)
        got = [answers.get(timeout=60) for _ in requests]
        client.stop_stream()
        return {"error" if error else result.get_response().id:
                str(error) if error else result.as_numpy("embedding").shape
                for result, error in got}

    def answers(address):
        client, channel = triton.InferenceServerClient(address), grpc.insecure_channel(address)
        embedded = client.infer("embed", [texts(TEXTS)])
        try:
            client.infer("nope", [texts(TEXTS)])
        except triton.InferenceServerException as e:
            refused = e.status(), e.message()
        embed = pb_grpc.EmbedStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope"))
        ranks = pb_grpc.RerankStub(channel).RerankStream(iter(
            [pb.RerankStreamRequest(query="q", text=t, return_text=True) for t in TEXTS]))
        answer = {
            "embedding": embedded.as_numpy("embedding"),
            "entities": client.infer("ner", [texts(TEXTS)]).as_numpy("entities").tolist(),
            "refused": refused,
            "stream": streamed(client, [("embed", TEXTS[:1], "1"), ("nope", TEXTS, "2")]),
            "tei": np.array(embed.Embed(pb.EmbedRequest(inputs=TEXTS[0])).embeddings),
            "tei stream": [len(a.embeddings) for a in embed.EmbedStream(iter(
                [pb.EmbedRequest(inputs=t) for t in TEXTS]))],
            "rerank": [(r.index, r.text) for r in ranks.ranks],
            "rerank scores": np.array([r.score for r in ranks.ranks]),
            "health": health.Check(health_pb2.HealthCheckRequest(service="")).status,
            "unknown": unknown.value.code()}
        _, call = embed.Embed.with_call(pb.EmbedRequest(inputs=TEXTS[0]))
        answer["timing"] = {k for k, _ in (*call.initial_metadata(), *call.trailing_metadata())
                            if k.startswith("x-")}
        client.close()
        channel.close()
        return answer

    on_ray = answers(ray_serve[1])
    port = unallocated_port()
    with running_server(repository, grpc_port=port):
        direct = answers(f"127.0.0.1:{port}")
    for key in ("embedding", "tei", "rerank scores"):
        assert np.allclose(on_ray.pop(key), direct.pop(key), atol=1e-5), key
    assert on_ray == direct
    assert direct["refused"][0] == "StatusCode.NOT_FOUND" and "x-total-time" in direct["timing"]
    assert direct["stream"]["1"][0] == 1 and "unknown model 'nope'" in direct["stream"]["error"]
    # Ray Serve's gRPC proxy listens on the loopback interface alone (distilserve/server/ray_hooks.py)
    grpc_port = int(ray_serve[1].rpartition(":")[2])
    listening = {c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == grpc_port}
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def replica_pids(deployment: str) -> set[int]:
    handle = serve.get_deployment_handle(deployment, app_name="distilserve")
    return {handle.pid.remote().result(timeout_s=60) for _ in range(16)}


def test_a_replica_killed_under_load_loses_no_request_and_comes_back(ray_url):
    pids = wait_for(lambda: len(p := replica_pids("embed")) == 2 and p, "two replicas")
    outcomes, stop = [], threading.Event()

    def client():
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                codes = []
                for _ in range(20):  # a client that retries on 503, as DistilServeClient does
                    r = http.post(ray_url + "/v1/embed", json={"model": "embed",
                                                               "inputs": TEXTS})
                    codes.append(r.status_code)
                    if r.status_code != 503:
                        break
                    time.sleep(float(r.headers.get("retry-after", "1")) / 4)
                outcomes.append(codes)

    clients = [threading.Thread(target=client) for _ in range(6)]
    for c in clients:
        c.start()
    time.sleep(2)
    victim = sorted(pids)[0]
    os.kill(victim, signal.SIGKILL)  # a replica crashes mid-load
    time.sleep(4)
    stop.set()
    for c in clients:
        c.join(120)
    assert outcomes and not any(c.is_alive() for c in clients)  # nothing hung
    retried = sum(len(codes) > 1 for codes in outcomes)
    print(f"{len(outcomes)} requests, {retried} answered 503 first, then 200 on a retry")
    assert all(codes[-1] == 200 for codes in outcomes), [c for c in outcomes if c[-1] != 200]
    assert all(set(codes[:-1]) <= {503} for codes in outcomes)  # only 503s before a 200
    # Ray Serve replaces the dead replica
    back = wait_for(lambda: len(p := replica_pids("embed")) == 2 and victim not in p and p,
                    "the replica to be replaced")
    assert len(back - pids) == 1
