"""End to end: Text Embeddings Inference's own routes (distilserve/server/routes/tei/http_routes.py) and
Infinity's give what the /v1 routes give, in their shapes, and the clients written for
TEI work against them."""

from __future__ import annotations

import numpy as np
import pytest

from distilserve.models.io import checkpoint
from distilserve.server.core import inference
from tests import web
from tests.conftest import running_server

PAIR = ["How old is the Eiffel Tower?", "It was finished in 1889."]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    """One embedding model (so that TEI's routes may leave it unnamed), a classifier, a
    cross-encoder and a NER model."""
    repo = tmp_path_factory.mktemp("tei")
    exports(tiny_checkpoints["bert", "embed"], repo / "embedder", "onnx", check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "classifier", "torch", check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cross-checkpoint")
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    exports(tiny_checkpoints["bert", "ner"], repo / "tagger", "torch", check=False)
    with running_server(repo, max_inputs=8) as url:
        yield url


def post(url, route, body):
    res = web.post(url + route, json=body, timeout=60)
    assert res.status_code == 200, (route, res.text)
    return res.json()


def test_embed_and_the_root_give_v1_embeds_embeddings_alone(url):
    body = {"inputs": ["The cat sat on the mat.", "Dogs bark."], "dimensions": 16}
    expected = post(url, "/v1/embed", body)["embeddings"]
    for route in ("/embed", "/"):
        vectors = post(url, route, body)
        assert np.shape(vectors) == (2, 16)
        np.testing.assert_allclose(vectors, expected, atol=1e-6)
    one = post(url, "/embed", {"inputs": "Dogs bark.", "normalize": False})  # a text: [[...]]
    raw = post(url, "/v1/embed", {"inputs": "Dogs bark.", "normalize": False})["embeddings"]
    np.testing.assert_allclose(one, raw, atol=1e-6)


def test_embed_takes_token_ids_as_the_whole_input_as_tei_does(url):
    """Current TEI's /embed takes token ids too, each the model's whole input (its special
    tokens included, as /tokenize gives them): a text's ids embed as the text does; ids
    without the special tokens are run without them."""
    text = "The cat sat on the mat."
    ids = [t["id"] for t in post(url, "/tokenize", {"inputs": text})[0]]
    expected = post(url, "/embed", {"inputs": text})
    for route, body in (("/embed", {"inputs": ids}), ("/", {"inputs": ids}),
                        ("/embed", {"inputs": [text, ids]})):
        for vector in post(url, route, body):
            np.testing.assert_allclose(vector, expected[0], atol=1e-6)
    bare = post(url, "/embed", {"inputs": ids[1:-1]})
    assert not np.allclose(bare, expected, atol=1e-3)
    long = post(url, "/embed", {"inputs": ids * 40})  # cut to max_length (truncate: true)
    assert np.shape(long) == np.shape(expected)
    for body, status, words in (
            ({"inputs": ids * 40, "truncate": False}, 413, "input 0 has 360 tokens, more than the model's "
             "max_length 128"),
            ({"inputs": [ids[0], 10**6]}, 422, "input 0: token id 1000000 is not in the "
             "vocabulary"),
            ({"inputs": [[]]}, 422, "inputs.0: List should have at least 1 item")):
        res = web.post(url + "/embed", json=body)
        assert res.status_code == status and words in res.json()["error"]["message"], res.text


def test_huggingface_hubs_inference_client(url, monkeypatch):
    """As LangChain's HuggingFaceEndpointEmbeddings and Haystack's TEI embedders call it:
    the service's URL as the model, at its root or at /embed."""
    hub = pytest.importorskip("huggingface_hub")
    expected = post(url, "/v1/embed", {"inputs": "Dogs bark."})["embeddings"]
    # the suite sets HF_HUB_OFFLINE (nothing downloads), under which huggingface_hub's
    # sessions refuse every request, this one to loopback too
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    hub.utils.reset_sessions()
    try:
        for model in (url, url + "/embed"):
            got = hub.InferenceClient(model=model).feature_extraction("Dogs bark.")
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, expected, atol=1e-6)
        info = hub.InferenceClient(model=url, provider="hf-inference").get_endpoint_info()
        assert info["model_id"] == "embedder"
        sentences = ["A cat sat on a rug.", "Stocks fell."]  # posted to / as /similarity's
        got = hub.InferenceClient(model=url).sentence_similarity("A cat sat.", sentences)
        np.testing.assert_allclose(got, post(url, "/similarity", {"inputs": {
            "source_sentence": "A cat sat.", "sentences": sentences}}), atol=1e-6)
    finally:
        monkeypatch.undo()
        hub.utils.reset_sessions()


def test_similarity_is_the_cosine_of_the_embeddings_also_at_the_root(url):
    source, sentences = "A cat sat on the mat.", ["A cat was sitting on a rug.", "Stocks fell."]
    vectors = np.array(post(url, "/v1/embed", {"inputs": [source, *sentences]})["embeddings"])
    body = {"inputs": {"source_sentence": source, "sentences": sentences}}
    for route in ("/similarity", "/", "/invocations"):  # the root: the body says which
        got = post(url, route, body)
        assert len(got) == 2
        np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=1e-5)
    np.testing.assert_allclose(post(url, "/invocations", {"inputs": sentences}), vectors[1:],
                               atol=1e-6)  # SageMaker's route: the root's twin

    def refused(parameters=None, sentences=sentences):
        res = web.post(url + "/similarity", json={"parameters": parameters, "inputs": {
            "source_sentence": source, "sentences": sentences}})
        return res.status_code, res.json()["error"]["message"]

    # TEI's parameters, as /v1/embed's fields
    assert refused({"prompt_name": "query"}) == (
        422, "prompt_name 'query': model 'embedder' has no prompts")
    code, message = refused({"truncate": False}, ["word " * 600])
    assert code == 413 and "max_length" in message, message
    code, message = refused(sentences=["x"] * 8)  # 9 inputs with the source
    assert code == 413 and "9 inputs" in message, message
    assert refused(sentences=[])[0] == 422
    # the root: the body's shape says which it is, and the errors are that body's alone
    for body, message in (({"inputs": {"source_sentence": source}}, "inputs.sentences: Field "
                           "required"), ({"inputs": "x", "normalize": 1},
                                         "normalize: Input should be a valid boolean (sent 1)")):
        res = web.post(url + "/", json=body)
        assert (res.status_code, res.json()["error"]["message"]) == (422, message)


def test_the_root_answers_as_the_route_of_what_its_model_does(url):
    """TEI serves its one model at /: named here, a classifier's body is /predict's (or
    /rerank's, with a query), a cross-encoder's /rerank's; a NER model's /v1/ner's entities,
    as the Hugging Face Inference API serves one (TEI serves none)."""
    for body, route in (({"model": "classifier", "inputs": PAIR}, "/predict"),
                        ({"model": "classifier", "inputs": [["a"], PAIR]}, "/predict"),
                        ({"model": "cross", "query": "q", "texts": ["a", "b"]}, "/rerank"),
                        ({"model": "embedder", "inputs": ["a", "b"]}, "/embed")):
        assert post(url, "/", body) == post(url, route, body), body
    entities = post(url, "/v1/ner", {"model": "tagger", "inputs": ["Paris.", "Kenji Tanaka"]})
    assert post(url, "/", {"model": "tagger", "inputs": "Paris."}) == entities["results"][0]
    assert post(url, "/", {"model": "tagger", "inputs": ["Paris.", "Kenji Tanaka"]}) == \
        entities["results"]
    res = web.post(url + "/", json={"model": "classifier", "inputs": ["a", "b", "c"]})
    assert res.status_code == 422 and res.json()["error"]["message"].startswith("inputs")
    res = web.post(url + "/", json={"model": 5, "inputs": "a"})  # unnamed: the embedder's
    assert res.status_code == 422 and "model: Input should be a valid string" in res.text


def _same(a, b) -> bool:
    """Equal JSON, floats to 1e-5 (inputs batched with others may differ in the last bits)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return abs(a - b) < 1e-5
    return a == b


def test_vertex_answers_each_instance_as_the_root(url):
    instances = [{"inputs": "Dogs bark."}, {"model": "classifier", "inputs": PAIR},
                 {"model": "cross", "query": "q", "texts": ["a", "b"], "return_text": True},
                 {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}]
    res = web.post(url + "/vertex", json={"instances": instances}, timeout=60)
    assert res.status_code == 200, res.text
    alone = [web.post(url + "/", json=instance) for instance in instances]
    assert _same(res.json(), {"predictions": [answer.json() for answer in alone]})
    assert int(res.headers["x-compute-tokens"]) == sum(
        int(answer.headers["x-compute-tokens"]) for answer in alone)

    def refused(instances):
        res = web.post(url + "/vertex", json={"instances": instances})
        return res.status_code, res.json()["error"]["message"]

    # an instance refused refuses them all, named by its index
    assert refused([{"inputs": "a"}, {"inputs": 5}])[0] == 422
    assert refused([{"inputs": "a"}, {"inputs": 5}])[1].startswith("instances.1: inputs")
    assert refused([{"model": "tagger", "inputs": "a", "parameters": {
        "stride": 4, "aggregation_strategy": "none"}}]) == (
        422, "instances.0: parameters: stride: a text read in windows needs an "
        "aggregation_strategy other than none (a token's index would be its window's)")
    code, message = refused([{"inputs": "a"}, {"inputs": ["x"] * 9}])
    assert code == 413 and message.startswith("instances.1: 9 inputs"), message
    assert refused([{"inputs": "a"}] * 9) == (413, "9 instances; at most 8 per request "
                                                   "(DISTILSERVE_MAX_INPUTS)")
    assert refused([])[0] == 422


def test_a_lone_classifier_is_served_at_the_root(exports, tiny_checkpoints, tmp_path, monkeypatch):
    """As TEI serves a classifier: its /predict at / and /info, unnamed; huggingface_hub's
    text_classification works against it."""
    exports(tiny_checkpoints["bert", "classify"], tmp_path / "sentiment", "torch", check=False)
    with running_server(tmp_path) as lone:
        text = "The soup was delicious."
        expected = post(lone, "/predict", {"inputs": text})
        assert post(lone, "/", {"inputs": text}) == expected
        # the Hugging Face Inference API's parameters, as the pipeline's
        logits = post(lone, "/v1/classify", {"inputs": text, "raw_scores": True})["results"][0]
        assert post(lone, "/", {"inputs": text, "parameters": {
            "top_k": 1, "function_to_apply": "none"}}) == logits[:1]
        assert "classifier" in web.get(lone + "/info").json()["model_type"]
        hub = pytest.importorskip("huggingface_hub")
        monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)  # as above
        hub.utils.reset_sessions()
        try:
            got = hub.InferenceClient(model=lone).text_classification(text)
            raw = hub.InferenceClient(model=lone).text_classification(
                text, function_to_apply="none")
        finally:
            monkeypatch.undo()
            hub.utils.reset_sessions()
        # it keeps the first of the list TEI's / answers for one text: the best label
        assert (got.label, got.score) == (expected[0]["label"],
                                          pytest.approx(expected[0]["score"], abs=1e-6))
        assert (raw.label, raw.score) == (logits[0]["label"],
                                          pytest.approx(logits[0]["score"], abs=1e-6))


def test_embed_all_gives_the_token_vectors_that_the_other_routes_pool(exports, tiny_checkpoints,
                                                                      tmp_path, monkeypatch):
    """A model exported with --token-embeddings: TEI's /embed_all gives every token's
    vector; /v1/embed and /v1/rerank pool them in the service, as the same checkpoint
    exported to pool inside its graph gives them."""
    source = tiny_checkpoints["bert", "embed"]
    exports(source, tmp_path / "pooled", "onnx", check=False)
    exports(source, tmp_path / "tokens", "onnx", token_embeddings=True, check=False)
    texts = ["The cat sat on the mat.", "Dogs bark."]
    with running_server(tmp_path) as both:
        vectors = post(both, "/embed_all", {"inputs": texts})  # unnamed: the one that can
        counts = [len(t) for t in post(both, "/tokenize", {"inputs": texts})]
        assert [np.shape(v) for v in vectors] == [(n, 32) for n in counts]
        assert np.shape(post(both, "/embed_all", {"inputs": "Dogs bark."})) == (1, counts[1], 32)
        for body in ({"inputs": texts}, {"inputs": texts, "normalize": False, "dimensions": 8}):
            got = post(both, "/v1/embed", {"model": "tokens", **body})["embeddings"]
            want = post(both, "/v1/embed", {"model": "pooled", **body})["embeddings"]
            np.testing.assert_allclose(got, want, atol=1e-5)
        unpooled = post(both, "/v1/embed", {"model": "tokens", "inputs": texts,
                                            "normalize": False})["embeddings"]
        np.testing.assert_allclose([np.mean(v, 0) for v in vectors], unpooled, atol=1e-5)
        rerank = {"query": "a cat", "documents": texts}
        got = post(both, "/v1/rerank", {"model": "tokens", **rerank})["results"]
        want = post(both, "/v1/rerank", {"model": "pooled", **rerank})["results"]
        assert [r["index"] for r in got] == [r["index"] for r in want]
        np.testing.assert_allclose([r["relevance_score"] for r in got],
                                   [r["relevance_score"] for r in want], atol=1e-5)
        listed = web.get(both + "/v1/models/tokens").json()
        assert (listed["pooling"], listed["token_embeddings"]) == ("mean", True)
        assert "token_embeddings" not in web.get(both + "/v1/models/pooled").json()
        refused = web.post(both + "/embed_all", json={"model": "pooled", "inputs": texts})
        assert refused.status_code == 400
        assert "--token-embeddings" in refused.json()["error"]["message"]
        # an answer's size is bounded: here 2 inputs of 128 tokens x 32 numbers at most
        monkeypatch.setattr(inference, "ANSWER_NUMBERS", 2 * 128 * 32 + 1)
        assert len(post(both, "/embed_all", {"inputs": texts})) == 2
        refused = web.post(both + "/embed_all", json={"inputs": [*texts, "three"]})
        assert refused.status_code == 413
        assert refused.json()["error"]["message"] == (
            "3 inputs; model 'tokens' answers at most 2 at once (each up to 4096 numbers: "
            "128 tokens of 32)")


def test_embed_sparse_gives_a_splade_models_non_zero_weights(exports, splade_checkpoint,
                                                             tiny_checkpoints, tmp_path,
                                                             monkeypatch):
    """TEI's /embed_sparse: a SPLADE model's embedding as {index, value} of its non-zero
    entries, which /v1/embed gives whole; /v1/rerank ranks by their dot product."""
    exports(splade_checkpoint, tmp_path / "splade", "onnx", check=False)
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "pooled", "onnx", check=False)
    texts = ["The cat sat on the mat.", "Dogs bark."]
    with running_server(tmp_path) as both:
        sparse = post(both, "/embed_sparse", {"inputs": texts})  # unnamed: the one that can
        dense = np.array(post(both, "/v1/embed", {"model": "splade", "inputs": texts,
                                                  "normalize": False})["embeddings"])
        assert dense.shape == (2, 30522)
        for entries, vector in zip(sparse, dense):
            indices = [e["index"] for e in entries]
            assert indices == sorted(indices) and indices == np.flatnonzero(vector).tolist()
            np.testing.assert_allclose([e["value"] for e in entries], vector[indices],
                                       rtol=1e-6)
        ranked = post(both, "/v1/rerank", {"model": "splade", "query": "a cat",
                                           "documents": texts})["results"]
        query = np.array(post(both, "/v1/embed", {"model": "splade", "inputs": "a cat",
                                                  "normalize": False})["embeddings"][0])
        np.testing.assert_allclose([r["relevance_score"] for r in ranked],
                                   sorted(dense @ query, reverse=True), rtol=1e-5)
        assert web.get(both + "/v1/models/splade").json()["pooling"] == "splade"
        refused = web.post(both + "/embed_sparse", json={"model": "pooled", "inputs": texts})
        assert refused.status_code == 400
        assert "is not a SPLADE model" in refused.json()["error"]["message"]
        # 30522 numbers an embedding: an answer's bound comes soon (here 2 of them)
        monkeypatch.setattr(inference, "ANSWER_NUMBERS", 2 * 30522)
        for route, body, most in (("/v1/embed", {"model": "splade"}, 2),
                                  ("/embed_sparse", {}, 1)):  # an index and a value each
            assert web.post(both + route, json={**body, "inputs": texts[:most]}).is_success
            refused = web.post(both + route, json={**body, "inputs": [*texts, "three"]})
            assert refused.status_code == 413, route
            assert f"answers at most {most} at once" in refused.json()["error"]["message"]


def test_decode_gives_tokenizes_ids_back_as_text(url):
    tokens = post(url, "/tokenize", {"inputs": ["Hello, world", "Dogs bark."]})
    ids = [[t["id"] for t in input_tokens] for input_tokens in tokens]
    for route in ("/decode", "/v1/decode"):
        assert post(url, route, {"ids": ids}) == ["hello, world", "dogs bark."]
    assert post(url, "/decode", {"ids": ids[0], "skip_special_tokens": False}) == [
        "[CLS] hello, world [SEP]"]  # one input: [int]
    res = web.post(url + "/decode", json={"ids": [7592, 10**6]})
    assert res.status_code == 422 and "token id 1000000" in res.json()["error"]["message"]


def test_the_root_and_ping_are_readiness_checks(url):
    ready = web.get(url + "/ready").json()
    for probe in ("/", "/ping"):  # TEI's and SageMaker's
        res = web.get(url + probe)
        assert res.status_code == 200 and res.json() == ready
    wrong = web.put(url + "/")  # two routes at one path: the 405 names both methods
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD, POST"
    assert wrong.json()["error"]["message"] == "no route PUT /: / takes GET, HEAD, POST"


def test_predict_takes_a_text_a_pair_or_a_batch_as_tei_does(url):
    def v1(inputs):
        return post(url, "/v1/classify", {"model": "classifier", "inputs": inputs})["results"]

    def predict(inputs, **kw):
        return post(url, "/predict", {"model": "classifier", "inputs": inputs, **kw})

    text = "The soup was delicious."
    assert predict(text) == v1(text)[0]  # one list of every label, highest first
    assert len(predict(text)) == 2 and predict(text)[0]["score"] >= predict(text)[1]["score"]
    assert predict(PAIR) == v1([PAIR])[0]  # two texts: one pair, not a batch
    assert predict([[text], PAIR]) == v1([text, PAIR])  # a batch: a list per input
    logits = predict(text, raw_scores=True)
    assert {p["label"]: p["score"] for p in logits} == {
        r["label"]: r["score"] for r in post(url, "/v1/classify", {
            "model": "classifier", "inputs": text, "raw_scores": True})["results"][0]}
    for bad in (["a", "b", "c"], [["a", "b", "c"]], [], [[]]):
        res = web.post(url + "/predict", json={"model": "classifier", "inputs": bad})
        assert res.status_code == 422 and "inputs" in res.json()["error"]["message"], bad


def test_classify_answers_infinitys_body(url):
    """infinity_client's classify: {"input", "model", "raw_scores"} -> {"object": "classify",
    "data": one list of labels per input, highest first, "model", "usage"}."""
    texts = ["The soup was delicious.", "The box was crushed."]
    for raw in (False, True):
        got = post(url, "/classify", {"model": "classifier", "input": texts, "raw_scores": raw})
        expected = post(url, "/v1/classify", {"model": "classifier", "inputs": texts,
                                              "raw_scores": raw})["results"]
        assert got["data"] == expected and (got["object"], got["model"]) == (
            "classify", "classifier")
        assert got["usage"]["prompt_tokens"] > 0
    res = web.post(url + "/classify", json={"model": "embedder", "input": ["x"]})
    assert res.status_code == 400 and res.json()["error"]["type"] == "wrong_task"


@pytest.mark.parametrize("model", ["cross", "embedder"])
def test_rerank_gives_v1_reranks_scores_in_teis_shape(url, model):
    texts = ["Bananas are rich in potassium.", "The tower was finished in 1889.", "Paris."]
    query = "How old is the Eiffel Tower?"
    ranks = post(url, "/rerank", {"model": model, "query": query, "texts": texts,
                                  "return_text": True})
    expected = post(url, "/v1/rerank", {"model": model, "query": query, "documents": texts,
                                        "return_documents": True})["results"]
    assert [r["index"] for r in ranks] == [r["index"] for r in expected]
    np.testing.assert_allclose([r["score"] for r in ranks],
                               [r["relevance_score"] for r in expected], atol=1e-6)
    assert [r["text"] for r in ranks] == [texts[r["index"]] for r in ranks]
    plain = post(url, "/rerank", {"model": model, "query": query, "texts": texts})
    assert all(set(r) == {"index", "score"} for r in plain)
    # the request limits count the texts, as /v1/rerank's documents
    res = web.post(url + "/rerank", json={"model": model, "query": query, "texts": ["x"] * 9})
    assert res.status_code == 413 and "9 documents" in res.json()["error"]["message"]


def test_rerank_answers_infinitys_and_vllms_body_as_v1_rerank(url):
    """Infinity and vLLM take Cohere's body at /rerank (infinity_client sends query,
    documents, return_documents, raw_scores, model, top_n; it reads results' index and
    relevance_score, model and usage): answered as /v1/rerank answers it."""
    body = {"model": "cross", "query": "How old is the Eiffel Tower?", "raw_scores": False,
            "documents": ["Bananas.", "The tower was finished in 1889.", "Paris."],
            "return_documents": True, "top_n": 2}
    assert post(url, "/rerank", body) == post(url, "/v1/rerank", body)
    # the body's fields say which it is; the errors are that body's alone
    for body, message in (
            ({"query": "q"}, "body: a rerank body has 'texts' (TEI's) or 'documents' "
             "(Cohere's, as /v1/rerank)"),
            ({"query": "q", "texts": "a"}, 'texts: Input should be a valid list (sent "a")'),
            ({"query": "q", "documents": []}, "documents: List should have at least 1 item "
             "after validation, not 0")):
        res = web.post(url + "/rerank", json=body)
        assert (res.status_code, res.json()["error"]["message"]) == (422, message)


def test_tokenize_and_embeddings_also_where_tei_and_infinity_serve_them(url):
    body = {"inputs": ["Hello, world"], "model": "embedder"}
    assert post(url, "/tokenize", body) == post(url, "/v1/tokenize", body)
    body = {"input": "Hello, world", "model": "embedder"}
    assert post(url, "/embeddings", body) == post(url, "/v1/embeddings", body)


def test_tei_routes_say_where_their_time_went(url):
    tokens = post(url, "/v1/embed", {"inputs": "Dogs bark."})["usage"]["prompt_tokens"]
    res = web.post(url + "/embed", json={"inputs": "Dogs bark."})
    assert int(res.headers["x-compute-tokens"]) == tokens
    assert int(res.headers["x-compute-characters"]) == len("Dogs bark.")
    assert "inference;dur=" in res.headers["server-timing"]


def test_info_describes_a_model_as_tei_does(url):
    models = {m["id"]: m for m in web.get(url + "/v1/models").json()["data"]}
    info = web.get(url + "/info").json()  # unnamed: the model POST / serves
    assert (info["model_id"], info["model_type"], info["model_dtype"]) == (
        "embedder", {"embedding": {"pooling": models["embedder"]["pooling"]}}, "float32")
    assert info["max_input_length"] == models["embedder"]["max_length"]
    assert (info["max_client_batch_size"], info["max_batch_requests"], info["auto_truncate"]) \
        == (8, 32, True)  # DISTILSERVE_MAX_INPUTS, the CPU's batch size
    cross = web.get(url + "/info", params={"model": "cross"}).json()["model_type"]
    assert cross == {"reranker": {"id2label": {"0": "relevant"}, "label2id": {"relevant": 0}}}
    labels = models["classifier"]["labels"]
    assert web.get(url + "/info", params={"model": "classifier"}).json()["model_type"] == {
        "classifier": {"id2label": {str(i): label for i, label in enumerate(labels)},
                       "label2id": {label: i for i, label in enumerate(labels)}}}
    ner = web.get(url + "/info", params={"model": "tagger"})
    assert ner.status_code == 400 and "/v1/models/tagger" in ner.json()["error"]["message"]
    assert web.get(url + "/info", params={"model": "nope"}).status_code == 404
    assert web.get(url + "/models").json() == web.get(url + "/v1/models").json()  # Infinity's
