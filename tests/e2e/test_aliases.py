"""A model answers to its folder's name and to its aliases (export --alias, in its
manifest, and DISTILSERVE_MODEL_ALIASES): code written for OpenAI's models sends theirs."""

from __future__ import annotations

import numpy as np

from tests import web
from tests.conftest import running_server


def test_a_model_answers_to_its_aliases(exports, tiny_checkpoints, tmp_path):
    import openai

    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx",
            aliases=["text-embedding-3-small"], check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "classify", "onnx", check=False)
    with running_server(repo, model_aliases="ada=embed,sentiment=classify") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        vectors = {name: client.embeddings.create(model=name, input="a text").data[0].embedding
                   for name in ("embed", "text-embedding-3-small", "ada")}
        assert np.allclose(vectors["embed"], vectors["ada"])
        assert np.allclose(vectors["embed"], vectors["text-embedding-3-small"])
        assert client.models.retrieve("ada").id == "embed"
        listed = {m["id"]: m.get("aliases") for m in
                  web.get(url + "/v1/models").json()["data"]}
        assert listed == {"embed": ["ada", "text-embedding-3-small"],
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
