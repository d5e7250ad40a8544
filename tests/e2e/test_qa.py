"""End to end: extractive question answering (/v1/qa) equals transformers'
question-answering pipeline for the transformers families' QA models (BERT's and
DistilBERT's layouts); huggingface_hub's question_answering works against the root, and
tritonclient against the Open Inference Protocol."""

from __future__ import annotations

import json

import huggingface_hub
import huggingface_hub.constants
import huggingface_hub.errors
import huggingface_hub.utils
import numpy as np
import pytest
import tritonclient.http as triton

from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server, transformers_pipeline

QUESTIONS = [("Where is the tower?", "The Eiffel Tower stands in Paris, France, since 1889."),
             ("Who wrote it?", "Hamlet was written by William Shakespeare around 1600 in "
              "London, where it was first performed at the Globe.")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    return {family: checkpoint.save(checkpoint.new(family, "tiny", "qa", seed=3),
                                    root / family) for family in ("bert", "distilbert")}


@pytest.fixture(scope="module")
def url(exports, checkpoints, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("qa-repo")
    exports(checkpoints["bert"], repo / "bert", "onnx", check=False)
    exports(checkpoints["distilbert"], repo / "distilbert", "torchscript", check=False)
    exports(tiny_checkpoints["bert", "classify"], repo / "sentiment", "onnx", check=False)
    with running_server(repo, max_inputs=8) as url:
        yield url


def pipe(checkpoints, family):
    return transformers_pipeline("question-answering", checkpoints[family], family)


def qa(url, **body):
    return web.post(url + "/v1/qa", json=body, timeout=60)


def inputs(pairs=QUESTIONS):
    return [{"question": q, "context": c} for q, c in pairs]


@pytest.mark.parametrize("family", ["bert", "distilbert"])
@pytest.mark.parametrize("options", [
    {}, {"top_k": 3}, {"top_k": 3, "handle_impossible_answer": True},
    {"top_k": 2, "align_to_words": False, "max_answer_len": 3}])
def test_answers_equal_the_transformers_pipeline(url, checkpoints, family, options):
    res = qa(url, model=family, inputs=inputs(), **options)
    assert res.status_code == 200, res.text
    reference = pipe(checkpoints, family)
    for (question, context), ours in zip(QUESTIONS, res.json()["results"]):
        theirs = reference(question=question, context=context, **options)
        theirs = theirs if isinstance(theirs, list) else [theirs]
        assert [(a["start"], a["end"], a["answer"]) for a in ours] == [
            (a["start"], a["end"], a["answer"]) for a in theirs]
        np.testing.assert_allclose([a["score"] for a in ours],
                                   [a["score"] for a in theirs], atol=1e-5)
        for a in ours:
            assert context[a["start"]:a["end"]] == a["answer"]


def test_a_long_context_is_read_in_windows_as_the_pipeline_reads_it(url, checkpoints):
    context = " ".join(f"Line {i} says the tower is tall." for i in range(30))
    context += " It stands in Paris, France."
    reference = pipe(checkpoints, "bert")
    for options in ({"max_seq_len": 64, "doc_stride": 16, "top_k": 3},
                    {"max_seq_len": 48, "top_k": 2, "handle_impossible_answer": True}):
        res = qa(url, model="bert", inputs={"question": "Where is it?", "context": context},
                 **options)
        assert res.status_code == 200, res.text
        theirs = reference(question="Where is it?", context=context, **options)
        (ours,) = res.json()["results"]
        assert [(a["start"], a["end"], a["answer"]) for a in ours] == [
            (a["start"], a["end"], a["answer"]) for a in theirs]
        np.testing.assert_allclose([a["score"] for a in ours],
                                   [a["score"] for a in theirs], atol=1e-5)
    # every window was run: more tokens than one window holds
    assert int(res.headers["x-compute-tokens"]) > 3 * 48
    assert int(res.headers["x-compute-characters"]) == len("Where is it?") + len(context)


def test_a_question_is_never_cut(url):
    res = qa(url, model="bert", inputs=[{"question": "q", "context": "c"},
                                        {"question": "why " * 200, "context": "c"}])
    assert res.status_code == 413
    assert res.json()["error"]["message"].startswith(
        "input 1: its question is 202 tokens with [CLS] and [SEP], which leaves 0 of a "
        "128-token window (max_seq_len) to its context")
    res = qa(url, model="bert", inputs={"question": "why " * 40, "context": "c"},
             max_seq_len=64, doc_stride=30)  # room for 21 tokens of context: not over 30
    assert res.status_code == 413 and "not more than the windows' overlap, 30" in res.text
    res = qa(url, model="bert", inputs={"question": "q", "context": "c"}, max_seq_len=129)
    assert res.status_code == 422 and "more than the max_length of model 'bert', 128" in res.text


@pytest.mark.parametrize("body, status, message", [
    ({"model": "sentiment"}, 400, "model 'sentiment' does classify, not qa"),
    ({}, 400, "several models do qa (bert, distilbert)"),
    ({"model": "nope"}, 404, "unknown model 'nope'"),
    ({"model": "bert", "inputs": {"question": "", "context": "c"}}, 422, "question"),
    ({"model": "bert", "inputs": {"question": "q"}}, 422, "inputs.context"),
    ({"model": "bert", "top_k": 0}, 422, "top_k"),
    ({"model": "bert", "inputs": [{"question": "q", "context": "c"}] * 9}, 413, "9 inputs"),
    ({"model": "bert", "top_k": 2**31 - 1}, 413, "2147483647 answers (1 inputs x top_k "
     "2147483647); model 'bert' answers at most 2236962 at once (each up to 15 tokens)"),
])
def test_errors(url, body, status, message):
    res = qa(url, **{"inputs": inputs()[0], **body})
    assert res.status_code == status, res.text
    assert message in res.json()["error"]["message"]


def test_the_open_inference_protocol_answers_as_v1_qa(url):
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        meta = client.get_model_metadata("bert")
        assert [t["name"] for t in meta["inputs"]] == ["question", "context"]
        tensors = []
        for name, texts in (("question", [q for q, _ in QUESTIONS]),
                            ("context", [c for _, c in QUESTIONS])):
            tensor = triton.InferInput(name, [2], "BYTES")
            tensor.set_data_from_numpy(np.array(texts, dtype=object))
            tensors.append(tensor)
        got = client.infer("bert", tensors, parameters={"top_k": 2}).as_numpy("answers")
        with pytest.raises(triton.InferenceServerException) as lone:
            client.infer("bert", tensors[:1])
    finally:
        client.close()
    assert [json.loads(a) for a in got] == qa(url, model="bert", inputs=inputs(),
                                              top_k=2).json()["results"]
    assert lone.value.status() == "422"
    assert "takes question and context" in lone.value.message()


def test_huggingface_hubs_question_answering_at_the_root(exports, checkpoints, tmp_path, monkeypatch):
    exports(checkpoints["bert"], tmp_path / "lone" / "squad", "onnx", check=False)
    question, context = QUESTIONS[0]
    with running_server(tmp_path / "lone") as lone:
        expected = qa(lone, inputs=inputs()[:1], top_k=2).json()["results"][0]
        # the Inference API's answers: the one, or a list of them; for a list, each's
        root = web.post(lone + "/", json={"inputs": inputs()[0]}).json()
        assert root == expected[0]
        listed = web.post(lone + "/", json={"inputs": inputs(), "parameters": {"top_k": 2}})
        assert listed.json()[0] == expected
        windows = {"max_seq_len": 24, "doc_stride": 4}  # the pipeline's parameters too
        strided = web.post(lone + "/", json={"inputs": inputs()[1], "parameters": windows})
        assert strided.json() == qa(lone, inputs=inputs()[1], **windows).json()["results"][0][0]
        info = web.get(lone + "/info")  # TEI describes no such model
        assert info.status_code == 400 and "does qa, which TEI's /info" in info.text
        # the suite sets HF_HUB_OFFLINE (nothing downloads), under which huggingface_hub's
        # sessions refuse every request, this one to loopback too
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        huggingface_hub.utils.reset_sessions()
        try:
            got = huggingface_hub.InferenceClient(model=lone).question_answering(
                question, context, top_k=2)
        finally:
            monkeypatch.undo()
            huggingface_hub.utils.reset_sessions()
    assert [(a.answer, a.start, a.end) for a in got] == [
        (a["answer"], a["start"], a["end"]) for a in expected]
