"""The embedded default's build progress, where no terminal shows it."""

from __future__ import annotations

import logging
import time

from server.default import BuildProgress


def test_without_a_terminal_progress_is_logged_per_model_and_every_few_seconds(caplog):
    heard = []
    with caplog.at_level(logging.INFO, logger="distilserve"):
        with BuildProgress(heard.append, every=0.1, terminal=False) as say:
            say("minilm-sentiment: epoch 1/2, step 1/50")
            say("minilm-sentiment: epoch 1/2, step 2/50")  # same model: no new line
            time.sleep(0.35)
            say("minilm-ner: epoch 1/2, step 1/75")
    lines = [r.getMessage() for r in caplog.records]
    assert heard[-1] == "minilm-ner: epoch 1/2, step 1/75"
    assert sum("minilm-sentiment: epoch 1/2, step 2/50" in line for line in lines) >= 2
    assert any("minilm-ner: epoch 1/2, step 1/75" in line for line in lines)
    assert not any("step 1/50" in line for line in lines[1:])
