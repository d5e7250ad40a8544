"""vLLM's /pooling, /score, /tokenize and /detokenize bodies and answers (/tokenize's
beside TEI's body: ``TokenizeBody``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from distilserve.server.routes.native.schemas import (
    Body,
    EmbeddingsRequest,
    TokenIds,
    TokenizeRequest,
)
from distilserve.server.routes.options import (
    Activation,
    Deep,
    Prioritised,
    PromptTokens,
    TextTokens,
    either,
)

ScoreTexts = str | Annotated[list[str], Field(min_length=1)]


class ScoreRequest(Deep, Activation, Prioritised, Body):
    """vLLM's /score: each text of ``data_1`` (one, for every text of ``data_2``, or one
    each) scored with its text of ``data_2``, as /v1/rerank scores a query and a document.
    vLLM's other names for the two sides are taken too: text_1 and text_2, queries and
    documents, queries and items. use_activation false: a cross-encoder's logits."""

    data_1: ScoreTexts = Field(validation_alias=AliasChoices("data_1", "text_1", "queries"),
                               description="the queries: one, or one for each of data_2")
    data_2: ScoreTexts = Field(validation_alias=AliasChoices("data_2", "text_2", "documents",
                                                             "items"),
                               description="the documents")
    truncation_side: Literal["right", "left"] = Field(
        "right", description="where an input is cut: its end (right) or its start (left)")
    max_tokens_per_doc: TextTokens = Field(None, description="each of data_2 first cut to N "
                                           "tokens of text; none or 0: as the model reads it")
    max_tokens_per_query: TextTokens = Field(None, description="each of data_1 so")
    truncate_prompt_tokens: PromptTokens = Field(
        None, description="each pair (a cross-encoder's) or text (an embedding model's) cut "
        "to at most N tokens as the model reads it, as vLLM cuts it; -1 or none: at the "
        "model's max_length")

    @model_validator(mode="after")
    def _one_or_each(self):
        if len(self.queries) > 1 and len(self.queries) != len(self.documents):
            raise PydanticCustomError("pairs", "{queries} texts in data_1 and {documents} in "
                                      "data_2: send one in data_1, or one for each of "
                                      "data_2", {"queries": len(self.queries),
                                                 "documents": len(self.documents)})
        return self

    @property
    def queries(self) -> list[str]:
        return [self.data_1] if isinstance(self.data_1, str) else self.data_1

    @property
    def documents(self) -> list[str]:
        return [self.data_2] if isinstance(self.data_2, str) else self.data_2

    @property
    def texts(self) -> list:
        return [*self.queries, *self.documents]

    @property
    def name_of(self):
        """What the client calls the text at an index of the queries, then the documents."""
        q = len(self.queries)
        return lambda k: (f"document {k - q}" if k >= q else
                          "the query" if q == 1 else f"query {k}")

    @property
    def raw_scores(self) -> bool:
        """A cross-encoder's logits: use_activation (or an older name of it) false."""
        return not self.activated


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: dict


class PoolingRequest(EmbeddingsRequest):
    """vLLM's /pooling: each input's output as numbers, of the kind ``task`` says."""

    task: Literal["embed", "classify", "token_embed", "token_classify"] | None = Field(
        None, description="embed: an embedding model's embedding; classify: a classifier's "
        "label scores; token_embed: an embedding model's token vectors (one exported with "
        "--token-embeddings); token_classify: a NER model's label scores of each token; "
        "default: what the model does")


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | list[list[float]] | str


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: dict


class VllmTokenizeRequest(Body):
    """vLLM's /tokenize: one prompt's token ids."""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = Field(False, description="also each token as the vocabulary "
                                    "spells it")

    @property
    def texts(self) -> list[str]:
        return [self.prompt]


class VllmTokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class VllmDetokenizeRequest(Body):
    """vLLM's /detokenize: token ids back to text, special tokens included."""

    tokens: TokenIds

    @property
    def texts(self) -> list:
        return [self.tokens]


class VllmDetokenizeResponse(BaseModel):
    prompt: str


# /tokenize's body: vLLM's (``prompt`` and no ``inputs``) or TEI's
TokenizeBody = either(TokenizeRequest, VllmTokenizeRequest, ("TEI", "vLLM"), "prompt", "inputs")
