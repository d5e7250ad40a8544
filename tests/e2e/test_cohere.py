"""Cohere's Python client, as its users set it up (``cohere.ClientV2(base_url=...)`` and
v1's ``cohere.Client(base_url=...)``): embed in every type and rerank, against the /v1
routes' answers."""

from __future__ import annotations

import base64

import cohere
import numpy as np
import pytest

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server

TEXTS = ["The Eiffel Tower stands in Paris.", "Bananas are rich in potassium."]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("cohere")
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    cross = checkpoint.save(checkpoint.new("bert", "tiny", "classify", ["relevant"]),
                            repo.parent / "cohere-cross")
    exports(cross, repo / "cross", "onnx", relevant_label="relevant", check=False)
    with running_server(repo) as url:
        yield url


def test_embed_gives_every_type_of_v1s_embeddings(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    answer = client.embed(model="embed", texts=TEXTS, input_type="search_document",
                          embedding_types=["float", "int8", "uint8", "binary", "ubinary",
                                           "base64"])
    native = np.array(web.post(url + "/v1/embed", json={
        "model": "embed", "inputs": TEXTS}).json()["embeddings"], dtype=np.float32)
    e = answer.embeddings
    np.testing.assert_allclose(e.float_, native, atol=1e-6)
    assert np.array_equal(e.int8, np.round(native * 127).astype(int))
    assert np.array_equal(e.uint8, np.round((native + 1) * 127.5).astype(int))
    bits = np.packbits(native > 0, axis=-1)
    assert np.array_equal(e.ubinary, bits) and np.array_equal(e.binary, bits.astype(int) - 128)
    assert np.array_equal([np.frombuffer(base64.b64decode(s), "<f4") for s in e.base64],
                          np.array(e.float_, dtype=np.float32))
    assert answer.texts == TEXTS and answer.meta.billed_units.input_tokens > 0
    short = client.embed(model="embed", texts=TEXTS, input_type="search_query",
                         output_dimension=8)
    assert np.array(short.embeddings.float_).shape == (2, 8)


def test_rerank_is_v1s_rerank(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    answer = client.rerank(model="cross", query="Where is the Eiffel Tower?", documents=TEXTS,
                           top_n=2)
    native = web.post(url + "/v1/rerank", json={
        "model": "cross", "query": "Where is the Eiffel Tower?", "documents": TEXTS,
        "top_n": 2}).json()["results"]
    assert [(r.index, r.relevance_score) for r in answer.results] == [
        (r["index"], r["relevance_score"]) for r in native]


def test_errors_are_the_services(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    with pytest.raises(cohere.errors.NotFoundError):
        client.embed(model="nope", texts=TEXTS, input_type="search_document")
    with pytest.raises(cohere.errors.UnprocessableEntityError):
        client.embed(model="embed", texts=[], input_type="search_document")


def test_v1_client_embeds_and_reranks(url):
    client = cohere.Client(base_url=url, api_key="unused")
    native = np.array(web.post(url + "/v1/embed", json={
        "model": "embed", "inputs": TEXTS}).json()["embeddings"], dtype=np.float32)
    floats = client.embed(model="embed", texts=TEXTS)
    assert floats.response_type == "embeddings_floats" and floats.texts == TEXTS
    np.testing.assert_allclose(floats.embeddings, native, atol=1e-6)
    typed = client.embed(model="embed", texts=TEXTS, input_type="search_query",
                         embedding_types=["float", "int8"], truncate="END")
    assert typed.response_type == "embeddings_by_type"
    np.testing.assert_allclose(typed.embeddings.float_, native, atol=1e-6)
    assert np.array_equal(typed.embeddings.int8, np.round(native * 127).astype(int))
    assert typed.meta.billed_units.input_tokens > 0
    ranked = client.rerank(model="cross", query="Where is the Eiffel Tower?", documents=TEXTS)
    assert sorted(r.index for r in ranked.results) == [0, 1]
    with pytest.raises(cohere.core.ApiError, match="text 0 has 30000 characters") as e:
        client.embed(model="embed", texts=["x" * 30_000])
    assert e.value.status_code == 413
    with pytest.raises(cohere.errors.UnprocessableEntityError, match="input_type"):
        client.embed(model="embed", texts=TEXTS, input_type="poetry")
    with pytest.raises(cohere.errors.NotFoundError):
        client.embed(model="nope", texts=TEXTS)


def _native(url, texts):
    return np.array(web.post(url + "/v1/embed", json={"model": "embed", "inputs": texts}
                             ).json()["embeddings"], dtype=np.float32)


def _tokens(url, text):
    """The text's tokens of text, as /v1/tokenize gives them (character offsets)."""
    return web.post(url + "/v1/tokenize", json={"model": "embed", "inputs": text,
                                                "add_special_tokens": False}).json()[0]


def test_inputs_embed_their_text_parts_as_one_text(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    answer = client.embed(model="embed", input_type="search_document", inputs=[
        {"content": [{"type": "text", "text": TEXTS[0]}]},
        {"content": [{"type": "text", "text": "Bananas"}, {"type": "text", "text": "Rich."}]}])
    np.testing.assert_allclose(answer.embeddings.float_,
                               _native(url, [TEXTS[0], "Bananas\nRich."]), atol=1e-6)
    assert answer.texts == [TEXTS[0], "Bananas\nRich."]
    with pytest.raises(cohere.errors.UnprocessableEntityError, match="images are not served"):
        client.embed(model="embed", input_type="search_document", inputs=[{"content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    with pytest.raises(cohere.errors.UnprocessableEntityError, match="texts or inputs"):
        client.embed(model="embed", input_type="search_document", texts=TEXTS,
                     inputs=[{"content": [{"type": "text", "text": "a"}]}])


def test_max_tokens_cuts_each_text_as_truncate_says(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    tokens = _tokens(url, TEXTS[0])
    assert len(tokens) > 3
    first, last = TEXTS[0][:tokens[2]["stop"]], TEXTS[0][tokens[-3]["start"]:]
    end = client.embed(model="embed", texts=TEXTS, input_type="search_document",
                       max_tokens=3)
    np.testing.assert_allclose(end.embeddings.float_, _native(url, [first, TEXTS[1][
        :_tokens(url, TEXTS[1])[2]["stop"]]]), atol=1e-6)
    start = client.embed(model="embed", texts=TEXTS[:1], input_type="search_document",
                         max_tokens=3, truncate="START")
    np.testing.assert_allclose(start.embeddings.float_, _native(url, [last]), atol=1e-6)
    assert start.meta.billed_units.input_tokens == 3 + 2  # and [CLS], [SEP]
    roomy = client.embed(model="embed", texts=TEXTS, input_type="search_document",
                         max_tokens=len(tokens), truncate="NONE")
    np.testing.assert_allclose(roomy.embeddings.float_[0], _native(url, TEXTS[:1])[0],
                               atol=1e-6)
    with pytest.raises(cohere.core.ApiError, match=f"text 0 has {len(tokens)} tokens, "
                       "more than max_tokens 3") as e:
        client.embed(model="embed", texts=TEXTS, input_type="search_document",
                     max_tokens=3, truncate="NONE")
    assert e.value.status_code == 413


def test_rerank_cuts_each_document_to_max_tokens_per_doc(url):
    client = cohere.ClientV2(base_url=url, api_key="unused")
    query = "Where is the Eiffel Tower?"
    cut = [text[:_tokens(url, text)[1]["stop"]] for text in TEXTS]
    answer = client.rerank(model="cross", query=query, documents=TEXTS, max_tokens_per_doc=2)
    native = web.post(url + "/v1/rerank", json={"model": "cross", "query": query,
                                                "documents": cut}).json()["results"]
    assert [(r.index, r.relevance_score) for r in answer.results] == [
        (r["index"], r["relevance_score"]) for r in native]
    whole = client.rerank(model="cross", query=query, documents=TEXTS, max_tokens_per_doc=4096)
    assert sorted(r.relevance_score for r in whole.results) != sorted(
        r.relevance_score for r in answer.results)
    with pytest.raises(cohere.errors.UnprocessableEntityError, match="relevant spans"):
        client.rerank(model="cross", query=query, documents=TEXTS,
                      relevant_spans={"mode": "enabled"})
