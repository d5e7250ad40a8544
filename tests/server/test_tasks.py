"""distilserve/server/core/tasks.py against fake engines: each task's pipeline picks its
model, checks what only the model can refuse, and finishes its answers from the outputs,
with no transport and no export."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from distilserve.server.core import tasks
from distilserve.server.core.refusals import Refusal
from distilserve.server.core.runner import Result
from tests.server.test_inference import call, engine


def outputs(rows, postprocessed=None):
    """An engine.infer that answers ``rows`` (and their batch-postprocessed copies), and
    what it was asked."""
    asked = []

    async def run(texts):
        asked.append(texts)
        return Result(list(rows), len(texts), 0, 0, 0, 0, "cpu", postprocessed)

    return run, asked


def run(coroutine):
    return asyncio.run(coroutine)


def refused(coroutine) -> Refusal:
    with pytest.raises(Refusal) as e:
        run(coroutine)
    return e.value


def test_classify_answers_the_models_own_scores_or_the_function_asked():
    logits = [np.array([2.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)]
    model_run, _ = outputs(logits, postprocessed=[np.array([0.9, 0.1]), np.array([0.3, 0.7])])
    m = engine(model_run, task="classify", labels=["neg", "pos"], multi_label=False)
    _, results, _ = run(tasks.classify(call(m), None, ["a", "b"], "right", top_k=1))
    assert [[r["label"] for r in each] for each in results] == [["neg"], ["pos"]]
    _, raw, _ = run(tasks.classify(call(m), None, ["a", "b"], "right", function="none"))
    assert raw[0] == [{"label": "neg", "score": 2.0}, {"label": "pos", "score": 0.0}]


def test_zero_shot_runs_each_text_with_each_hypothesis_and_names_the_pair():
    model_run, asked = outputs([np.array([0.0, 1.0, 3.0], np.float32)] * 4)
    m = engine(model_run, task="classify", labels=["contradiction", "neutral", "entailment"],
               entailment=2)
    _, results, _ = run(tasks.zero_shot(call(m), None, ["t1", "t2"], ["x", "y"],
                                        ["is x", "is y"], "right"))
    assert asked == [[("t1", "is x"), ("t1", "is y"), ("t2", "is x"), ("t2", "is y")]]
    assert [len(each) for each in results] == [2, 2]
    too_long = refused(tasks.zero_shot(call(m, max_input_chars=6), None, ["t1"], ["x"],
                                       ["is x!"], "right"))
    assert too_long.message.startswith("input 0 with candidate label 'x' has 7 characters")


def test_a_cross_encoder_scores_its_relevant_label_and_an_embedder_its_cosine():
    model_run, asked = outputs([np.array([0.0, 1.0])] * 2,
                               postprocessed=[np.array([0.2, 0.8]), np.array([0.6, 0.4])])
    cross = engine(model_run, task="classify", labels=["no", "yes"], relevant=1,
                   manifest=SimpleNamespace(relevant_label="yes", num_iterations=None))
    _, scores, _ = run(tasks.score(call(cross), None, ["q"], ["d1", "d2"], "right"))
    assert asked == [[("q", "d1"), ("q", "d2")]] and scores.tolist() == pytest.approx([0.8, 0.4])
    _, logits, _ = run(tasks.score(call(cross), None, ["q"], ["d1", "d2"], "right",
                                   raw_scores=True))
    assert logits.tolist() == [1.0, 1.0]
    vectors = [np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    embed_run, asked = outputs(vectors)
    embedder = engine(embed_run, prompts={"query": "q: "})
    _, cosines, _ = run(tasks.score(call(embedder), None, ["q"], ["same", "other"], "right"))
    assert asked == [["q: q", "same", "other"]]  # the query behind its prompt
    assert cosines.tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


def test_pairs_of_a_query_each_are_scored_pair_by_pair():
    model_run, asked = outputs([np.array([0.0, 1.0])] * 2,
                               postprocessed=[np.array([0.2, 0.8]), np.array([0.6, 0.4])])
    cross = engine(model_run, task="classify", labels=["no", "yes"], relevant=1,
                   manifest=SimpleNamespace(relevant_label="yes", num_iterations=None))
    _, scores, _ = run(tasks.score(call(cross), None, ["q1", "q2"], ["d1", "d2"], "right"))
    assert asked == [[("q1", "d1"), ("q2", "d2")]] and scores.tolist() == pytest.approx(
        [0.8, 0.4])
    vectors = [np.array([1.0, 0.0]), np.array([0.0, 2.0]), np.array([3.0, 0.0]),
               np.array([1.0, 1.0])]
    embed_run, asked = outputs(vectors)
    _, cosines, _ = run(tasks.score(call(engine(embed_run)), None, ["a", "b"], ["c", "d"],
                                    "right"))
    assert asked == [["a", "b", "c", "d"]]
    assert cosines.tolist() == pytest.approx([1.0, 2 ** -0.5], abs=1e-6)


def test_what_the_model_cannot_do_is_refused_before_it_runs():
    never, asked = outputs([])
    text = SimpleNamespace(mask_token="[MASK]", room=6, vocab_size=10)
    filler = engine(never, task="fill-mask", text=text, max_length=8)
    e = refused(tasks.fill(call(filler), None, ["no mask"], "right", 5))
    assert (e.message, e.input) == (
        "input 0 has no [MASK]: the mask token of model 'm', which fill-mask fills", "input 0")
    tagger = engine(never, task="ner", text=text, max_length=8, labels=["O"])
    assert refused(tasks.recognise(call(tagger), None, ["a"], None, "simple", (),
                                   stride=6)).message.startswith("stride 6: model 'm' reads "
                                                                 "windows of 6 tokens")
    reader = engine(never, task="qa", text=text, max_length=8)
    assert refused(tasks.answer(call(reader), None, [("q", "c")], 1, 15, False, True,
                                max_seq_len=9)).message == (
        "max_seq_len 9 is more than the max_length of model 'm', 8")
    for pair, empty in ((("", "c"), "question"), (("q", ""), "context")):
        e = refused(tasks.answer(call(reader), None, [("q", "c"), pair], 1, 15, False, True))
        assert (e.message, e.input) == (f"input 1: its {empty} is empty", "input 1")
    assert asked == []
