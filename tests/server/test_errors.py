"""server/errors.py: a 422's message from pydantic's errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.errors import invalid
from server.schemas import EmbeddingsRequest, RerankRequest


def message(model, body: dict) -> str:
    with pytest.raises(ValidationError) as failed:
        model.model_validate(body)
    return invalid(failed.value.errors())


@pytest.mark.parametrize("body,said", [
    # the branch the value came closest to, alone (every branch's complaint, before)
    ({"input": [-1, 5]}, "input.0: Input should be greater than or equal to 0"),
    ({"input": [[1, 2], [3, -4]]}, "input.1.1: Input should be greater than or equal to 0"),
    ({"input": [[1, "x"]]}, "input.0.1: Input should be a valid integer"),
    ({"input": {"a": 1}}, "input: Input should be a valid list"),
    # as close to either of two: both
    ({"input": [1, "a"]},
     "input.0: Input should be a valid string; input.1: Input should be a valid integer"),
    ({"input": 5}, "input: Input should be a valid string; input: Input should be a valid list"),
])
def test_a_value_that_fits_no_branch_of_a_union_hears_of_the_closest(body, said):
    assert message(EmbeddingsRequest, body) == said


def test_a_models_branch_is_named_by_its_fields():
    assert message(RerankRequest, {"query": "q", "documents": [{"txt": "d"}]}) == (
        "documents.0.text: Field required")
