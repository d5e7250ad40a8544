"""Fine-tunes the packaged all-MiniLM-L6-v2 into the embedded default's classifier
(sentiment) and NER model, on data made by ``training.synthetic``. Seeded and reproducible
(on one machine and thread count); run by ``server/embedded_default.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from models.bert import HFEncoder
from models.io import checkpoint
from server import postprocess
from training import synthetic
from training.loop import optimise


def _train(model, batches: list[dict], epochs: int, lr: float, seed: int,
           progress: Callable[[str], None]) -> float:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    total = epochs * len(batches)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
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

        optimise(order, lambda b: (model(**batches[b]).loss, {}), list(model.parameters()),
                 optimizer, schedule, after=report)
    model.eval()
    return float(last[0])


def _batches(tokenizer, texts: list[str], labels: list, size: int, token_level: bool):
    out = []
    for i in range(0, len(texts), size):
        enc = tokenizer(texts[i:i + size], padding=True, truncation=True, max_length=128,
                        return_tensors="pt")
        if token_level:
            width = enc["input_ids"].shape[1]
            enc["labels"] = torch.tensor([row + [-100] * (width - len(row))
                                          for row in labels[i:i + size]])
        else:
            enc["labels"] = torch.tensor(labels[i:i + size])
        out.append(dict(enc))
    return out


def _from_minilm(auto_class, labels: list[str], seed: int):
    """The packaged MiniLM with a fresh head for ``labels``, and its tokenizer."""
    torch.manual_seed(seed)
    base = checkpoint.minilm_path()
    model = auto_class.from_pretrained(
        str(base), num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)})
    return base, AutoTokenizer.from_pretrained(str(base)), model


def train_sentiment(seed: int = 0, n_train: int = 1600, n_test: int = 400, epochs: int = 2,
                    progress: Callable[[str], None] = print) -> tuple[checkpoint.Checkpoint, dict]:
    """A positive/negative classifier; returns it and its held-out accuracy."""
    labels = synthetic.SENTIMENT_LABELS
    base, tokenizer, model = _from_minilm(AutoModelForSequenceClassification, labels, seed)
    train = synthetic.sentiment(n_train, seed)
    final_loss = _train(model, _batches(tokenizer, [t for t, _ in train],
                                        [y for _, y in train], 32, False),
                        epochs, 5e-5, seed, progress)
    test = synthetic.sentiment(n_test, seed + 1000)
    enc = tokenizer([t for t, _ in test], padding=True, return_tensors="pt")
    with torch.no_grad():
        predicted = model(**enc).logits.argmax(-1).numpy()
    accuracy = float((predicted == np.array([y for _, y in test])).mean())
    ckpt = checkpoint.Checkpoint(HFEncoder(model, "classify"), "bert", "classify", labels,
                                 model.config.to_dict(), base)
    return ckpt, {"held_out_accuracy": accuracy, "train_sentences": n_train,
                  "test_sentences": n_test, "final_loss": final_loss, "seed": seed}


def train_ner(seed: int = 0, n_train: int = 2400, n_test: int = 400, epochs: int = 2,
              progress: Callable[[str], None] = print) -> tuple[checkpoint.Checkpoint, dict]:
    """A PER/ORG/LOC tagger; returns it and its held-out entity precision/recall/F1."""
    labels = synthetic.NER_LABELS
    base, tokenizer, model = _from_minilm(AutoModelForTokenClassification, labels, seed)

    def encode(data):
        enc = tokenizer([t for t, _ in data], truncation=True, max_length=128,
                        return_offsets_mapping=True, return_special_tokens_mask=True)
        return enc, [synthetic.token_labels(o, s, spans) for o, s, (_, spans) in
                     zip(enc["offset_mapping"], enc["special_tokens_mask"], data)]

    train = synthetic.ner(n_train, seed)
    _, tags = encode(train)
    final_loss = _train(model, _batches(tokenizer, [t for t, _ in train], tags, 16, True),
                        epochs, 1e-4, seed, progress)
    test = synthetic.ner(n_test, seed + 1000)
    enc, _ = encode(test)
    # the entities as the service finds them (server/postprocess.py, "simple" grouping)
    word_aware = postprocess.TokenInfo.marks_words(tokenizer.backend_tokenizer)
    found = gold = correct = 0
    for i, (text, spans) in enumerate(test):
        ids = torch.tensor([enc["input_ids"][i]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].numpy()
        info = postprocess.TokenInfo.of(enc.encodings[i], tokenizer.unk_token_id, word_aware)
        got = {(e["start"], e["end"], e["entity_group"])
               for e in postprocess.entities(text, info, logits, labels, "simple")}
        want = {tuple(s) for s in spans}
        found, gold, correct = found + len(got), gold + len(want), correct + len(got & want)
    precision, recall = correct / max(found, 1), correct / max(gold, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    ckpt = checkpoint.Checkpoint(HFEncoder(model, "ner"), "bert", "ner", labels,
                                 model.config.to_dict(), base)
    return ckpt, {"held_out_precision": precision, "held_out_recall": recall,
                  "held_out_f1": f1, "train_sentences": n_train, "test_sentences": n_test,
                  "final_loss": final_loss, "seed": seed}
