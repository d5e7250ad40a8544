"""End to end: the Open Inference Protocol over gRPC
(distilserve/server/routes/oip/grpc_services.py) gives what its HTTP routes give, to
tritonclient's gRPC client and to a plain stub of the protocol's service; errors are
gRPC statuses with the HTTP routes' messages."""

from __future__ import annotations

import json
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests import web
from tests.conftest import running_server, unallocated_port

TEXTS = ["The cat sat on the mat.", "Dogs bark at night in the town of Springfield."]
KEY = {"authorization": "Bearer sekret"}
HEADERS = {"Authorization": "Bearer sekret"}


@pytest.fixture(scope="module")
def server(oip_repository):
    port = unallocated_port()  # (free_port's could be the server's own port 0)
    with running_server(oip_repository, max_inputs=8, api_key="sekret",
                        grpc_port=port) as url:
        yield url, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture
def client(server):
    client = triton.InferenceServerClient(server[1])
    yield client
    client.close()


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server[1]) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def v1(url, route, body):
    res = web.post(url + route, json=body, headers=HEADERS, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def texts(name: str, values: list[str]) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object))
    return tensor


def test_probes_and_metadata_are_the_http_routes(url, client):
    assert client.is_server_live() and client.is_server_ready()  # public, as over HTTP
    assert client.is_model_ready("embed", headers=KEY)
    assert not client.is_model_ready("nope", headers=KEY)
    assert not client.is_model_ready("embed", "2", headers=KEY)  # one version, 1
    http = web.get(url + "/v2", headers=HEADERS).json()
    assert client.get_server_metadata(headers=KEY, as_json=True) == http
    for model in ("embed", "classify", "ner"):
        meta = MessageToDict(client.get_model_metadata(model, headers=KEY),
                             preserving_proto_field_name=True)
        for tensor in meta["inputs"] + meta["outputs"]:  # (JSON's int64s are strings)
            tensor["shape"] = [int(n) for n in tensor["shape"]]
        assert meta == web.get(f"{url}/v2/models/{model}", headers=HEADERS).json()


def test_the_model_configuration_and_the_index_are_the_http_routes(url, client):
    config = client.get_model_config("classify", headers=KEY).config
    http = web.get(url + "/v2/models/classify/config", headers=HEADERS).json()
    assert config.name == "classify" and config.max_batch_size == http["max_batch_size"]
    assert [(t.name, model_dtype(t.data_type), list(t.dims)) for t in config.input] == [
        (t["name"], t["data_type"], t["dims"]) for t in http["input"]]
    assert config.parameters["task"].string_value == "classify"
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 4096
    index = client.get_model_repository_index(headers=KEY, as_json=True)["models"]
    assert [(m["name"], m["state"]) for m in index] == [
        ("broken", "UNAVAILABLE"), ("classify", "READY"), ("embed", "READY"), ("ner", "READY")]
    assert "manifest" in index[0]["reason"]
    ready = client.get_model_repository_index(headers=KEY)  # ready: the served alone
    assert len(ready.models) == 4
    assert [m.name for m in service_pb2_grpc.GRPCInferenceServiceStub(
        client._channel).RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True),
                                         metadata=tuple(KEY.items())).models] == [
        "classify", "embed", "ner"]


def model_dtype(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


def test_each_tasks_outputs_are_the_v1_routes_answers(url, client):
    got = client.infer("embed", [texts("text", TEXTS)], headers=KEY)
    want = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS})["embeddings"]
    np.testing.assert_allclose(got.as_numpy("embedding"), want, atol=1e-6)
    got = client.infer("embed", [texts("text", TEXTS)], headers=KEY,
                       parameters={"dimensions": 8, "normalize": False})
    want = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS, "dimensions": 8,
                                 "normalize": False})["embeddings"]
    np.testing.assert_allclose(got.as_numpy("embedding"), want, atol=1e-6)

    pairs = [[TEXTS[0], TEXTS[1]], [TEXTS[1], TEXTS[0]]]
    got = client.infer("classify", [texts("text", [p[0] for p in pairs]),
                                    texts("text_pair", [p[1] for p in pairs])], headers=KEY)
    results = v1(url, "/v1/classify", {"model": "classify", "inputs": pairs})["results"]
    labels = [entry["label"] for entry in results[0]]
    for row, result in zip(got.as_numpy("scores"), results):
        assert {r["label"]: r["score"] for r in result} == pytest.approx(
            dict(zip(sorted(labels), row.tolist())), abs=1e-6)
    assert [b.decode() for b in got.as_numpy("label")] == [r[0]["label"] for r in results]
    logits = client.infer("classify", [texts("text", TEXTS)], headers=KEY,
                          parameters={"function_to_apply": "none"}).as_numpy("scores")
    raw = v1(url, "/v1/classify", {"model": "classify", "inputs": TEXTS, "raw_scores": True})
    for row, result in zip(logits, raw["results"]):
        assert {r["label"]: r["score"] for r in result} == pytest.approx(
            dict(zip(sorted(labels), row.tolist())), abs=1e-6)
    best = client.infer("classify", [texts("text", TEXTS)], headers=KEY, outputs=[
        triton.InferRequestedOutput("scores", class_count=1)]).as_numpy("scores")
    top = v1(url, "/v1/classify", {"model": "classify", "inputs": TEXTS})["results"]
    assert [b.decode().split(":")[2] for b in best[:, 0]] == [r[0]["label"] for r in top]

    got = client.infer("ner", [texts("text", TEXTS)], headers=KEY,
                       parameters={"aggregation_strategy": "none"})
    want = v1(url, "/v1/ner", {"model": "ner", "inputs": TEXTS,
                               "aggregation_strategy": "none"})["results"]
    assert [json.loads(e) for e in got.as_numpy("entities")] == want


def test_texts_in_contents_are_texts_in_raw_contents(stub):
    raw, plain = (service_pb2.ModelInferRequest(model_name="embed", id="x") for _ in "ab")
    raw.inputs.add(name="text", datatype="BYTES", shape=[2])
    raw.raw_input_contents.append(b"".join(len(t).to_bytes(4, "little") + t.encode()
                                           for t in TEXTS))
    tensor = plain.inputs.add(name="input-0", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    answers = [stub.ModelInfer(r, metadata=tuple(KEY.items())) for r in (raw, plain)]
    assert answers[0].raw_output_contents == answers[1].raw_output_contents
    assert answers[0].id == "x" and answers[0].model_version == "1"
    assert [(o.name, o.datatype, list(o.shape)) for o in answers[0].outputs] == [
        ("embedding", "FP32", [2, 32])]


def test_an_answer_carries_its_timing_as_trailing_metadata(stub):
    request = service_pb2.ModelInferRequest(model_name="embed")
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"hello")
    _, call = stub.ModelInfer.with_call(request, metadata=tuple(KEY.items()))
    trailing = dict(call.trailing_metadata())
    assert int(trailing["x-compute-tokens"]) == 3 and trailing["x-compute-type"] == "cpu"
    assert trailing["server-timing"].startswith("tokenization;dur=")


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def text_request(model="embed", n=2, shape=None, **parameters) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=shape or [n])
    tensor.contents.bytes_contents.extend([b"text"] * n)
    for name, value in parameters.items():
        setattr(request.parameters[name], {int: "int64_param", str: "string_param",
                                           bool: "bool_param"}[type(value)], value)
    return request


@pytest.mark.parametrize("request_, key, code, says", [
    (text_request(), {}, grpc.StatusCode.UNAUTHENTICATED, "API key"),
    (text_request(model="nope"), KEY, grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
    (text_request(n=9), KEY, grpc.StatusCode.INVALID_ARGUMENT, "9 inputs; at most 8"),
    (text_request(shape=[3]), KEY, grpc.StatusCode.INVALID_ARGUMENT, "its shape [3] says 3"),
    (text_request(dimensions="x"), KEY, grpc.StatusCode.INVALID_ARGUMENT,
     "parameters: dimensions"),
    (text_request(dimensions=99), KEY, grpc.StatusCode.INVALID_ARGUMENT,
     "width of model 'embed', 32"),
    (text_request(model="ner", aggregation_strategy="most"), KEY,
     grpc.StatusCode.INVALID_ARGUMENT, "aggregation_strategy"),
])
def test_errors_are_grpc_statuses_with_the_services_messages(stub, request_, key, code, says):
    got, message = status_of(lambda: stub.ModelInfer(request_, metadata=tuple(key.items())))
    assert got == code and says in message, message


def test_raw_contents_must_be_one_for_each_input_and_whole(stub):
    request = text_request()
    request.raw_input_contents.extend([b"\x01\x00\x00\x00a", b"more"])
    code, message = status_of(lambda: stub.ModelInfer(request, metadata=tuple(KEY.items())))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "one for each input" in message
    del request.raw_input_contents[1]
    request.raw_input_contents[0] = b"\x09\x00\x00\x00a"
    code, message = status_of(lambda: stub.ModelInfer(request, metadata=tuple(KEY.items())))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "passes the end" in message
    code, message = status_of(lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(
        name="embed", version="2"), metadata=tuple(KEY.items())))
    assert code == grpc.StatusCode.NOT_FOUND and "one version, 1" in message
    code, _ = status_of(lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(
        name="embed")))
    assert code == grpc.StatusCode.UNAUTHENTICATED  # metadata needs the key, as over HTTP
    code, message = status_of(lambda: stub.RepositoryModelLoad(
        service_pb2.RepositoryModelLoadRequest(model_name="embed"), metadata=tuple(KEY.items())))
    assert code == grpc.StatusCode.INVALID_ARGUMENT  # by default the repository as it is
    assert "DISTILSERVE_MODEL_CONTROL=explicit" in message
    code, message = status_of(lambda: stub.SystemSharedMemoryRegister(
        service_pb2.SystemSharedMemoryRegisterRequest(), metadata=tuple(KEY.items())))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "shared memory" in message


def test_a_stream_answers_each_request_by_its_id_an_error_in_its_answer(url, client):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)),
                        headers=KEY)
    try:
        for i in range(6):
            client.async_stream_infer("embed", [texts("text", TEXTS * (5 if i == 3 else 1))],
                                      request_id=str(i))
        got = [answers.get(timeout=120) for _ in range(6)]
    finally:
        client.stop_stream()
    want = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS})["embeddings"]
    by_id = {r.get_response().id: r.as_numpy("embedding") for r, error in got if error is None}
    assert sorted(by_id) == ["0", "1", "2", "4", "5"]
    for vectors in by_id.values():
        np.testing.assert_allclose(vectors, want, atol=1e-6)
    (error,) = [e for _, e in got if e is not None]
    assert "10 inputs; at most 8" in error.message()


def test_statistics_and_metrics_count_the_grpc_calls(url, client):
    def count():
        stats = client.get_inference_statistics("ner", headers=KEY).model_stats[0]
        return stats.inference_stats.success.count, stats.inference_count

    before = count()
    client.infer("ner", [texts("text", TEXTS)], headers=KEY)
    assert count() == (before[0] + 1, before[1] + 2)
    with pytest.raises(InferenceServerException):
        client.infer("nope", [texts("text", TEXTS)], headers=KEY)
    metrics = web.get(url + "/metrics", headers=HEADERS).text
    route = "/inference.GRPCInferenceService/ModelInfer"
    assert f'distilserve_requests_total{{route="{route}",status="200"}}' in metrics
    assert f'distilserve_requests_total{{route="{route}",status="404"}}' in metrics
    everything = client.get_inference_statistics(headers=KEY).model_stats
    assert [s.name for s in everything] == ["classify", "embed", "ner"]
