"""End to end: Triton's explicit model control (DISTILSERVE_MODEL_CONTROL=explicit):
tritonclient's load_model and unload_model, over HTTP and gRPC, on the repository's folders
only; refused by default, and with several workers (of their own) or polling."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from pydantic import ValidationError
from tritonclient.utils import InferenceServerException

from distilserve.server.settings import Settings
from tests import web
from tests.conftest import running_server, unallocated_port


@pytest.fixture(scope="module")
def served(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("control")
    for task in ("embed", "classify"):
        exports(tiny_checkpoints["bert", task], repo / task, "onnx", check=False)
    port = unallocated_port()
    with running_server(repo, model_control="explicit", grpc_port=port) as url:
        yield repo, url, f"127.0.0.1:{port}"


@pytest.fixture
def client(served):
    client = triton.InferenceServerClient(served[1].removeprefix("http://"),
                                          network_timeout=120.0)
    yield client
    client.close()


def states(client) -> dict[str, tuple]:
    return {m["name"]: (m["state"], m.get("reason")) for m in
            client.get_model_repository_index()}


def said(error) -> str:
    """What the service said: the protocol's error, its message."""
    return error.value.message()


def classify(url: str) -> int:
    return web.post(url + "/v1/classify", json={"inputs": "A text."}, timeout=60).status_code


def test_a_model_unloaded_and_loaded_again_by_request(served, client):
    _, url, _ = served
    assert "model_repository" in client.get_server_metadata()["extensions"]
    assert states(client) == {"classify": ("READY", None), "embed": ("READY", None)}
    client.unload_model("classify", unload_dependents=True)  # (it has none)
    assert not client.is_model_ready("classify") and client.is_model_ready("embed")
    assert states(client)["classify"] == ("UNAVAILABLE", "unloaded")
    assert classify(url) == 404  # no served model classifies
    named = web.post(url + "/v1/classify", json={"model": "classify", "inputs": "A text."})
    assert named.status_code == 404 and "model 'classify' is not loaded (load it: POST " \
        "/v2/repository/models/classify/load)" in named.json()["error"]["message"]
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("classify")
    assert e.value.status() == "404" and "not served" in said(e)
    client.load_model("classify")
    assert client.is_model_ready("classify") and classify(url) == 200
    assert states(client)["classify"] == ("READY", None)


def test_only_the_repositorys_folders_are_loaded_and_as_they_are(served, client):
    for name in ("nope", "..", "../classify", "classify/.."):  # a path: no route's
        with pytest.raises(InferenceServerException) as e:
            client.load_model(name)
        assert e.value.status() == "404"
        assert "no model folder" in said(e) or "/" in name
    with pytest.raises(InferenceServerException) as e:
        client.load_model("classify", config='{"max_batch_size": 4}')
    assert e.value.status() == "422" and "configuration or files" in said(e)
    assert client.is_model_ready("classify")


def test_a_folder_added_is_listed_until_loaded_and_a_broken_one_says_why(served, client):
    repo, url, _ = served
    shutil.copytree(repo / "embed", repo / "embed-2")
    (repo / "broken").mkdir()
    try:
        assert states(client)["embed-2"] == ("UNAVAILABLE", "unloaded")
        client.load_model("embed-2")
        got = web.post(url + "/v1/embed", json={"model": "embed-2", "inputs": "x"}).json()
        want = web.post(url + "/v1/embed", json={"model": "embed", "inputs": "x"}).json()
        assert got["embeddings"] == want["embeddings"]
        with pytest.raises(InferenceServerException) as e:
            client.load_model("broken")
        assert e.value.status() == "400" and "failed to load" in said(e)
        state, reason = states(client)["broken"]
        assert state == "UNAVAILABLE" and "manifest" in reason
        assert web.get(url + "/ready").json()["failed"]["broken"] == reason
    finally:
        client.unload_model("embed-2")
        shutil.rmtree(repo / "embed-2")
        shutil.rmtree(repo / "broken")


def test_grpc_loads_and_unloads_as_http_does(served):
    _, url, address = served
    client = triton_grpc.InferenceServerClient(address)
    try:
        client.unload_model("embed")
        assert not client.is_model_ready("embed")
        with pytest.raises(InferenceServerException, match="StatusCode.NOT_FOUND"):
            client.unload_model("embed")
        client.load_model("embed")
        text = triton_grpc.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["x"], dtype=object))
        assert client.infer("embed", [text]).as_numpy("embedding").shape == (1, 32)
    finally:
        client.close()


def test_refused_by_default_and_with_workers_or_polling(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "embed", "onnx", check=False)
    with running_server(tmp_path) as url:
        res = web.post(url + "/v2/repository/models/embed/unload")
        assert res.status_code == 400
        assert "DISTILSERVE_MODEL_CONTROL=explicit" in res.json()["error"]
        assert "model_repository" not in web.get(url + "/v2").json()["extensions"]
    for other in ({"workers": 2}, {"poll_seconds": 5}):
        with pytest.raises(ValidationError, match="model_control explicit"):
            Settings(model_control="explicit", **other)
    # the shared engine process loads the models for all its front ends
    assert Settings(model_control="explicit", workers=2, engine="shared").workers == 2
