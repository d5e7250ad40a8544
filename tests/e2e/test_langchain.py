"""LangChain's OpenAIEmbeddings as its users set it up: every default, which tokenises
each text with tiktoken's cl100k_base and sends the token ids (DISTILSERVE_TOKEN_IDS
cl100k_base reads them), and check_embedding_ctx_length=False, which sends the text."""

from __future__ import annotations

import numpy as np
import pytest

from tests import web
from tests.conftest import running_server

TEXTS = ["The Eiffel Tower stands in Paris.", "naïve café, 🎉 and a long " + "word " * 400,
         "Straße\nnew line\ttab", "x"]


@pytest.fixture(scope="module")
def offline_tiktoken(tiktoken_cache):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache))
        yield


@pytest.fixture(scope="module")
def repo(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("langchain")
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    made = exports(tiny_checkpoints["bert", "embed"], repo / "o200k", "onnx", check=False)
    made.model_copy(update={"token_ids": "o200k_base"}).write(repo / "o200k")
    return repo


def texts_embedded(url: str) -> np.ndarray:
    answer = web.post(url + "/v1/embeddings", json={"model": "embed", "input": TEXTS})
    return np.array([d["embedding"] for d in answer.json()["data"]])


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_every_default_embeds_the_texts(repo, offline_tiktoken):
    from langchain_openai import OpenAIEmbeddings

    with running_server(repo, token_ids="cl100k_base",
                        model_aliases="text-embedding-3-small=embed") as url:
        client = OpenAIEmbeddings(model="text-embedding-3-small", base_url=url + "/v1",
                                  api_key="unused")
        assert client.check_embedding_ctx_length  # ids, not text, go over the wire
        expected = texts_embedded(url)
        assert cosines(client.embed_documents(TEXTS), expected).min() >= 0.9999
        assert cosines(client.embed_query(TEXTS[0]), expected[0]) >= 0.9999
        listed = web.get(url + "/v1/models").json()["data"][0]
        assert listed["token_ids"] == "cl100k_base"
        # a text longer than LangChain's context: embedded in chunks, averaged by LangChain
        chunked = OpenAIEmbeddings(model="text-embedding-3-small", base_url=url + "/v1",
                                   api_key="unused", embedding_ctx_length=4)
        assert np.isclose(np.linalg.norm(chunked.embed_query(TEXTS[0])), 1)
        wrong = web.post(url + "/v1/embeddings", json={"model": "embed",
                                                         "input": [[9906, 100277]]})
        assert wrong.status_code == 422 and "token id 100277 is not in cl100k_base" in \
            wrong.json()["error"]["message"]


def test_the_models_own_ids_by_default(repo, offline_tiktoken):
    import bpe_openai
    from langchain_openai import OpenAIEmbeddings

    with running_server(repo) as url:
        client = OpenAIEmbeddings(model="embed", base_url=url + "/v1", api_key="unused")
        ids = client._tokenize(["The Eiffel Tower"], 1)[1][0]
        own = web.post(url + "/v1/embeddings", json={"model": "embed", "input": [ids]})
        text = web.post(url + "/v1/embeddings", json={"model": "embed",
                                                        "input": ["The Eiffel Tower"]})
        assert own.status_code == 200 and cosines(own.json()["data"][0]["embedding"],
                                                  text.json()["data"][0]["embedding"]) < 0.99
        o200k = bpe_openai.get_encoding("o200k_base").encode(TEXTS[0])
        by_manifest = web.post(url + "/v1/embeddings", json={"model": "o200k",
                                                               "input": [o200k]})
        assert cosines(by_manifest.json()["data"][0]["embedding"],
                       texts_embedded(url)[0]) >= 0.9999
        plain = OpenAIEmbeddings(model="embed", base_url=url + "/v1", api_key="unused",
                                 check_embedding_ctx_length=False)
        assert cosines(plain.embed_documents(TEXTS), texts_embedded(url)).min() >= 0.9999
