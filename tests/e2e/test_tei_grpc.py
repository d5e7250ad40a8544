"""End to end: Text Embeddings Inference's gRPC API
(distilserve/server/routes/tei/grpc_services.py) gives what TEI's HTTP routes give,
through stubs generated from tei.proto; the gRPC port's health checks and reflection
(distilserve/server/routes/grpc_server.py)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from distilserve.models.io import checkpoint
from distilserve.server.routes.tei.grpc_services import SERVING, pb, pb_grpc
from tests import web
from tests.conftest import running_server, unallocated_port

HEADERS = {"Authorization": "Bearer sekret"}
TEXTS = ["The cat sat on the mat.", "Dogs bark at night in the town of Springfield.",
         "A third, much shorter one."]


def key(model: str | None = None) -> tuple:
    return (("authorization", "Bearer sekret"), *((("model", model),) if model else ()))


@pytest.fixture(scope="module")
def server(exports, tiny_checkpoints, splade_checkpoint, tmp_path_factory):
    """An embedding model that gives its token vectors too, a SPLADE model and a
    cross-encoder (the one classifier, and the one that reranks unnamed)."""
    repo = tmp_path_factory.mktemp("tei-grpc")
    exports(tiny_checkpoints["bert", "embed"], repo / "embedder", "onnx",
            token_embeddings=True, check=False)
    exports(splade_checkpoint, repo / "splade", "onnx", check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cross-checkpoint")
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    port = unallocated_port()
    with running_server(repo, max_inputs=8, api_key="sekret", grpc_port=port) as url:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield url, channel


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def channel(server):
    return server[1]


def post(url, route, body):
    res = web.post(url + route, json=body, headers=HEADERS, timeout=60)
    assert res.status_code == 200, (route, res.text)
    return res.json()


def refused(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kwargs)
    return e.value


def test_embed_gives_embeds_embeddings_with_teis_metadata(url, channel):
    stub = pb_grpc.EmbedStub(channel)
    for normalize in (True, False):
        expected = post(url, "/embed", {"model": "embedder", "inputs": TEXTS[0],
                                        "normalize": normalize})[0]
        answer, call = stub.Embed.with_call(pb.EmbedRequest(inputs=TEXTS[0],
                                                            normalize=normalize),
                                            metadata=key("embedder"))
        np.testing.assert_allclose(answer.embeddings, expected, atol=1e-6)
    tokens = len(post(url, "/tokenize", {"model": "embedder", "inputs": TEXTS[0]})[0])
    assert (answer.metadata.compute_chars, answer.metadata.compute_tokens) == (len(TEXTS[0]),
                                                                               tokens)
    assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0
    sent = dict(call.initial_metadata())  # TEI's headers, as TEI's gRPC server sends them
    assert sent["x-compute-tokens"] == str(tokens) and "x-total-time" in sent
    zipped = stub.Embed(pb.EmbedRequest(inputs=TEXTS[0]), metadata=key("embedder"),
                        compression=grpc.Compression.Gzip)  # a request sent compressed
    np.testing.assert_allclose(zipped.embeddings, answer.embeddings, atol=1e-6)
    # left: the start is cut, so the text's end decides (a long text over 128 tokens)
    long = " ".join(["alpha"] * 100 + ["omega"] * 100)
    ends = {d: np.array(stub.Embed(pb.EmbedRequest(inputs=long, truncation_direction=d),
                                   metadata=key("embedder")).embeddings)
            for d in (pb.TRUNCATION_DIRECTION_RIGHT, pb.TRUNCATION_DIRECTION_LEFT)}
    for d, direction in ((pb.TRUNCATION_DIRECTION_RIGHT, "right"),
                         (pb.TRUNCATION_DIRECTION_LEFT, "left")):
        np.testing.assert_allclose(ends[d], post(url, "/embed", {
            "model": "embedder", "inputs": long, "normalize": False,
            "truncation_direction": direction})[0], atol=1e-6)
    assert not np.allclose(*ends.values())


def test_a_stream_is_answered_in_the_order_sent(url, channel):
    stub = pb_grpc.EmbedStub(channel)
    expected = post(url, "/embed", {"model": "embedder", "inputs": TEXTS * 2,
                                    "normalize": False})
    answers = list(stub.EmbedStream(iter([pb.EmbedRequest(inputs=t) for t in TEXTS * 2]),
                                    metadata=key("embedder")))
    assert len(answers) == 6
    for answer, vector in zip(answers, expected):
        np.testing.assert_allclose(answer.embeddings, vector, atol=1e-6)
    # a refused message ends the stream with its status, the ones before it answered
    stream = stub.EmbedStream(iter([pb.EmbedRequest(inputs=TEXTS[0]),
                                    pb.EmbedRequest(inputs="x" * 20_001)]),
                              metadata=key("embedder"))
    first = next(stream)
    np.testing.assert_allclose(first.embeddings, expected[0], atol=1e-6)
    error = refused(next, stream)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "DISTILSERVE_MAX_INPUT_CHARS" in error.details()


def test_sparse_and_token_embeddings_are_embed_sparses_and_embed_alls(url, channel):
    stub = pb_grpc.EmbedStub(channel)
    sparse = stub.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[1]), metadata=key())
    expected = post(url, "/embed_sparse", {"inputs": TEXTS[1]})[0]  # the one SPLADE model
    assert [v.index for v in sparse.sparse_embeddings] == [v["index"] for v in expected]
    np.testing.assert_allclose([v.value for v in sparse.sparse_embeddings],
                               [v["value"] for v in expected], rtol=1e-6)
    every = stub.EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[1]), metadata=key())
    expected = post(url, "/embed_all", {"inputs": TEXTS[1]})[0]  # the one that gives them
    np.testing.assert_allclose([t.embeddings for t in every.token_embeddings], expected,
                               atol=1e-6)
    answers = list(stub.EmbedAllStream(iter([pb.EmbedAllRequest(inputs=t) for t in TEXTS]),
                                       metadata=key()))
    assert [len(a.token_embeddings) for a in answers] == [
        len(v) for v in post(url, "/embed_all", {"inputs": TEXTS})]


def test_predict_and_predict_pair_are_predicts(url, channel):
    stub = pb_grpc.PredictStub(channel)
    for raw_scores in (False, True):
        answer = stub.Predict(pb.PredictRequest(inputs=TEXTS[0], raw_scores=raw_scores),
                              metadata=key())
        expected = post(url, "/predict", {"inputs": TEXTS[0], "raw_scores": raw_scores})
        assert [p.label for p in answer.predictions] == [s["label"] for s in expected]
        np.testing.assert_allclose([p.score for p in answer.predictions],
                                   [s["score"] for s in expected], rtol=1e-6)
    pair = stub.PredictPair(pb.PredictPairRequest(inputs=TEXTS[:2]), metadata=key())
    expected = post(url, "/predict", {"inputs": TEXTS[:2]})
    np.testing.assert_allclose([p.score for p in pair.predictions],
                               [s["score"] for s in expected], rtol=1e-6)
    one = stub.PredictPair(pb.PredictPairRequest(inputs=TEXTS[:1]), metadata=key())
    assert one.predictions[0].score == pytest.approx(
        post(url, "/predict", {"inputs": TEXTS[0]})[0]["score"], rel=1e-6)
    error = refused(stub.PredictPair, pb.PredictPairRequest(inputs=TEXTS), metadata=key())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not 3" in error.details()
    answers = list(stub.PredictPairStream(iter([pb.PredictPairRequest(inputs=TEXTS[:2]),
                                                pb.PredictPairRequest(inputs=TEXTS[:1])]),
                                          metadata=key()))
    assert [a.predictions[0].score for a in answers] == [pair.predictions[0].score,
                                                         one.predictions[0].score]


def test_rerank_and_a_rerank_stream_are_reranks(url, channel):
    stub = pb_grpc.RerankStub(channel)
    query, texts = "Where do cats sit?", TEXTS
    answer = stub.Rerank(pb.RerankRequest(query=query, texts=texts, return_text=True),
                         metadata=key())
    expected = post(url, "/rerank", {"query": query, "texts": texts, "return_text": True})
    assert [(r.index, r.text) for r in answer.ranks] == [(r["index"], r["text"])
                                                        for r in expected]
    np.testing.assert_allclose([r.score for r in answer.ranks],
                               [r["score"] for r in expected], rtol=1e-6)
    assert answer.metadata.compute_tokens > 0
    # a stream of (query, text) pairs: each query's texts scored as /rerank scores them
    other = "Which animals bark?"
    sent = [(query, texts[0]), (other, texts[1]), (query, texts[2]), (other, texts[0])]
    streamed = stub.RerankStream(iter([pb.RerankStreamRequest(query=q, text=t)
                                       for q, t in sent]), metadata=key("embedder"))
    scores = {r.index: r.score for r in streamed.ranks}
    assert [r.score for r in streamed.ranks] == sorted(scores.values(), reverse=True)
    assert not streamed.ranks[0].HasField("text")  # the first message's return_text
    for q in (query, other):
        indices = [i for i, (each, _) in enumerate(sent) if each == q]
        alone = post(url, "/rerank", {"model": "embedder", "query": q,
                                      "texts": [sent[i][1] for i in indices]})
        for r in alone:
            assert scores[indices[r["index"]]] == pytest.approx(r["score"], rel=1e-5)
    error = refused(stub.RerankStream, iter([]), metadata=key())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_tokenize_and_decode_are_tokenizes_and_decodes(url, channel):
    stub = pb_grpc.TokenizeStub(channel)
    answer = stub.Tokenize(pb.EncodeRequest(inputs=TEXTS[0], add_special_tokens=True),
                           metadata=key("embedder"))
    expected = post(url, "/tokenize", {"model": "embedder", "inputs": TEXTS[0]})[0]
    assert [{"id": t.id, "text": t.text, "special": t.special,
             "start": t.start if t.HasField("start") else None,
             "stop": t.stop if t.HasField("stop") else None} for t in answer.tokens] == [
        {k: e[k] for k in ("id", "text", "special", "start", "stop")} for e in expected]
    ids = [t.id for t in answer.tokens]
    text = stub.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True),
                       metadata=key("embedder")).text
    assert text == post(url, "/decode", {"model": "embedder", "ids": ids})[0]
    streamed = list(stub.DecodeStream(iter([pb.DecodeRequest(ids=ids[:3]),
                                            pb.DecodeRequest(ids=ids)]),
                                      metadata=key("embedder")))
    assert [d.text for d in streamed] == post(url, "/decode", {
        "model": "embedder", "ids": [ids[:3], ids], "skip_special_tokens": False})
    error = refused(stub.Tokenize, pb.EncodeRequest(inputs="x", prompt_name="query"),
                    metadata=key("embedder"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "no prompts" in error.details()


def test_info_is_infos(url, channel):
    stub = pb_grpc.InfoStub(channel)
    for model, kind in (("embedder", pb.MODEL_TYPE_EMBEDDING),
                        ("cross", pb.MODEL_TYPE_RERANKER)):
        answer = stub.Info(pb.InfoRequest(), metadata=key(model))
        http = web.get(f"{url}/info?model={model}", headers=HEADERS).json()
        assert answer.model_type == kind
        assert (answer.model_id, answer.model_dtype, answer.max_input_length,
                answer.max_client_batch_size, answer.max_batch_tokens) == (
            http["model_id"], http["model_dtype"], http["max_input_length"],
            http["max_client_batch_size"], http["max_batch_tokens"])


def test_errors_are_statuses_with_the_http_messages(url, channel):
    embed = pb_grpc.EmbedStub(channel).Embed
    embed(pb.EmbedRequest(inputs="x"), metadata=key("embedder"))  # answered: counted 200
    error = refused(embed, pb.EmbedRequest(inputs="x"), metadata=key())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # two embedding models
    assert "name one in 'model'" in error.details()
    error = refused(embed, pb.EmbedRequest(inputs="x"), metadata=key("nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in error.details()
    error = refused(embed, pb.EmbedRequest(inputs="x"), metadata=(("model", "embedder"),))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    error = refused(pb_grpc.PredictStub(channel).Predict, pb.PredictRequest(inputs="x"),
                    metadata=key("embedder"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not classify" in error.details()
    metrics = web.get(url + "/metrics", headers=HEADERS).text
    assert 'distilserve_requests_total{route="/tei.v1.Embed/Embed",status="401"}' in metrics
    assert 'distilserve_requests_total{route="/tei.v1.Embed/Embed",status="200"}' in metrics


def test_health_checks_and_reflection_need_no_key(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "inference.GRPCInferenceService", "tei.v1.Embed", "tei.v1.Predict",
                 "tei.v1.Rerank", "tei.v1.Tokenize", "tei.v1.Info"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING, name
    error = refused(health.Check, health_pb2.HealthCheckRequest(service="tei.v1.Nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service="tei.v1.Embed"))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {"tei.v1.Embed", "tei.v1.Rerank", "inference.GRPCInferenceService",
            "grpc.health.v1.Health"} <= set(services)


def test_a_service_is_serving_only_with_a_model_that_does_what_it_does():
    engines = {"e": SimpleNamespace(task="embed"), "n": SimpleNamespace(task="ner")}
    svc = SimpleNamespace(engines=engines)
    assert SERVING["tei.v1.Embed"](svc) and SERVING["tei.v1.Rerank"](svc)
    assert not SERVING["tei.v1.Predict"](svc)
    svc.engines = {"c": SimpleNamespace(task="classify", relevant=None)}  # no relevant label
    assert SERVING["tei.v1.Predict"](svc) and not SERVING["tei.v1.Rerank"](svc)


def test_a_health_watch_ends_not_serving_when_the_service_stops(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "embedder", "onnx", check=False)
    port = unallocated_port()
    statuses, watching = [], threading.Event()
    with running_server(tmp_path, grpc_port=port):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""))

        def read():
            for answer in watch:
                statuses.append(answer.status)
                watching.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert watching.wait(60)
    reader.join(60)  # the stream ended with the service
    channel.close()
    assert statuses == [health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING]


def test_the_messages_keep_teis_field_numbers():
    """The wire format is the field numbers: those of TEI's tei.proto, which its clients'
    generated stubs send."""
    expected = {
        "EmbedRequest": ["inputs", "truncate", "normalize", "truncation_direction",
                         "prompt_name"],
        "EmbedResponse": ["embeddings", "metadata"],
        "Metadata": ["compute_chars", "compute_tokens", "total_time_ns",
                     "tokenization_time_ns", "queue_time_ns", "inference_time_ns"],
        "PredictPairRequest": ["inputs", "truncate", "raw_scores", "truncation_direction"],
        "RerankRequest": ["query", "texts", "truncate", "raw_scores", "return_text",
                          "truncation_direction"],
        "Rank": ["index", "text", "score"],
        "SimpleToken": ["id", "text", "special", "start", "stop"],
        "InfoResponse": ["version", "sha", "docker_label", "model_id", "model_sha",
                         "model_dtype", "model_type", "max_concurrent_requests",
                         "max_input_length", "max_batch_tokens", "max_batch_requests",
                         "max_client_batch_size", "tokenization_workers"]}
    for message, names in expected.items():
        fields = getattr(pb, message).DESCRIPTOR.fields_by_number
        assert {n: f.name for n, f in fields.items()} == dict(enumerate(names, 1)), message
    services = {s.full_name: sorted(m.name for m in s.methods)
                for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services["tei.v1.Embed"] == ["Embed", "EmbedAll", "EmbedAllStream", "EmbedSparse",
                                        "EmbedSparseStream", "EmbedStream"]
    assert services["tei.v1.Rerank"] == ["Rerank", "RerankStream"]


def refusals(url) -> float:
    """How many /tei.v1.Embed/Embed calls were answered as a 400's, by /metrics."""
    line = 'distilserve_requests_total{route="/tei.v1.Embed/Embed",status="400"} '
    metrics = web.get(url + "/metrics", headers=HEADERS).text
    return sum(float(row[len(line):]) for row in metrics.splitlines() if row.startswith(line))


def test_an_undecodable_message_is_invalid_argument_after_the_key(url, channel, caplog):
    """A message that is not the method's is INVALID_ARGUMENT, unary or streamed, logged
    in one line without a traceback however often it comes; without the key it is never
    read: UNAUTHENTICATED."""
    junk = b"\xff\xff\xff"  # a field number 0: not a protobuf message
    one = channel.unary_unary("/tei.v1.Embed/Embed")
    stream = channel.stream_stream("/tei.v1.Embed/EmbedStream")
    caplog.clear()
    before = refusals(url)
    for _ in range(20):
        error = refused(one, junk, metadata=key("embedder"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "does not decode" in error.details()
        assert refused(one, junk).code() == grpc.StatusCode.UNAUTHENTICATED
    error = refused(lambda: list(stream(iter([junk]), metadata=key("embedder"))))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    rerank = channel.stream_unary("/tei.v1.Rerank/RerankStream")
    assert refused(rerank, iter([junk]), metadata=key()).code() == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert refused(rerank, iter([junk])).code() == grpc.StatusCode.UNAUTHENTICATED
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    assert refusals(url) == before + 20
