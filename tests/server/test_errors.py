"""distilserve/server/errors.py: a 422's message from pydantic's errors and json's."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from distilserve.server.errors import invalid, unparseable
from distilserve.server.routes.native.schemas import EmbeddingsRequest, RerankRequest
from distilserve.server.routes.tei.schemas import TeiRerankRequest, TeiSimilarityRequest


def message(model, body: dict) -> str:
    with pytest.raises(ValidationError) as failed:
        model.model_validate(body)
    return invalid(failed.value.errors())


@pytest.mark.parametrize("body,said", [
    # the branch the value came closest to, alone (every branch's complaint, before)
    ({"input": [-1, 5]}, "input.0: Input should be greater than or equal to 0 (sent -1)"),
    ({"input": [[1, 2], [3, -4]]},
     "input.1.1: Input should be greater than or equal to 0 (sent -4)"),
    ({"input": [[1, "x"]]}, 'input.0.1: Input should be a valid integer (sent "x")'),
    ({"input": {"a": 1}}, "input: Input should be a valid list"),
    # a value of the right type, too large: not also "a valid list" (a list of lists')
    ({"input": [2**32]},
     "input.0: Input should be less than or equal to 2147483647 (sent 4294967296)"),
    # as close to either of two: both
    ({"input": [1, "a"]}, "input.0: Input should be a valid string (sent 1); "
     'input.1: Input should be a valid integer (sent "a")'),
    ({"input": 5}, "input: Input should be a valid string (sent 5); "
     "input: Input should be a valid list (sent 5)"),
])
def test_a_value_that_fits_no_branch_of_a_union_hears_of_the_closest(body, said):
    assert message(EmbeddingsRequest, body) == said


def test_what_is_not_served_is_said_by_its_field():
    assert message(EmbeddingsRequest, {"input": "a", "add_special_tokens": False}) == (
        "add_special_tokens: false is not served: the model reads each input with its "
        "special tokens")
    EmbeddingsRequest.model_validate({"input": "a", "add_special_tokens": True})


def test_a_models_branch_is_named_by_its_fields():
    assert message(RerankRequest, {"query": "q", "documents": [{"txt": "d"}]}) == (
        "documents.0.text: Field required")


@pytest.mark.parametrize("model, body, said", [
    (RerankRequest, {"query": "q", "documents": ["a", "b\ud800"]}, "document 1"),
    (RerankRequest, {"query": "q\ud800", "documents": ["a"]}, "the query"),
    (TeiRerankRequest, {"query": "q", "texts": ["a", "b\ud800"]}, "document 1"),
    (TeiSimilarityRequest, {"inputs": {"source_sentence": "s", "sentences": ["b\ud800"]}},
     "sentence 0"),
    (EmbeddingsRequest, {"input": ["a", "b\ud800"]}, "input 1"),
])
def test_a_text_that_is_not_unicode_is_named_as_the_client_sent_it(model, body, said):
    assert message(model, body) == (f"body: {said} is not valid Unicode: a lone surrogate at "
                                    "character 1")


@pytest.mark.parametrize("body,said", [
    ('{"inputs": "x', "malformed JSON: Unterminated string starting at character 11"),
    ('{"inputs": "\x01"}', "malformed JSON: Invalid control character at character 12"),
    ('{"inputs": "x",}', "malformed JSON: Expecting property name enclosed in double quotes "
                         "at character 15"),
])
def test_a_body_that_is_not_json_is_said_where(body, said):
    with pytest.raises(json.JSONDecodeError) as failed:
        json.loads(body)
    assert unparseable(failed.value) == said
