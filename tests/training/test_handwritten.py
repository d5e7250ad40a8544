"""The hand-written development set: spans that point at their entities, and none of it
in the generated training data."""

from __future__ import annotations

from distilserve.training import handwritten, synthetic


def test_marked_entities_become_spans_of_the_plain_sentence():
    text, spans = handwritten.unmark("[PER Tim Cook] spoke at [ORG Apple]'s campus.")
    assert text == "Tim Cook spoke at Apple's campus."
    assert [(text[a:b], kind) for a, b, kind in spans] == [("Tim Cook", "PER"),
                                                         ("Apple", "ORG")]
    for text, spans in handwritten.NER:
        assert "[" not in text
        assert all(text[a:b].strip() == text[a:b] != "" for a, b, _ in spans)


def test_no_hand_written_sentence_is_in_the_training_data():
    generated = {t for t, _ in synthetic.sentiment(1800, 0)} | {t for t, _ in synthetic.ner(2400, 0)}
    assert not generated & {t for t, _ in handwritten.SENTIMENT + handwritten.NER}
    assert {y for _, y in handwritten.SENTIMENT} == set(synthetic.SENTIMENT_LABELS)
