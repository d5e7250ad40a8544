"""End to end: the Open Inference Protocol's routes
(distilserve/server/routes/oip/http_routes.py) give what the /v1 routes give, as
tensors, to tritonclient's HTTP client (binary tensor data, its default, and JSON) and
to a plain JSON client as KServe's examples send it."""

from __future__ import annotations

import gzip
import json
import time
import zlib

import numpy as np
import pytest
import tritonclient.http as triton

from tests import web
from tests.conftest import running_server

TEXTS = ["The cat sat on the mat.", "Dogs bark at night in the town of Springfield."]


@pytest.fixture(scope="module")
def url(oip_repository):
    with running_server(oip_repository, max_inputs=8, api_key="sekret",
                        compress_min_bytes=512) as url:
        yield url


@pytest.fixture
def client(url):
    client = triton.InferenceServerClient(url.removeprefix("http://"),
                                          network_timeout=60.0)
    yield client
    client.close()


HEADERS = {"Authorization": "Bearer sekret"}  # tritonclient adds to the headers given: a copy


def v1(url, route, body):
    res = web.post(url + route, json=body, headers=HEADERS, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def infer(client, model, inputs: dict[str, list[str]], outputs=None, binary=True, **params):
    tensors = []
    for name, texts in inputs.items():
        tensor = triton.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
        tensors.append(tensor)
    wanted = [o if isinstance(o, triton.InferRequestedOutput)
              else triton.InferRequestedOutput(o, binary_data=binary) for o in outputs or ()]
    return client.infer(model, tensors, outputs=wanted or None, parameters=params or None,
                        headers=dict(HEADERS))


def test_probes_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()  # public, as /health
    assert client.is_model_ready("embed", headers=dict(HEADERS))
    assert not client.is_model_ready("nope", headers=dict(HEADERS))
    server = client.get_server_metadata(headers=dict(HEADERS))
    assert "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata("classify", headers=dict(HEADERS))
    assert meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("text", "BYTES"),
                                                                   ("text_pair", "BYTES")]
    assert meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 2]},
                               {"name": "label", "datatype": "BYTES", "shape": [-1]}]
    embed = client.get_model_metadata("embed", headers=dict(HEADERS))
    assert embed["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 32]}]


def test_the_repository_index_lists_every_folder_and_its_state(url, client):
    index = client.get_model_repository_index(headers=dict(HEADERS))
    assert [(m["name"], m["state"]) for m in index] == [
        ("broken", "UNAVAILABLE"), ("classify", "READY"), ("embed", "READY"), ("ner", "READY")]
    # the folder within the repository: no server path reaches a client (the log has it)
    assert index[0]["reason"].startswith("broken/manifest.json: missing")
    assert index[0]["reason"] == web.get(url + "/ready").json()["failed"]["broken"]
    ready = web.post(url + "/v2/repository/index", json={"ready": True}, headers=HEADERS)
    assert [m["name"] for m in ready.json()] == ["classify", "embed", "ner"]
    bad = web.post(url + "/v2/repository/index", json={"ready": "yes"}, headers=HEADERS)
    assert bad.status_code == 422 and "ready" in bad.json()["error"]


@pytest.mark.parametrize("binary", [True, False])
def test_embeddings_are_v1_embeds(url, client, binary):
    expected = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS})["embeddings"]
    result = infer(client, "embed", {"text": TEXTS}, binary=binary)
    got = result.as_numpy("embedding")
    assert got.dtype == np.float32 and got.shape == (2, 32)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # the route's options are the request's parameters
    cut = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS, "dimensions": 8,
                                "normalize": False})["embeddings"]
    got = infer(client, "embed", {"text": TEXTS}, ["embedding"], binary, dimensions=8,
                normalize=False).as_numpy("embedding")
    np.testing.assert_allclose(got, cut, atol=1e-6)


def test_classification_of_texts_and_pairs_is_v1_classifys(url, client):
    labels = ["negative", "positive"]
    pairs = [[t, "a reply"] for t in TEXTS]
    for inputs, sent in ((TEXTS, {"text": TEXTS}),
                         (pairs, {"text": TEXTS, "text_pair": ["a reply"] * 2})):
        results = v1(url, "/v1/classify", {"model": "classify", "inputs": inputs})["results"]
        result = infer(client, "classify", sent)
        scores = result.as_numpy("scores")
        expected = [[{r["label"]: r["score"] for r in one}[label] for label in labels]
                    for one in results]
        np.testing.assert_allclose(scores, expected, atol=1e-6)
        assert [b.decode() for b in result.as_numpy("label")] == [r[0]["label"]
                                                                  for r in results]
    raw = infer(client, "classify", {"text": TEXTS}, ["scores"], raw_scores=True)
    assert raw.get_output("label") is None  # only the output asked for
    assert not np.allclose(raw.as_numpy("scores").sum(1), 1)  # logits, not probabilities


def test_tritons_classification_extension_gives_the_best_classes(url, client):
    results = v1(url, "/v1/classify", {"model": "classify", "inputs": TEXTS})["results"]
    tensors = [triton.InferInput("text", [2], "BYTES")]
    tensors[0].set_data_from_numpy(np.array(TEXTS, dtype=object))
    for binary in (True, False):
        result = client.infer("classify", tensors, headers=dict(HEADERS), outputs=[
            triton.InferRequestedOutput("scores", binary_data=binary, class_count=1)])
        best = [(b.decode() if binary else b).split(":")  # JSON's are strings already
                for b in result.as_numpy("scores").reshape(-1)]
        assert [(label, int(index)) for _, index, label in best] == [
            (r[0]["label"], ["negative", "positive"].index(r[0]["label"])) for r in results]
        np.testing.assert_allclose([float(s) for s, _, _ in best],
                                   [r[0]["score"] for r in results], atol=1e-6)


def test_entities_are_v1_ners_as_json(url, client):
    expected = v1(url, "/v1/ner", {"model": "ner", "inputs": TEXTS,
                                   "aggregation_strategy": "first"})["results"]
    result = infer(client, "ner", {"text": TEXTS}, aggregation_strategy="first")
    assert [json.loads(e) for e in result.as_numpy("entities")] == expected


def test_a_plain_json_request_as_kserves_examples_send_it(url):
    """One input, named input-0, nested [N, 1], parameters null; no binary data asked for:
    JSON back."""
    body = {"id": "42", "parameters": None, "inputs": [
        {"name": "input-0", "shape": [2, 1], "datatype": "BYTES", "parameters": None,
         "data": [[t] for t in TEXTS]}]}
    res = web.post(url + "/v2/models/embed/infer", json=body, headers=HEADERS, timeout=60)
    assert res.status_code == 200, res.text
    assert res.headers["content-type"] == "application/json"
    assert "x-inference-time" in res.headers  # the routes' timing headers
    answer = res.json()
    assert (answer["model_name"], answer["id"]) == ("embed", "42")
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("embedding", "FP32",
                                                                    [2, 32])
    expected = v1(url, "/v1/embed", {"model": "embed", "inputs": TEXTS})["embeddings"]
    np.testing.assert_allclose(np.reshape(output["data"], (2, 32)), expected, atol=1e-6)


def test_the_fast_path_and_fastapi_answer_alike(url):
    """A JSON body is the fast path's (distilserve/server/routes/fast_path.py); one sent as
    application/octet-stream, as binary tensor data may be, goes on to FastAPI's route."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    answers = []
    for content_type in ("application/json", "application/octet-stream"):
        for sent in (body, {"inputs": []}):
            res = web.post(url + "/v2/models/classify/infer", content=json.dumps(sent),
                             headers={**HEADERS, "content-type": content_type}, timeout=60)
            answers.append((res.status_code, res.json()))
    assert answers[:2] == answers[2:] and [a[0] for a in answers[:2]] == [200, 422]


@pytest.mark.parametrize("model, inputs, outputs, params, status, message", [
    ("nope", {"text": TEXTS}, None, {}, 404, "unknown model 'nope'"),
    ("embed", {"text": TEXTS}, ["scores"], {}, 422, "outputs scores: model 'embed' gives "
     "embedding"),
    ("embed", {"text": TEXTS, "text_pair": TEXTS}, None, {}, 422, "takes text"),
    ("classify", {"text": TEXTS, "text_pair": TEXTS[:1]}, None, {}, 422, "a pair is one of "
     "each"),
    ("embed", {"text": TEXTS}, None, {"normalize": "yes"}, 422, "parameters: normalize"),
    ("embed", {"text": TEXTS}, None, {"dimensions": 99}, 422, "dimensions 99"),
    ("ner", {"text": TEXTS}, None, {"aggregation_strategy": "most"}, 422,
     "parameters: aggregation_strategy"),
    ("embed", {"text": TEXTS * 5}, None, {}, 413, "10 inputs; at most 8"),
    ("embed", {"text": TEXTS}, [triton.InferRequestedOutput("embedding", class_count=2)], {},
     422, "embedding: classification 2: the classification extension takes a "
     "classifier's scores only; model 'embed' does embed"),
    ("classify", {"text": TEXTS}, [triton.InferRequestedOutput("scores", class_count=3)], {},
     422, "scores: classification 3: the number of best classes, 1 to the model's 2"),
    ("broken", {"text": TEXTS}, None, {}, 404, "model 'broken' is not served: it failed to "
     "load (broken/manifest.json: missing"),
])
def test_errors_are_the_services_with_its_statuses(client, model, inputs, outputs, params,
                                                    status, message):
    with pytest.raises(triton.InferenceServerException) as caught:
        infer(client, model, inputs, outputs, **params)
    assert caught.value.status() == str(status)
    assert message in caught.value.message()  # the protocol's error: its message


def test_a_malformed_body_is_a_422_and_the_api_key_is_needed(url):
    route = url + "/v2/models/embed/infer"
    for body, headers, status in [
            (b"{", HEADERS, 422),
            # data nested near the JSON parser's limit (it took Python's recursion once)
            (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": '
             + b"[" * 1000 + b'"a"' + b"]" * 1000 + b"}]}", HEADERS, 422),
            (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1]}]}\x00',
             {**HEADERS, "Inference-Header-Content-Length": "99"}, 422),
            (b'{"inputs": []}', HEADERS, 422),
            (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}], '
             b'"outputs": [{"name": "embedding", "parameters": {"shared_memory_region": '
             b'"r", "shared_memory_byte_size": 128}}]}', HEADERS, 422),
            (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "parameters": '
             b'{"shared_memory_region": "r", "shared_memory_byte_size": 9}}]}', HEADERS, 422),
            (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], '
             b'"data": ["a"]}]}', {}, 401)]:
        res = web.post(route, content=body, headers=headers, timeout=60)
        assert res.status_code == status, res.text
        assert set(res.json()) == {"error"} and isinstance(res.json()["error"], str)
        if b"shared_memory" in body:  # refused for what it is, never read as empty
            assert "shared memory (Triton's extension) is not served" in res.text
    assert web.get(url + "/v2/health/ready").json() == {"ready": True}
    assert web.get(url + "/v2/models/embed").status_code == 401


@pytest.mark.parametrize("body, content_type, says", [
    (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\xff"]}]}',
     "application/json", "malformed JSON: the body is not UTF-8 (byte 74)"),
    (b'{"inputs": [', "application/json", "malformed JSON: "),
    (b'{"inputs": []}', "text/plain", "the body must be JSON, sent with Content-Type: "
     "application/json (this one was sent as 'text/plain'"),
])
def test_a_body_that_is_not_json_is_said_as_elsewhere(url, body, content_type, says):
    res = web.post(url + "/v2/models/embed/infer", content=body,
                     headers={**HEADERS, "content-type": content_type})
    assert res.status_code == 422 and says in res.json()["error"], res.text
    assert "char 0" not in res.text and "surrogates" not in res.text


def test_curl_ds_default_content_type_is_taken_as_triton_takes_it(url):
    """Triton's documented curl commands send curl -d's default type."""
    res = web.post(url + "/v2/models/embed/infer", headers={
        **HEADERS, "content-type": "application/x-www-form-urlencoded"}, content=json.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}))
    assert res.status_code == 200, res.text


def _stats(client, model: str) -> dict:
    (stats,) = client.get_inference_statistics(model, headers=dict(HEADERS))["model_stats"]
    return stats


def test_statistics_count_what_the_model_did(url, client):
    """Triton's statistics of a model, before and after two requests of two texts each
    and one that fails with the model (a text too long to run untruncated)."""
    before, began = _stats(client, "ner"), time.time()
    for _ in range(2):
        infer(client, "ner", {"text": TEXTS})
    with pytest.raises(triton.InferenceServerException):
        infer(client, "ner", {"text": ["word " * 600]}, truncate=False)
    after = _stats(client, "ner")

    def grew(key: str, *inner: str) -> int:
        a, b = after, before
        for k in (key, *inner):
            a, b = a[k], b[k]
        return a - b

    stats = {k: (grew("inference_stats", k, "count"), grew("inference_stats", k, "ns"))
             for k in after["inference_stats"]}
    assert stats["success"][0] == 2 and stats["fail"][0] == 1
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[part][0] == 2, part  # each answered request's
    assert stats["compute_infer"][1] > 0 and stats["compute_input"][1] > 0
    # a request's time with the model holds its tokenising, waiting and run
    assert stats["success"][1] >= stats["compute_infer"][1] + stats["compute_input"][1]
    # one after the other: a batch of two each
    assert grew("inference_count") == 4 and grew("execution_count") == 2
    twos = {b["batch_size"]: b for b in before["batch_stats"]}.get(2, {}).get(
        "compute_infer", {"count": 0})["count"]
    assert {b["batch_size"]: b for b in after["batch_stats"]}[2]["compute_infer"][
        "count"] == twos + 2
    assert began * 1000 - 1 <= after["last_inference"] <= time.time() * 1000 + 1
    # every model's, in name order; and the service's own metrics say the same
    everyone = client.get_inference_statistics(headers=dict(HEADERS))["model_stats"]
    assert [s["name"] for s in everyone] == ["classify", "embed", "ner"]
    assert everyone[2] == after
    metrics = web.get(url + "/metrics", headers=HEADERS).text
    assert ('distilserve_model_request_seconds_count{model="ner",outcome="success"} '
            f'{after["inference_stats"]["success"]["count"]}.0') in metrics
    with pytest.raises(triton.InferenceServerException) as caught:
        client.get_inference_statistics("nope", headers=dict(HEADERS))
    assert caught.value.status() == "404"


def test_the_model_configuration_says_what_it_takes_and_gives(client):
    config = client.get_model_config("classify", headers=dict(HEADERS))
    text = {"data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    assert config["input"] == [{"name": "text", **text}, {"name": "text_pair", **text}]
    assert config["output"] == [{"name": "scores", "data_type": "TYPE_FP32", "dims": [2]},
                                {"name": "label", **text}]
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert config["max_batch_size"] == 32  # the CPU's default
    assert config["instance_group"] == [{"name": "classify", "kind": "KIND_CPU", "count": 1,
                                         "gpus": []}]
    assert config["parameters"]["task"] == {"string_value": "classify"}
    embed = client.get_model_config("embed", headers=dict(HEADERS))
    assert embed["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}]
    # as a Triton client builds its inputs from it: [N] + dims
    tensor = triton.InferInput("text", [2, *config["input"][0]["dims"]], "BYTES")
    tensor.set_data_from_numpy(np.array([[t] for t in TEXTS], dtype=object))
    result = client.infer("classify", [tensor], headers=dict(HEADERS))
    assert result.as_numpy("scores").shape == (2, 2)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_is_answered_as_the_same_sent_plain(url, client, algorithm):
    """tritonclient's request_compression_algorithm (the body decompressed before the
    routes: distilserve/server/app.py's Decompress) and response_compression_algorithm (binary
    tensors come back plain, JSON gzipped: DISTILSERVE_COMPRESS_MIN_BYTES)."""
    tensor = triton.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(TEXTS, dtype=object))
    plain = client.infer("embed", [tensor], headers=dict(HEADERS)).as_numpy("embedding")
    packed = client.infer("embed", [tensor], headers=dict(HEADERS),
                          request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm).as_numpy("embedding")
    np.testing.assert_array_equal(packed, plain)
    as_json = client.infer("embed", [tensor], headers=dict(HEADERS), outputs=[
        triton.InferRequestedOutput("embedding", binary_data=False)],
        response_compression_algorithm=algorithm).as_numpy("embedding")
    np.testing.assert_allclose(as_json, plain, atol=1e-6)
    # FastAPI's routes read it so too (the repository index: no model runs)
    body = {"gzip": gzip.compress, "deflate": zlib.compress}[algorithm](b'{"ready": true}')
    res = web.post(url + "/v2/repository/index", content=body, headers={
        **HEADERS, "content-encoding": algorithm, "content-type": "application/json"})
    assert [m["name"] for m in res.json()] == ["classify", "embed", "ner"]
    # nothing is decompressed for a client without the API key
    garbage = {"content-encoding": algorithm, "content-type": "application/json"}
    assert web.post(url + "/v2/repository/index", content=b"not " + body,
                      headers=garbage).status_code == 401
    assert web.post(url + "/v2/repository/index", content=b"not " + body,
                      headers={**HEADERS, **garbage}).status_code == 422


def test_answers_over_the_size_set_are_gzipped_for_a_client_that_takes_it(url):
    """DISTILSERVE_COMPRESS_MIN_BYTES (512 here): a JSON answer that long is gzipped where
    the client's Accept-Encoding takes gzip, the same once decoded; a shorter one, one to a
    client that does not take it, and Triton's binary tensors go as they are."""
    body = {"model": "embed", "inputs": TEXTS * 4}
    plain = web.post(url + "/v1/embed", json=body, headers={
        **HEADERS, "accept-encoding": "identity"}, timeout=60)
    assert "content-encoding" not in plain.headers
    refused = web.post(url + "/v1/embed", json=body, headers={
        **HEADERS, "accept-encoding": "gzip;q=0, identity"}, timeout=60)
    assert "content-encoding" not in refused.headers and refused.content == plain.content
    packed = web.post(url + "/v1/embed", json=body, headers={
        **HEADERS, "accept-encoding": "gzip"}, timeout=60)
    assert packed.headers["content-encoding"] == "gzip" and packed.status_code == 200
    assert int(packed.headers["content-length"]) < 0.6 * len(plain.content)
    assert packed.json()["embeddings"] == plain.json()["embeddings"]  # httpx decodes
    assert packed.headers["x-compute-tokens"] == plain.headers["x-compute-tokens"]
    small = web.get(url + "/health", headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in small.headers
    binary = web.post(url + "/v2/models/embed/infer", json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [8],
                    "data": TEXTS * 4}], "parameters": {"binary_data_output": True}},
        headers={**HEADERS, "accept-encoding": "gzip"}, timeout=60)
    assert binary.status_code == 200 and "content-encoding" not in binary.headers


def test_a_models_one_version_answers_at_its_versions_paths(url, client):
    """Version 1 of each model (tritonclient's model_version): the same answers; another
    version is a 404."""
    tensor = triton.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(TEXTS, dtype=object))
    plain = client.infer("embed", [tensor], headers=dict(HEADERS)).as_numpy("embedding")
    versioned = client.infer("embed", [tensor], model_version="1", headers=dict(HEADERS))
    np.testing.assert_array_equal(versioned.as_numpy("embedding"), plain)
    assert client.get_model_metadata("embed", "1", headers=dict(HEADERS)) == \
        client.get_model_metadata("embed", headers=dict(HEADERS))
    assert client.get_model_metadata("embed", headers=dict(HEADERS))["versions"] == ["1"]
    assert client.get_model_config("ner", "1", headers=dict(HEADERS))["name"] == "ner"
    assert client.is_model_ready("embed", "1", headers=dict(HEADERS))
    assert not client.is_model_ready("embed", "2", headers=dict(HEADERS))
    (stats,) = client.get_inference_statistics("embed", "1", headers=dict(HEADERS))[
        "model_stats"]
    assert stats["name"] == "embed"
    for version, model, message in (("2", "embed", "model 'embed' has one version, 1, not "
                                     "'2'"), ("1", "nope", "unknown model 'nope'"),
                                    ("2", "nope", "unknown model 'nope'")):
        res = web.post(f"{url}/v2/models/{model}/versions/{version}/infer", headers=HEADERS,
                         json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                           "data": ["x"]}]})
        assert res.status_code == 404 and message in res.json()["error"]
