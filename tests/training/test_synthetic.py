"""The generated training data: seeded, and the same in every process."""

from __future__ import annotations

import os
import subprocess
import sys

from training import synthetic

DIGEST = ("import hashlib; from training import synthetic; "
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
    assert sum(bool(spans) for _, spans in data) > 40  # a few templates have no entity
    for text, spans in data:
        assert all(text[a:b].strip() == text[a:b] != "" for a, b, _ in spans)
        assert {kind for _, _, kind in spans} <= {"PER", "ORG", "LOC"}
