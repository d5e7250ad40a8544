"""A few distillation steps of every family from a tiny teacher: the objective goes down
on a fixed batch, and the student is a normal checkpoint that exports and serves."""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from distilserve.models import export
from distilserve.models.io import checkpoint
from distilserve.training import STUDENT_PRESET, corpus, distill, students
from tests import web
from tests.conftest import running_server, said_to

pytestmark = pytest.mark.slow  # training

STUDENTS = {"minialbert": "tiny", "falbert": "tiny", "cmow": "tiny", "bert": None}


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    """``distill.Options`` with one cache of the sentences read for the module's runs (a
    run's subject is not the reading, which has its own test)."""
    return functools.partial(distill.Options, cache_dir=tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny BERT teacher (2 layers, 4 heads, 32 wide), like the tiny students, with
    weights large enough that its layers differ (at the usual 0.02 its attention is
    uniform and a student copied from its first layer has nothing to learn)."""
    path = tmp_path_factory.mktemp("teacher")
    return checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=1,
                                          overrides={"initializer_range": 0.3}), path)


@pytest.mark.parametrize("family", list(STUDENTS))
def test_a_few_steps_lower_the_loss_and_the_student_exports_and_serves(options, teacher,
                                                                      tmp_path, family):
    opts = options(family=family, output=tmp_path / "student", preset=STUDENTS[family],
                   steps=8, batch_size=8, max_length=32, lr=3e-3, teacher=teacher,
                   save_every=4, held_out=40, corpus_limit=3000)
    record = distill.distill(opts, progress=lambda s: None)
    for stage in record["stages"]:  # F-ALBERT: LR-ALBERT from the teacher, then IP from it
        assert stage["fixed_batch_loss_after"] < stage["fixed_batch_loss_before"], stage
    # the recorded fidelity is what the saved student does on the held-out sentences, in
    # eval mode (dropout off)
    student = checkpoint.load(opts.output)
    teacher_ckpt = checkpoint.load(teacher)
    _, held = corpus.sentences(limit=opts.corpus_limit, seed=opts.seed, cache=opts.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(teacher_ckpt.tokenizer_dir))
    again = distill.fidelity(
        distill.embed_all(teacher_ckpt.model, tokenizer, held[:40], opts.max_length),
        distill.embed_all(student.model, tokenizer, held[:40], opts.max_length))
    assert again == pytest.approx(record["fidelity"], abs=1e-5)
    assert record["fidelity"]["sentences"] == 40
    saved = student.extra.get("distillation") or student.model.model.config.distillation
    assert saved["steps"] == 8
    assert saved["preset"] == (STUDENTS[family] or STUDENT_PRESET[family])
    export.export(opts.output, tmp_path / "repo" / family, "onnx")
    with running_server(tmp_path / "repo") as url:
        res = web.post(url + "/v1/embed", json={"inputs": ["a sentence", "another one"]})
        assert res.status_code == 200 and len(res.json()["embeddings"]) == 2


@pytest.fixture(scope="module")
def wide_teacher(tmp_path_factory):
    """Wider than every tiny student and with more heads (48 wide, 6 heads, 3 layers)."""
    path = tmp_path_factory.mktemp("wide-teacher")
    return checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=1, overrides={
        "initializer_range": 0.3, "hidden_size": 48, "num_attention_heads": 6,
        "intermediate_size": 96, "num_hidden_layers": 3}), path)


@pytest.mark.parametrize("family", ["bert", "minialbert", "falbert", "cmow"])
def test_a_student_narrower_than_the_teacher_learns(options, wide_teacher, tmp_path, family):
    """32 wide and 4 heads against 48 and 6: a learned map to the teacher's width, and
    attention compared head-averaged."""
    opts = options(family=family, output=tmp_path / "student", preset="tiny",
                   steps=6, batch_size=8, max_length=32, lr=3e-3,
                   teacher=wide_teacher, save_every=3, held_out=30, corpus_limit=2000)
    record = distill.distill(opts, progress=lambda s: None)
    for stage in record["stages"]:
        assert stage["fixed_batch_loss_after"] < stage["fixed_batch_loss_before"], stage
    student = checkpoint.load(opts.output)
    assert student.family == family and record["preset"] == "tiny"
    width = student.config.get("hidden_size") or student.config.get("projection_size")
    assert width != 48 or family == "cmow"  # CMOW keeps its projection to the teacher


def test_a_preset_that_cannot_learn_from_the_teacher_is_refused_before_training(
        options, wide_teacher, tmp_path):
    opts = options(family="minialbert", output=tmp_path / "s", preset="tiny",
                   steps=2, max_length=200, teacher=wide_teacher)
    with pytest.raises(ValueError, match="minialbert preset 'tiny' takes at most 128 tokens"):
        distill.distill(opts, progress=lambda s: None)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("family", ["distilbert", "minialbert", "cmow"])
def test_a_teacher_not_of_the_bert_family_is_refused_before_training(options, tmp_path, family):
    teacher = checkpoint.save(checkpoint.new(family, "tiny", "embed"), tmp_path / "teacher")
    opts = options(family="bert", output=tmp_path / "s", steps=2, teacher=teacher)
    with pytest.raises(ValueError, match=f"^--teacher {teacher}: a {family} checkpoint, where "
                       "a teacher is a bert-family encoder"):
        distill.distill(opts, progress=lambda s: None)
    assert not (tmp_path / "s").exists()


def test_a_batch_larger_than_the_sentences_read_is_refused(options, teacher, tmp_path):
    opts = options(family="bert", output=tmp_path / "s", preset="tiny", steps=2,
                   batch_size=5000, corpus_limit=2000, teacher=teacher)
    with pytest.raises(ValueError, match="sentences to train on \\(of 2000 to read\\), fewer "
                                         "than a batch of 5000: read more"):
        distill.distill(opts, progress=lambda s: None)


def test_resumes_from_the_last_save(options, teacher, tmp_path):
    opts = options(family="minialbert", output=tmp_path / "s", preset="tiny", steps=4,
                   batch_size=4, max_length=16, teacher=teacher, save_every=2,
                   held_out=20, corpus_limit=2000)
    distill.distill(opts, progress=lambda s: None)
    seen = []
    opts.steps = 6
    distill.distill(opts, progress=seen.append)
    steps = [s for s in seen if s.startswith("distill step")]
    assert steps and all(not s.startswith("distill step 1/") for s in steps)


def test_a_run_cut_short_resumes_at_the_same_learning_rate(options, teacher, tmp_path,
                                                         monkeypatch, recwarn):
    """Cut after its first save (step 2 of 6), a run resumes there with its schedule where
    it was: at its next save (step 4) the learning rate is a whole run's, and the schedule
    is not stepped before the optimiser (torch warns when it is)."""
    rates = {}  # (run, step) -> the learning rate saved with that step
    torch_save = torch.save

    def save_state(state, path):
        rates[path.parent.name, state["step"]] = state["optimizer"]["param_groups"][0]["lr"]
        torch_save(state, path)

    def run(output):
        distill.distill(options(family="minialbert", output=output, preset="tiny",
                                steps=6, batch_size=4, max_length=16, teacher=teacher,
                                save_every=2, held_out=20, corpus_limit=2000),
                        progress=lambda s: None)

    monkeypatch.setattr(distill.torch, "save", save_state)
    run(tmp_path / "whole")
    save_student = checkpoint.save
    cut = []

    def save_then_cut(*args, **kwargs):
        cut.append(args)
        if len(cut) == 2:  # the second save, at step 4, does not happen
            raise KeyboardInterrupt
        return save_student(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", save_then_cut)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut")
    monkeypatch.setattr(checkpoint, "save", save_student)
    run(tmp_path / "cut")
    assert rates["cut", 4] == rates["whole", 4] > 0
    assert rates["cut", 2] == rates["whole", 2] != rates["whole", 4]
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


def test_a_run_that_diverges_is_stopped_and_keeps_its_last_save(options, teacher, tmp_path,
                                                              monkeypatch):
    """A loss of NaN at step 3 (after the save at step 2): stopped there, saying so, the
    student saved at step 2 kept as it was (its weights finite)."""
    make_loss, calls = distill.make_loss, []

    def nan_at_step_3(*args):
        loss_fn, extra = make_loss(*args)

        def loss(batch, target):
            calls.append(1)  # the first call is the fixed batch's, before step 1
            value, parts = loss_fn(batch, target)
            return (value * float("nan") if len(calls) == 4 else value), parts

        return loss, extra

    monkeypatch.setattr(distill, "make_loss", nan_at_step_3)
    opts = options(family="cmow", output=tmp_path / "s", preset="tiny", steps=6,
                   batch_size=4, max_length=16, lr=1e-3, teacher=teacher, save_every=2,
                   held_out=20, corpus_limit=2000)
    with pytest.raises(distill.Diverged, match=(
            "^distill step 3/6: the loss is nan: the training diverged at --lr 0.001, and "
            f"was stopped; {opts.output} keeps the student of step 2, which a run there "
            "resumes at the same rate: distil again with a lower --lr$")):
        distill.distill(opts, progress=lambda s: None)
    assert torch.load(opts.output / distill.STATE, weights_only=True)["step"] == 2
    checkpoint.load(opts.output)  # (weights holding NaN would be refused)


def test_a_bert_students_run_says_nothing_of_its_attention_maps(options, teacher, tmp_path):
    """transformers' warning, at the first attention maps of a BERT loaded with SDPA
    attention, that it computes them as eager attention does (once a process: its record
    of having said it is cleared first)."""
    logging.Logger.warning_once.cache_clear()
    with said_to("transformers.models.bert.modeling_bert") as said:
        distill.distill(options(family="bert", output=tmp_path / "s", preset="tiny", steps=2,
                                batch_size=4, max_length=16, teacher=teacher, held_out=20,
                                corpus_limit=2000), progress=lambda s: None)
        assert not [m for m in said if "SdpaSelfAttention" in m]
        logging.getLogger("transformers.models.bert.modeling_bert").warning_once(
            "BertSdpaSelfAttention is used but ...")  # outside a run: said
        assert said


def test_fidelity_of_identical_embeddings_is_perfect():
    e = np.random.default_rng(0).normal(size=(30, 8))
    scores = distill.fidelity(e, e.copy())
    assert scores["spearman"] > 0.999 and scores["top10_overlap"] == 1.0
    assert distill.fidelity(e, np.random.default_rng(1).normal(size=(30, 8)))["spearman"] < 0.5


@pytest.mark.parametrize("family", ["minialbert", "falbert"])
def test_recursive_students_start_from_the_teacher(teacher, family):
    """The shared layer is the teacher's first layer, and the factorised embedding (rank
    16 of 32) points where the teacher's embedding does; random weights do not."""
    t = students.Teacher(teacher)
    student = students.new_student(family, "tiny", t, seed=0).model
    _, shared = students.ALBERT_PARTS[family]
    params = dict(student.named_parameters())
    assert torch.equal(params[shared + ".attention.query.weight"],
                       t.hf.encoder.layer[0].attention.self.query.weight)
    ids = torch.randint(1000, 30000, (4, 12), generator=torch.Generator().manual_seed(0))
    types = torch.zeros_like(ids)
    target = t.hf.embeddings(input_ids=ids, token_type_ids=types)  # [B, T, D]

    def agreement(model):
        return F.cosine_similarity(model.embed(ids, types), target, dim=-1).mean()

    assert agreement(student) > 0.5
    assert agreement(checkpoint.new(family, "tiny", "embed", seed=0).model) < 0.2


def test_falbert_resumes_each_stage_from_its_own_save(options, teacher, tmp_path):
    opts = options(family="falbert", output=tmp_path / "s", preset="tiny", steps=4,
                   batch_size=4, max_length=16, teacher=teacher, save_every=2,
                   held_out=20, corpus_limit=2000)
    distill.distill(opts, progress=lambda s: None)  # LR steps 1-2, IP steps 3-4
    seen = []
    opts.steps = 8  # LR goes on to step 4, then IP from the LR-ALBERT's step 4
    distill.distill(opts, progress=seen.append)
    lr = [s for s in seen if s.startswith("lr step")]
    assert lr and all(s.startswith(("lr step 3/", "lr step 4/")) for s in lr), lr
    assert any(s.startswith("ip step 8/8") for s in seen)


def test_the_corpus_says_how_far_along_it_is_and_is_read_once(tmp_path, monkeypatch):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(1000):
        (root / f"m{i:04}.py").write_text(
            f'"""The module number {i} holds a sentence that is long enough to keep. '
            f'It also holds another sentence, which is quite different from the first."""\n')
    said = []
    first = corpus.sentences(limit=5000, roots=[root], progress=said.append,
                             cache=tmp_path / "cache")
    assert len(first[0]) + len(first[1]) == 1001  # (the second sentences: one)
    assert said and said[0].startswith("reading sentences from installed docstrings: ")
    assert "from 500 files" in said[0]
    (kept,) = (tmp_path / "cache").glob("corpus-*.json")

    def unread(path):
        raise AssertionError(f"read {path} again")

    monkeypatch.setattr(corpus, "_docstrings", unread)
    assert corpus.sentences(limit=5000, roots=[root], cache=tmp_path / "cache") == first
    assert corpus.sentences(limit=5000, roots=[root], seed=1, cache=tmp_path / "cache") != first


@pytest.mark.parametrize("family", ["minialbert", "falbert"])
def test_any_depth_trains_every_exit_and_fidelity_is_recorded_by_depth(options, teacher,
                                                                       tmp_path, family):
    """--any-depth: the output loss is the mean over every iteration's exit (not the last
    one's alone), and a recursive student's fidelity is recorded at each depth, the last
    being its fidelity."""
    runs = {}
    for any_depth in (False, True):
        opts = options(family=family, output=tmp_path / f"s-{any_depth}", preset="tiny",
                       steps=4, batch_size=8, max_length=32, lr=3e-3,
                       teacher=teacher, held_out=40, corpus_limit=3000,
                       any_depth=any_depth)
        runs[any_depth] = distill.distill(opts, progress=lambda s: None)
    for record in runs.values():
        depths = record["fidelity_by_depth"]
        assert list(depths) == [str(d) for d in range(1, len(depths) + 1)] and len(depths) > 1
        assert depths[str(len(depths))] == pytest.approx(record["fidelity"], abs=1e-6)
    assert runs[True]["any_depth"] and not runs[False]["any_depth"]
    assert runs[True]["stages"][-1]["fixed_batch_loss_before"] != pytest.approx(
        runs[False]["stages"][-1]["fixed_batch_loss_before"])  # another objective
