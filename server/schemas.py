"""Request and response bodies (CONTRACT.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

Strategy = Literal["none", "simple", "first", "average", "max"]
Texts = str | Annotated[list[str], Field(min_length=1)]
Pair = Annotated[list[str], Field(min_length=2, max_length=2)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    model: str | None = None

    @property
    def texts(self) -> list:
        value = self.inputs if hasattr(self, "inputs") else self.input
        items = [value] if isinstance(value, str) else value
        return [x if isinstance(x, str) else (x[0], x[1]) for x in items]

    @model_validator(mode="after")
    def _unicode(self):
        """JSON's \\uXXXX escapes can spell lone surrogates, which are no text at all (the
        tokenizer cannot take them)."""
        for i, text in enumerate(self.texts):
            for part in (text,) if isinstance(text, str) else text:
                try:
                    part.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise PydanticCustomError(
                        "invalid_text", "input {i} is not valid Unicode: a lone surrogate "
                        "at character {at}", {"i": i, "at": e.start}) from None
        return self


class EmbeddingsRequest(_Request):
    """OpenAI's /v1/embeddings."""

    input: Texts = Field(description="a text or a non-empty list of texts")
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


class EmbedRequest(_Request):
    inputs: Texts
    normalize: bool = True
    truncate: bool = True


class ClassifyRequest(_Request):
    inputs: str | Annotated[list[str | Pair], Field(min_length=1)] = Field(
        description="a text, a list of texts, or text pairs as two-item lists")
    top_k: int | None = Field(None, ge=1)
    truncate: bool = True


class NerRequest(_Request):
    inputs: Texts
    aggregation_strategy: Strategy = "simple"
    truncate: bool = True


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    usage: Usage


class Score(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    model: str
    results: list[list[Score]]


class NerResponse(BaseModel):
    model: str
    results: list[list[dict]]
