"""End to end: named entities of a text longer than the model's max_length, read whole in
overlapping windows (/v1/ner's ``stride``), equal transformers' token-classification
pipeline with its ``stride``; so do ``ignore_labels``; POST / (huggingface_hub's
token_classification) and the Open Inference Protocol take both."""

from __future__ import annotations

import json
import re

import huggingface_hub
import huggingface_hub.constants
import huggingface_hub.utils
import pytest
from transformers import AutoTokenizer, pipeline

from tests import web
from tests.conftest import running_server

MAX_LENGTH = 24  # windows of 22 tokens of text: the texts below are several
LONG = ("Angela Merkel visited Paris and Zürich with Café Müller GmbH. " * 3
        + "unaffable antidisestablishmentarianism [UNK] done in Cupertino with José Ñúñez.")
TEXTS = [LONG, "Dogs bark.", LONG[::-1]]


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ner")
    exports(tiny_checkpoints["bert", "ner"], repo / "tagger", "onnx",
            max_length=MAX_LENGTH, check=False)
    with running_server(repo, max_inputs=8) as url:
        yield url


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """The pipeline, its tokenizer's windows the served model's."""
    folder = tiny_checkpoints["bert", "ner"]
    tokenizer = AutoTokenizer.from_pretrained(folder, model_max_length=MAX_LENGTH)
    return lambda strategy: pipeline("token-classification", model=folder, device="cpu",
                                     tokenizer=tokenizer, aggregation_strategy=strategy)


def ner(url, **body):
    return web.post(url + "/v1/ner", json=body, timeout=60)


def same(text: str, ours: list[dict], theirs: list[dict]) -> None:
    """The same entities, scores within 1e-5 (words: the text's own, see postprocess)."""
    key = "entity" if ours and "entity" in ours[0] else "entity_group"
    assert [(e[key], e["start"], e["end"]) for e in ours] == [
        (e[key], e["start"], e["end"]) for e in theirs]
    assert all(abs(a["score"] - float(b["score"])) <= 1e-5 for a, b in zip(ours, theirs))
    assert all(text[e["start"]:e["end"]] == e["word"] for e in ours)


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
@pytest.mark.parametrize("stride", [0, 5, 21])
def test_strided_entities_equal_the_pipeline(url, reference, strategy, stride):
    res = ner(url, inputs=TEXTS, aggregation_strategy=strategy, stride=stride)
    assert res.status_code == 200, res.text
    pipe = reference(strategy)
    for text, ours in zip(TEXTS, res.json()["results"]):
        same(text, ours, pipe(text, stride=stride))
    # the whole text: entities past the first window too, where truncation stops at it
    cut = ner(url, inputs=LONG, aggregation_strategy=strategy).json()["results"][0]
    whole = res.json()["results"][0]
    assert max(e["end"] for e in whole) > len(LONG) - 20 > max(e["end"] for e in cut)


@pytest.mark.parametrize("strategy", ["none", "simple"])
@pytest.mark.parametrize("ignore_labels", [[], ["O", "PER"], ["B-ORG", "LOC"]])
def test_ignore_labels_are_the_pipelines(url, reference, strategy, ignore_labels):
    """Given, they replace O (the default), unstrided and strided, as the pipeline's do."""
    pipe = reference(strategy)
    for stride in [None] if strategy == "none" else [None, 3]:
        res = ner(url, inputs=TEXTS, aggregation_strategy=strategy,
                  ignore_labels=ignore_labels, stride=stride)
        assert res.status_code == 200, res.text
        for text, ours in zip(TEXTS, res.json()["results"]):
            options = {} if stride is None else {"stride": stride}
            same(text, ours, pipe(text, ignore_labels=ignore_labels, **options))
    everything = ner(url, inputs=LONG, ignore_labels=[]).json()["results"][0]
    assert "O" in {e["entity_group"] for e in everything}


def test_a_stride_leaving_a_window_nothing_new_and_an_unaggregated_one_are_422(url):
    res = ner(url, inputs=LONG, stride=MAX_LENGTH - 2)
    assert res.status_code == 422 and res.json()["error"]["message"] == (
        f"stride {MAX_LENGTH - 2}: model 'tagger' reads windows of {MAX_LENGTH - 2} tokens "
        f"of text (its max_length, {MAX_LENGTH}, less its special tokens); stride must be "
        "less")
    res = ner(url, inputs=LONG, stride=2, aggregation_strategy="none")
    assert res.status_code == 422 and "aggregation_strategy other than none" in res.text
    assert ner(url, inputs=LONG, stride=-1).status_code == 422
    # refused before anything ran: the model still answers
    assert ner(url, inputs=LONG, stride=3).status_code == 200


def test_the_root_and_the_open_inference_protocol_take_stride_and_ignore_labels(
        url, monkeypatch):
    options = {"aggregation_strategy": "first", "stride": 4, "ignore_labels": ["PER"]}
    expected = ner(url, inputs=LONG, **options).json()["results"][0]
    assert expected and max(e["end"] for e in expected) > len(LONG) - 20
    # the suite sets HF_HUB_OFFLINE (nothing downloads), under which huggingface_hub's
    # sessions refuse every request, these to loopback too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.utils.reset_sessions()
    try:
        got = huggingface_hub.InferenceClient(model=url).token_classification(LONG, **options)
    finally:
        monkeypatch.undo()
        huggingface_hub.utils.reset_sessions()
    assert [(t.entity_group, t.start, t.end, t.word) for t in got] == [
        (e["entity_group"], e["start"], e["end"], e["word"]) for e in expected]
    # the Open Inference Protocol's parameters are scalars: stride, not ignore_labels
    oip = web.post(url + "/v2/models/tagger/infer", timeout=60, json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [LONG]}],
        "parameters": {"aggregation_strategy": "first", "stride": 4}})
    assert oip.status_code == 200, oip.text
    assert json.loads(oip.json()["outputs"][0]["data"][0]) == ner(
        url, inputs=LONG, aggregation_strategy="first", stride=4).json()["results"][0]


def test_more_windows_than_the_queue_holds_is_a_413_naming_them(exports, tiny_checkpoints, tmp_path):
    exports(tiny_checkpoints["bert", "ner"], tmp_path / "tagger", "onnx",
            max_length=MAX_LENGTH, check=False)
    with running_server(tmp_path, max_queue=20) as url:
        res = ner(url, inputs=[LONG, "Dogs bark."], stride=21)  # one token on each time
        assert res.status_code == 413
        assert re.fullmatch(r"model 'tagger': \d+ windows of 2 input\(s\) are more than its "
                            r"queue holds \(20, DISTILSERVE_MAX_QUEUE\), a smaller stride "
                            r"makes fewer; send fewer per request",
                            res.json()["error"]["message"])
        assert ner(url, inputs=[LONG, "Dogs bark."], stride=0).status_code == 200
