"""Token ids in OpenAI's vocabularies, read back into text (DISTILSERVE_TOKEN_IDS)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distilserve.server.core.inference import read_foreign
from distilserve.server.core.refusals import Refusal
from distilserve.server.vocabularies import FOREIGN, Foreign

TEXTS = ["The Eiffel Tower", "naïve café 🎉", "Straße\n\ttab  spaces", "日本語のテキスト", ""]


@pytest.fixture(scope="module", params=FOREIGN)
def vocabulary(request):
    return Foreign(request.param)


def test_ids_read_back_into_their_text(vocabulary):
    import bpe_openai

    encoding = bpe_openai.get_encoding(vocabulary.name)
    assert [vocabulary.text(encoding.encode(t)) for t in TEXTS] == TEXTS
    assert vocabulary.outside(encoding.encode(TEXTS[1])) is None


def test_ids_outside_are_named(vocabulary):
    assert vocabulary.outside([1, -1, 2]) == -1  # (bpe-openai itself wraps it round)
    assert vocabulary.outside([0, vocabulary.size]) == vocabulary.size
    assert vocabulary.outside([vocabulary.size - 1]) is None


def test_a_request_s_ids_become_text_and_its_texts_stay():
    import bpe_openai

    cl100k = Foreign("cl100k_base")
    engine = SimpleNamespace(name="m", foreign=cl100k)
    ids = bpe_openai.get_encoding("cl100k_base").encode("The Eiffel Tower")
    assert read_foreign(engine, ["a text", ids]) == ["a text", "The Eiffel Tower"]
    with pytest.raises(Refusal) as e:
        read_foreign(engine, ["a text", [1, 2], [5, 100277]])
    assert e.value.reason == "invalid" and e.value.message == (
        "input 2: token id 100277 is not in cl100k_base (0 to 100276), the vocabulary model "
        "'m' reads token ids in")
    own = SimpleNamespace(name="m", foreign=None)
    assert read_foreign(own, [[5, 100277]]) == [[5, 100277]]  # the model's own: as sent
