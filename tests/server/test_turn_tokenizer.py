"""distilserve/server/core/tokenisation.TurnTokenizer against a fake tokenisation: the
requests of one turn of the event loop tokenised in one call, each given its own
encodings, and a text the tokenizer refuses failing its own request alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from distilserve.server.core.tokenisation import TurnTokenizer


class Text:
    """Encodes a text as (text, truncation); refuses "bad"; records each call and the
    thread it ran on."""

    def __init__(self):
        self.calls: list[tuple[list, str | None, str]] = []

    def tokenize(self, texts, truncation):
        self.calls.append((list(texts), truncation, threading.current_thread().name))
        if "bad" in texts:
            raise ValueError("bad text")
        return [(t, truncation) for t in texts]


def run(requests, inline=4):
    """Each request, (texts, truncation), sent in the same turn: what each got (its
    encodings, or its exception), and the tokenizer's calls."""
    text = Text()

    async def main():
        tokenizer = TurnTokenizer(text, inline)
        futures = [tokenizer.tokenize(texts, truncation) for texts, truncation in requests]
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(main()), text.calls


def test_the_requests_of_a_turn_are_tokenised_in_one_call_each_given_its_own():
    got, calls = run([(["a", "b"], "right"), (["c"], "right"), (["d", "e", "f"], "right")])
    assert got == [[("a", "right"), ("b", "right")], [("c", "right")],
                   [("d", "right"), ("e", "right"), ("f", "right")]]
    assert [texts for texts, _, _ in calls] == [["a", "b", "c", "d", "e", "f"]]
    assert calls[0][2] == threading.main_thread().name  # on the loop


def test_each_truncation_is_one_call_of_its_own():
    got, calls = run([(["a"], "right"), (["b"], None), (["c"], "right")])
    assert got == [[("a", "right")], [("b", None)], [("c", "right")]]
    assert [(texts, cut) for texts, cut, _ in calls] == [(["a", "c"], "right"), (["b"], None)]


def test_a_request_of_more_texts_than_inline_is_tokenised_on_a_thread_of_its_own():
    got, calls = run([(["a"], "right"), (["b", "c", "d"], "right")], inline=2)
    assert got == [[("a", "right")], [("b", "right"), ("c", "right"), ("d", "right")]]
    assert sorted(texts for texts, _, _ in calls) == [["a"], ["b", "c", "d"]]
    threads = {tuple(texts): thread for texts, _, thread in calls}
    assert threads[("a",)] == threading.main_thread().name
    assert threads[("b", "c", "d")] != threading.main_thread().name


def test_a_text_the_tokenizer_refuses_fails_its_own_request_alone():
    got, calls = run([(["a"], "right"), (["b", "bad"], "right"), (["c"], "right")])
    assert got[0] == [("a", "right")] and got[2] == [("c", "right")]
    assert isinstance(got[1], ValueError)
    assert [texts for texts, _, _ in calls] == [["a", "b", "bad", "c"], ["a"], ["b", "bad"],
                                                ["c"]]


def test_a_request_cancelled_before_its_turn_is_not_tokenised():
    text = Text()

    async def main():
        tokenizer = TurnTokenizer(text, 4)
        gone, kept = tokenizer.tokenize(["a"], None), tokenizer.tokenize(["b"], None)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await kept

    assert asyncio.run(main()) == [("b", None)]
    assert [texts for texts, _, _ in text.calls] == [["b"]]
