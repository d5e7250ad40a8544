"""LlamaIndex's OpenAIEmbedding as its users set it up: an OpenAI model name (an alias of
the served model) and the service's URL as ``api_base``."""

from __future__ import annotations

import numpy as np
import pytest

from tests import web
from tests.conftest import running_server

TEXTS = ["The Eiffel Tower stands in Paris.", "Bananas are rich in potassium.", "x"]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("llama-index")
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    with running_server(repo, model_aliases="text-embedding-3-small=embed") as url:
        yield url


def test_embeddings_are_the_services(url):
    from llama_index.embeddings.openai import OpenAIEmbedding

    model = OpenAIEmbedding(model_name="text-embedding-3-small", api_base=url + "/v1",
                            api_key="unused")
    expected = [d["embedding"] for d in web.post(url + "/v1/embeddings", json={
        "model": "embed", "input": TEXTS}).json()["data"]]
    assert np.allclose(model.get_text_embedding_batch(TEXTS), expected, atol=1e-6)
    assert np.allclose(model.get_query_embedding(TEXTS[0]), expected[0], atol=1e-6)


def test_an_unknown_model_is_the_services_404(url):
    import openai
    from llama_index.embeddings.openai import OpenAIEmbedding

    model = OpenAIEmbedding(model_name="text-embedding-3-large", api_base=url + "/v1",
                            api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown model 'text-embedding-3-large'"):
        model.get_text_embedding(TEXTS[0])
