"""The embedded default's build: its progress where no terminal shows it, and one
builder at a time."""

from __future__ import annotations

import logging
import threading
import time

from distilserve.server.embedded_default import BuildProgress, build_lock


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


def test_one_process_builds_while_another_waits_and_says_so(tmp_path):
    """The workers of serve --workers N share the cache: one builds, the others wait."""
    heard, entered = [], threading.Event()

    def wait_then_enter():
        with build_lock(tmp_path, heard.append):
            entered.set()

    with build_lock(tmp_path, heard.append):
        waiter = threading.Thread(target=wait_then_enter)
        waiter.start()
        time.sleep(1.5)
        assert not entered.is_set()  # blocked while the first one holds the lock
    waiter.join(30)
    assert entered.is_set()
    assert heard and all("another process is building it" in h for h in heard)


def test_waiting_stops_when_progress_raises(tmp_path):
    """A worker asked to stop while it waits (its progress raises) stops waiting."""
    failures = []

    def stop(text):
        raise InterruptedError(text)

    def wait():
        try:
            with build_lock(tmp_path, stop):
                pass
        except InterruptedError as e:
            failures.append(e)

    with build_lock(tmp_path, lambda text: None):
        waiter = threading.Thread(target=wait)
        waiter.start()
        waiter.join(30)
    assert failures and not waiter.is_alive()


def test_a_build_stopped_or_failed_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    """Stopped at a step (the service shutting down) or failed: no half-built folder (an
    abandoned one is removed at the process's exit: tests/e2e/test_first_start.py)."""
    import atexit

    import pytest

    from distilserve.server import embedded_default
    from distilserve.server.service import BuildCancelled

    def build(models, progress):  # a model written, then stopped
        (models / "all-minilm-l6-v2").mkdir(parents=True)
        (models / "all-minilm-l6-v2" / "model.onnx").write_bytes(b"half")
        raise BuildCancelled("the service is shutting down")

    registered = []
    monkeypatch.setattr(embedded_default, "build", build)
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    with pytest.raises(BuildCancelled):
        embedded_default.ensure_default_repository(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".build.lock"]
    assert registered == []  # the exit's clean-up is dropped once the build has ended
