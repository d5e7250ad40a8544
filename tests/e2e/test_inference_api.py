"""huggingface_hub's InferenceClient against ``POST /models/{name}`` (the Hugging Face
Inference API by model), on one service holding a model of every task: each task method
a served model can answer, answered as that model's native route answers it."""

from __future__ import annotations

import huggingface_hub
import numpy as np
import pytest

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server

TEXT = "Angela Merkel visited Paris with Volkswagen."
NLI = ["entailment", "neutral", "contradiction"]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("inference-api")
    repo = root / "repo"
    for task in ("embed", "classify", "ner"):
        exports(tiny_checkpoints["bert", task], repo / task, "onnx", check=False)
    for name, task, labels in (("fill", "fill-mask", None), ("qa", "qa", None),
                               ("nli", "classify", NLI)):
        made = checkpoint.save(checkpoint.new("bert", "tiny", task, labels, seed=5),
                               root / name)
        exports(made, repo / name, "onnx", task=task, check=False)
    with running_server(repo) as url:
        yield url


@pytest.fixture
def client(url):
    """A client of a model's URL (the suite sets HF_HUB_OFFLINE, under which
    huggingface_hub's sessions refuse every request, to loopback too)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.utils.reset_sessions()
    yield lambda name: huggingface_hub.InferenceClient(model=f"{url}/models/{name}")
    patch.undo()
    huggingface_hub.utils.reset_sessions()


def native(url, route, **body):
    res = web.post(url + route, json=body, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def test_every_task_method_is_answered_by_its_model(url, client):
    vector = client("embed").feature_extraction(TEXT)
    assert np.allclose(np.ravel(vector), native(url, "/v1/embed", model="embed",
                                                inputs=TEXT)["embeddings"][0], atol=1e-6)
    similar = client("embed").sentence_similarity(TEXT, other_sentences=[TEXT, "Bananas."])
    assert similar[0] == pytest.approx(1.0, abs=1e-5) and len(similar) == 2

    labels = client("classify").text_classification(TEXT, top_k=2)
    expected = native(url, "/v1/classify", model="classify", inputs=TEXT)["results"][0]
    assert [(x.label, x.score) for x in labels] == [
        (e["label"], pytest.approx(e["score"], abs=1e-6)) for e in expected[:2]]

    tokens = client("ner").token_classification(TEXT, aggregation_strategy="simple")
    entities = native(url, "/v1/ner", model="ner", inputs=TEXT,
                      aggregation_strategy="simple")["results"][0]
    assert [(t.entity_group, t.start, t.end) for t in tokens] == [
        (e["entity_group"], e["start"], e["end"]) for e in entities]

    filled = client("fill").fill_mask("Paris is the [MASK] of France.", top_k=3)
    assert len(filled) == 3 and all("[MASK]" not in f.sequence for f in filled)

    answer = client("qa").question_answering(question="Who visited Paris?", context=TEXT)
    assert answer.answer == TEXT[answer.start:answer.end]

    ranked = client("nli").zero_shot_classification(TEXT, ["politics", "sport"])
    assert sorted(r.label for r in ranked) == ["politics", "sport"]


def test_a_model_asked_for_another_task_is_refused(url):
    res = web.post(url + "/models/embed", json={"inputs": TEXT, "parameters": {
        "candidate_labels": ["a", "b"]}})
    assert res.status_code == 400, res.text
    assert web.post(url + "/models/nope", json={"inputs": TEXT}).status_code == 404


def test_another_tasks_parameters_are_refused_with_the_url_to_use(url, client):
    """POST / answers for the embedding model; a body whose parameters are another task's
    gets a 400 naming the URLs whose models take them, not an answer of another shape."""
    root = web.post(url + "/", json={"inputs": TEXT, "parameters": {"top_k": 2}})
    assert root.status_code == 400
    assert root.json()["error"]["message"] == (
        "parameters top_k are not feature extraction's, which model 'embed' does here; post "
        "them to /models/classify or /models/fill or /models/nli or /models/qa")
    assert web.post(url + "/", json={"inputs": TEXT}).status_code == 200  # as before
    at_root = huggingface_hub.InferenceClient(model=url)
    huggingface_hub.utils.reset_sessions()
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError, match="/models/ner"):
        at_root.token_classification(TEXT, aggregation_strategy="simple")
    wrong = web.post(url + "/models/ner", json={"inputs": TEXT, "parameters": {
        "function_to_apply": "none"}})
    assert wrong.status_code == 400 and "/models/classify" in wrong.text
    nowhere = web.post(url + "/models/ner", json={"inputs": TEXT, "parameters": {"x": 1}})
    assert nowhere.status_code == 400 and "no served model's task takes them" in nowhere.text
