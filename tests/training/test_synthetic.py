"""The generated training data: seeded, and the same in every process."""

from __future__ import annotations

import os
import subprocess
import sys

from distilserve.training import synthetic

DIGEST = ("import hashlib; from distilserve.training import synthetic; "
          "print(hashlib.md5(repr((synthetic.ner(400, 0), synthetic.sentiment(200, 0)))"
          ".encode()).hexdigest())")


def test_the_same_seed_gives_the_same_data_whatever_the_string_hashing():
    # Python hashes strings differently in every process; a set's order follows it
    digests = {subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": str(h)}
                              ).stdout for h in (1, 2)}
    assert len(digests) == 1


def test_ner_spans_point_at_their_entities():
    data = synthetic.ner(50, 3)
    assert sum(bool(spans) for _, spans in data) > 30  # some templates have none
    for text, spans in data:
        assert all(text[a:b].strip() == text[a:b] != "" for a, b, _ in spans)
        assert {kind for _, _, kind in spans} <= {"PER", "ORG", "LOC"}


def test_common_nouns_titles_and_possessives_stay_outside_the_entities():
    data = synthetic.ner(2000, 5)
    entities = [text[a:b] for text, spans in data for a, b, _ in spans]
    for common in ("the research lab", "the battery", "My neighbour"):
        assert not any(common in entity for entity in entities)
    assert not any(e.endswith("'s") or e.split()[0] in synthetic.TITLES for e in entities)
    assert any(f"{title} " in text for text, _ in data for title in synthetic.TITLES)
    assert any("'s " in text for text, _ in data)
    assert sum(not spans for _, spans in data) > 20  # sentences with nothing to find


def test_sentiment_is_balanced_over_three_classes():
    data = synthetic.sentiment(300, 0)
    labels = [y for _, y in data]
    assert synthetic.SENTIMENT_LABELS == ["negative", "neutral", "positive"]
    assert [labels.count(i) for i in range(3)] == [100, 100, 100]
    neutral = " ".join(t.lower() for t, y in data if y == 1).split()
    assert not set(neutral) & set(synthetic.POSITIVE + synthetic.NEGATIVE)
