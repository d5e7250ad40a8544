"""A model answers to its folder's name and to its aliases (export --alias, in its
manifest, and DISTILSERVE_MODEL_ALIASES): code written for OpenAI's models sends theirs."""

from __future__ import annotations

import numpy as np

from tests import web
from tests.conftest import running_server

HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def test_a_model_answers_to_its_aliases(exports, tiny_checkpoints, tmp_path):
    import openai

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx",
            aliases=["text-embedding-3-small", HUB_NAME], check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "classify", "onnx", check=False)
    with running_server(repo, model_aliases="ada=embed,sentiment=classify") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        vectors = {name: client.embeddings.create(model=name, input="a text").data[0].embedding
                   for name in ("embed", "text-embedding-3-small", "ada")}
        assert np.allclose(vectors["embed"], vectors["ada"])
        assert np.allclose(vectors["embed"], vectors["text-embedding-3-small"])
        assert client.models.retrieve("ada").id == "embed"
        # a Hub name, owner/name, on the routes that take a model in the path too
        assert client.models.retrieve(HUB_NAME).id == "embed"
        by_path = web.post(f"{url}/models/{HUB_NAME}", json={"inputs": "a text"})
        assert by_path.status_code == 200 and np.allclose(
            by_path.json()[0], vectors["embed"], atol=1e-6)
        listed = {m["id"]: m.get("aliases") for m in
                  web.get(url + "/v1/models").json()["data"]}
        assert listed == {"embed": ["ada", HUB_NAME, "text-embedding-3-small"],
                          "classify": ["sentiment"]}
        classified = web.post(url + "/v1/classify", json={"model": "sentiment",
                                                            "inputs": "fine"})
        assert classified.status_code == 200, classified.text
        infer = web.post(url + "/v2/models/ada/infer", json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a text"]}]})
        assert infer.status_code == 200 and np.allclose(
            infer.json()["outputs"][0]["data"], vectors["embed"], atol=1e-6)
        unknown = web.post(url + "/v1/embed", json={"model": "text-embedding-3-large",
                                                      "inputs": "x"})
        assert unknown.status_code == 404
