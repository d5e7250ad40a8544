"""distilserve/models/entities.py: a token classifier's logits -> entity spans, as
transformers' token-classification pipeline groups them."""

import numpy as np
import pytest
from transformers import TokenClassificationPipeline

from distilserve.models import entities
from distilserve.models.entities import TokenInfo

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _logits(tags):
    out = np.full((len(tags), len(LABELS)), -5.0)
    for i, tag in enumerate(tags):
        out[i, LABELS.index(tag)] = 5.0
    return out


# "Mer ##kel went to Paris" with [CLS]/[SEP]
TEXT = "Merkel went to Paris"
INFO = TokenInfo(ids=[101, 1, 2, 3, 4, 5, 102],
                 tokens=["[CLS]", "mer", "##kel", "went", "to", "paris", "[SEP]"],
                 offsets=[(0, 0), (0, 3), (3, 6), (7, 11), (12, 14), (15, 20), (0, 0)],
                 special=[1, 0, 0, 0, 0, 0, 1], unk_id=100, word_aware=True)


def test_simple_groups_b_and_i_and_uses_the_text_as_sent():
    logits = _logits(["O", "B-PER", "I-PER", "O", "O", "B-LOC", "O"])
    ents = entities.entities(TEXT, INFO, logits, LABELS, "simple")
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in ents] == [
        ("PER", "Merkel", 0, 6), ("LOC", "Paris", 15, 20)]


def test_first_uses_the_first_subword_and_none_keeps_tokens():
    logits = _logits(["O", "B-PER", "B-LOC", "O", "O", "O", "O"])
    first = entities.entities(TEXT, INFO, logits, LABELS, "first")
    assert [(e["entity_group"], e["word"]) for e in first] == [("PER", "Merkel")]
    none = entities.entities(TEXT, INFO, logits, LABELS, "none")
    assert [(e["entity"], e["word"], e["index"]) for e in none] == [
        ("B-PER", "Mer", 1), ("B-LOC", "kel", 2)]


def test_overlapping_windows_entities_merge_as_the_pipeline_merges_them():
    """The longer of two overlapping entities kept, of two as long the higher score; equal
    to the pipeline's aggregate_overlapping_entities on random ones."""
    entity = lambda start, end, score: {"start": start, "end": end, "score": score}  # noqa: E731
    merged = entities.overlapping([entity(10, 14, 0.9), entity(0, 5, 0.5),
                                      entity(3, 8, 0.7), entity(10, 16, 0.2),
                                      entity(20, 24, 0.3), entity(20, 24, 0.4)])
    assert merged == [entity(3, 8, 0.7), entity(10, 16, 0.2), entity(20, 24, 0.4)]
    assert entities.overlapping([]) == []
    rng = np.random.default_rng(0)
    for _ in range(200):
        starts = rng.integers(0, 30, size=rng.integers(1, 12))
        found = [entity(int(s), int(s + rng.integers(1, 6)), float(rng.integers(0, 3)))
                 for s in starts]
        assert entities.overlapping(found) == \
            TokenClassificationPipeline.aggregate_overlapping_entities(None, found)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError):
        entities.entities(TEXT, INFO, _logits(["O"] * 7), LABELS, "best")
