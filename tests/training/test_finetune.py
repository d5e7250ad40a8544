"""Fine-tuning: its batches (grouped by length, every sentence once, with its own labels)
and the MiniLM it starts from."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from distilserve.models.io import checkpoint
from distilserve.training import finetune, synthetic
from tests.conftest import said_to


def test_grouping_by_length_keeps_every_sentence_and_its_labels_with_less_padding():
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.minilm_path()))
    data = synthetic.sentiment(300, 0)
    texts, labels = [t for t, _ in data], [y for _, y in data]

    def rows(batches):
        return [(tokenizer.decode(ids, skip_special_tokens=True), int(y))
                for b in batches for ids, y in zip(b["input_ids"], b["labels"])]

    def padding(batches):
        return sum(int((b["attention_mask"] == 0).sum()) for b in batches)

    plain = finetune._batches(tokenizer, texts, labels, 16, False)
    grouped = finetune._batches(tokenizer, texts, labels, 16, False, group=5)
    assert sorted(rows(grouped)) == sorted(rows(plain))
    assert sorted(rows(plain)) == sorted((tokenizer.decode(tokenizer(t)["input_ids"],
                                                           skip_special_tokens=True), y)
                                         for t, y in data)
    assert padding(grouped) < padding(plain) / 2
    assert len(grouped) == len(plain) == 19  # 300 / 16: the same number of batches


def test_token_labels_are_padded_with_the_ignore_index():
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.minilm_path()))
    texts = ["Tim Cook works at Apple in Cupertino.", "Paris."]
    labels = [[-100] + [i % 7 for i in range(len(tokenizer(t)["input_ids"]) - 2)] + [-100]
              for t in texts]
    (batch,) = finetune._batches(tokenizer, texts, labels, 2, True, group=1)
    width = batch["input_ids"].shape[1]
    assert width == len(labels[0]) > len(labels[1]) == 4
    got = {tuple(row) for row in batch["labels"].tolist()}  # the order is the length's
    assert got == {tuple(labels[0]), tuple(labels[1] + [-100] * (width - 4))}


def test_the_packaged_minilm_loads_with_a_fresh_head_and_no_warning_to_train_it():
    """transformers would log "You should probably TRAIN this model": the head is trained
    next, so that warning is left out, while every weight but the head's is checked to
    have loaded."""
    from transformers import AutoModelForTokenClassification

    with said_to("transformers.modeling_utils") as heard:
        base, _, model = finetune._from_minilm(AutoModelForTokenClassification, ["O", "B"], 0)
    assert model.classifier.out_features == 2 and base == checkpoint.minilm_path()
    assert not [m for m in heard if "TRAIN" in m], heard
    assert not logging.getLogger("transformers.modeling_utils").filters  # as it was


@pytest.mark.parametrize("units", [None, "AMX (amx_bf16)"])
def test_training_leaves_the_word_embeddings_and_runs_in_bf16_where_the_cpu_has_the_units(
        units, monkeypatch):
    """The word embeddings stay as loaded while the rest learns; the forward pass runs
    under bf16 autocast on a CPU with bf16 matrix units (in fp32 elsewhere), and the
    result says which."""
    import torch
    from transformers import AutoModelForSequenceClassification

    monkeypatch.setattr(finetune, "bf16_units", lambda: units)
    _, tokenizer, model = finetune._from_minilm(AutoModelForSequenceClassification,
                                                ["a", "b"], 0)
    words = model.get_input_embeddings().weight.detach().clone()
    head = model.classifier.weight.detach().clone()
    batches = finetune._batches(tokenizer, ["good", "bad", "fine", "awful"], [0, 1, 0, 1], 2,
                                False)
    dtypes = []
    model.classifier.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    trained = finetune._train(model, batches, 1, 1e-3, 0, lambda step: None)
    assert torch.equal(model.get_input_embeddings().weight, words)
    assert not torch.equal(model.classifier.weight, head)
    assert set(dtypes) == {torch.bfloat16 if units else torch.float32}
    assert trained["frozen"] == "word embeddings" and trained["final_loss"] > 0
    assert trained["precision"] == ("bf16 autocast (AMX (amx_bf16))" if units else "fp32")
