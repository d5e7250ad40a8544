"""Fine-tunes the packaged all-MiniLM-L6-v2 into the embedded default's classifier
(sentiment) and NER model, on data made by ``distilserve.training.synthetic``. Seeded and reproducible
(on one machine and thread count); run by ``distilserve/server/embedded_default.py``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from distilserve.models import entities
from distilserve.models.bert import HFEncoder
from distilserve.models.io import checkpoint
from distilserve.models.runtime.matrix_units import bf16_units
from distilserve.training import handwritten, synthetic
from distilserve.training.loop import optimise


def _train(model, batches: list[dict], epochs: int, lr: float, seed: int,
           progress: Callable[[str], None]) -> dict:
    """Fine-tunes ``model`` in place; returns the final loss and how it was trained. The
    word embeddings (half of MiniLM's weights) stay as pre-trained, left out of each
    step's gradients and updates; the forward pass runs under bf16 autocast where the CPU
    has bf16 matrix units, the weights and their updates in fp32."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model.get_input_embeddings().weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel updates every parameter (several times faster than the loop on a CPU)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=True)
    total = epochs * len(batches)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    units = bf16_units()

    def loss_of(b):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=units is not None):
            return model(**batches[b]).loss, {}

    model.train()
    last = [0.0]
    for epoch in range(epochs):
        order = list(range(len(batches)))
        rng.shuffle(order)

        def report(i, _, loss, parts, epoch=epoch):
            last[0] = loss.item()
            if i % 20 == 0:
                progress(f"epoch {epoch + 1}/{epochs}, step {i}/{len(batches)}, "
                         f"loss {last[0]:.4f}")

        optimise(order, loss_of, params, optimizer, schedule, after=report)
    model.eval()
    return {"final_loss": float(last[0]), "frozen": "word embeddings",
            "precision": f"bf16 autocast ({units})" if units else "fp32"}


def _batches(tokenizer, texts: list[str], labels: list, size: int, token_level: bool,
             group: int = 0):
    """Padded batches of ``size``. With ``group`` > 0, each run of ``group * size`` texts
    (in their random order) is sorted by length before it is cut into batches, as
    transformers' ``group_by_length``: a batch holds texts of like length, so less of it
    is padding; the batches' order is still shuffled every epoch (``_train``)."""
    order = list(range(len(texts)))
    if group:
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        run = group * size
        order = [i for s in range(0, len(order), run)
                 for i in sorted(order[s:s + run], key=lengths.__getitem__)]
    out = []
    for s in range(0, len(order), size):
        rows = order[s:s + size]
        enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                        max_length=128, return_tensors="pt")
        if token_level:
            width = enc["input_ids"].shape[1]
            enc["labels"] = torch.tensor([labels[i] + [-100] * (width - len(labels[i]))
                                          for i in rows])
        else:
            enc["labels"] = torch.tensor([labels[i] for i in rows])
        out.append(dict(enc))
    return out


def _untrained_head(record: logging.LogRecord) -> bool:
    return "were not initialized from the model checkpoint" not in record.getMessage()


def _from_minilm(auto_class, labels: list[str], seed: int):
    """The packaged MiniLM with a fresh head for ``labels``, and its tokenizer."""
    torch.manual_seed(seed)
    base = checkpoint.minilm_path()
    # transformers warns that the new head's weights were not in the checkpoint ("You
    # should probably TRAIN this model"): it is trained next. That warning is left out;
    # what was not loaded is checked here instead: the head alone
    loader = logging.getLogger("transformers.modeling_utils")
    loader.addFilter(_untrained_head)
    try:
        model, loaded = auto_class.from_pretrained(
            str(base), num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)}, output_loading_info=True,
            local_files_only=True)
    finally:
        loader.removeFilter(_untrained_head)
    body = [k for k in loaded["missing_keys"] if not k.startswith("classifier.")]
    if body:
        raise RuntimeError(f"the packaged MiniLM ({base}) lacks weights: {body}")
    return base, AutoTokenizer.from_pretrained(str(base), local_files_only=True), model


def _predict(model, tokenizer, texts: list[str], size: int = 64):
    """(logits per text, without padding; the tokenizer's encodings), in batches."""
    logits, encodings = [], []
    for i in range(0, len(texts), size):
        enc = tokenizer(texts[i:i + size], padding=True, truncation=True, max_length=128,
                        return_tensors="pt")
        with torch.no_grad():
            out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        for row, encoding in zip(out.numpy(), enc.encodings):
            logits.append(row[:sum(encoding.attention_mask)] if row.ndim == 2 else row)
            encodings.append(encoding)
    return logits, encodings


def accuracy(model, tokenizer, data: list[tuple[str, int]], labels: list[str]) -> dict:
    """Accuracy over (text, label id) pairs, overall and per label."""
    logits, _ = _predict(model, tokenizer, [t for t, _ in data])
    right = [int(row.argmax()) == y for row, (_, y) in zip(logits, data)]
    by_label = {name: [r for r, (_, y) in zip(right, data) if y == i]
                for i, name in enumerate(labels)}
    return {"accuracy": sum(right) / len(right),
            "by_label": {k: f"{sum(v)}/{len(v)}" for k, v in by_label.items() if v}}


def entity_scores(model, tokenizer, data: list[tuple[str, list]], labels: list[str]) -> dict:
    """Entity precision, recall and F1 over (text, [(start, end, type)]), the entities
    found as the service finds them (distilserve/models/entities.py, "simple" grouping)."""
    logits, encodings = _predict(model, tokenizer, [t for t, _ in data])
    word_aware = entities.TokenInfo.marks_words(tokenizer.backend_tokenizer)
    found = gold = correct = 0
    for (text, spans), row, encoding in zip(data, logits, encodings):
        info = entities.TokenInfo.of(encoding, tokenizer.unk_token_id, word_aware)
        got = {(e["start"], e["end"], e["entity_group"])
               for e in entities.entities(text, info, row, labels, "simple")}
        want = {tuple(s) for s in spans}
        found, gold, correct = found + len(got), gold + len(want), correct + len(got & want)
    precision, recall = correct / max(found, 1), correct / max(gold, 1)
    return {"precision": precision, "recall": recall,
            "f1": 2 * precision * recall / max(precision + recall, 1e-9)}


def train_sentiment(seed: int = 0, n_train: int = 1800, n_test: int = 600, epochs: int = 2,
                    progress: Callable[[str], None] = print) -> tuple[checkpoint.Checkpoint, dict]:
    """A negative/neutral/positive classifier; returns it and its held-out accuracy on
    generated and on hand-written sentences."""
    labels = synthetic.SENTIMENT_LABELS
    base, tokenizer, model = _from_minilm(AutoModelForSequenceClassification, labels, seed)
    train = synthetic.sentiment(n_train, seed)
    trained = _train(model, _batches(tokenizer, [t for t, _ in train],
                                     [y for _, y in train], 32, False, group=20),
                     epochs, 5e-5, seed, progress)
    held_out = accuracy(model, tokenizer, synthetic.sentiment(n_test, seed + 1000), labels)
    hand = accuracy(model, tokenizer, [(t, labels.index(y)) for t, y in handwritten.SENTIMENT],
                    labels)
    ckpt = checkpoint.Checkpoint(HFEncoder(model, "classify"), "bert", "classify", labels,
                                 model.config.to_dict(), base)
    return ckpt, {"held_out_accuracy": held_out["accuracy"],
                  "hand_written_accuracy": hand["accuracy"],
                  "hand_written_by_label": hand["by_label"],
                  "train_sentences": n_train, "test_sentences": n_test,
                  "hand_written_sentences": len(handwritten.SENTIMENT),
                  **trained, "seed": seed}


def train_ner(seed: int = 0, n_train: int = 2400, n_test: int = 400, epochs: int = 2,
              progress: Callable[[str], None] = print) -> tuple[checkpoint.Checkpoint, dict]:
    """A PER/ORG/LOC tagger; returns it and its entity precision/recall/F1 on held-out
    generated and on hand-written sentences."""
    labels = synthetic.NER_LABELS
    base, tokenizer, model = _from_minilm(AutoModelForTokenClassification, labels, seed)
    train = synthetic.ner(n_train, seed)
    enc = tokenizer([t for t, _ in train], truncation=True, max_length=128,
                    return_offsets_mapping=True, return_special_tokens_mask=True)
    tags = [synthetic.token_labels(o, s, spans) for o, s, (_, spans) in
            zip(enc["offset_mapping"], enc["special_tokens_mask"], train)]
    trained = _train(model, _batches(tokenizer, [t for t, _ in train], tags, 16, True,
                                     group=20),
                     epochs, 1e-4, seed, progress)
    held_out = entity_scores(model, tokenizer, synthetic.ner(n_test, seed + 1000), labels)
    hand = entity_scores(model, tokenizer, handwritten.NER, labels)
    ckpt = checkpoint.Checkpoint(HFEncoder(model, "ner"), "bert", "ner", labels,
                                 model.config.to_dict(), base)
    return ckpt, {**{f"held_out_{k}": v for k, v in held_out.items()},
                  **{f"hand_written_{k}": v for k, v in hand.items()},
                  "train_sentences": n_train, "test_sentences": n_test,
                  "hand_written_sentences": len(handwritten.NER),
                  **trained, "seed": seed}
