"""Request and response bodies (the routes the reference pages list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from distilserve.server.core.inference import numbered
from distilserve.server.routes.options import (
    CONFIG,
    LARGEST,
    Activation,
    ClassifyOptions,
    Deep,
    Dimensions,
    EmbedOptions,
    FillMaskOptions,
    NerOptions,
    Packing,
    Prioritised,
    PromptTokens,
    QaOptions,
    TextTokens,
    Truncation,
    check_unicode,
    whole_number,
)

Texts = str | Annotated[list[str], Field(min_length=1)]
Pair = Annotated[list[str], Field(min_length=2, max_length=2)]


def leading(first: str, then: str) -> Callable[[int], str]:
    """What a client calls the text at an index of one text and then its inputs (a
    rerank's query and documents, /similarity's source sentence and sentences): ``first``,
    then ``then N`` counted from 0."""
    return lambda index: f"{then} {index - 1}" if index else first


# one input as the model's own vocabulary ids, no special tokens
TokenIds = list[Annotated[int, Field(ge=0, le=LARGEST), BeforeValidator(whole_number)]]


class Body(BaseModel):
    """A request body: strictly typed, naming its model (or none), its texts numbered as
    the client sent them."""

    model_config = CONFIG
    model: str | None = None
    # what the client calls the text at an index of ``texts`` (in messages)
    name_of: ClassVar[Callable[[int], str]] = staticmethod(numbered)

    @property
    def texts(self) -> list:
        """The inputs as a list: texts, (text, text) pairs, or token-id lists."""
        value = self.inputs
        if isinstance(value, str) or value and isinstance(value[0], int):
            value = [value]
        return [x if isinstance(x, str) or not x or isinstance(x[0], int)  # text, ids
                else (x[0], x[1]) for x in value]  # a pair

    @model_validator(mode="after")
    def _unicode(self):
        """Every text is Unicode (options.check_unicode)."""
        for i, text in enumerate(self.texts):
            if isinstance(text, list):  # token ids
                continue
            for part in (text,) if isinstance(text, str) else text:
                check_unicode(part, self.name_of(i))
        return self


class Truncated(Truncation, Body):
    """A request whose inputs may be longer than the model's max_length tokens."""


class EmbeddingsRequest(Deep, Packing, Activation, Prioritised, Body):
    """OpenAI's /v1/embeddings, with vLLM's fields."""

    input: (Texts | Annotated[TokenIds, Field(min_length=1)]
            | Annotated[list[TokenIds], Field(min_length=1)]) = Field(
        description="a text, a non-empty list of texts, or token ids: [int] (one input) or "
        "[[int]], the model's own vocabulary ids without special tokens")
    dimensions: Dimensions = None
    user: str | None = None
    truncate_prompt_tokens: PromptTokens = Field(
        None, description="vLLM's: each input cut to at most N tokens as the model reads it "
        "(its special tokens and prompt counted); -1 or none: at the model's max_length")
    truncation_side: Literal["right", "left"] = Field(
        "right", description="vLLM's: where an input is cut, to truncate_prompt_tokens or "
        "max_length: its end (right) or its start (left)")
    add_special_tokens: bool = Field(True, description="vLLM's: false is not served (each "
                                     "input is read with its special tokens)")

    @field_validator("add_special_tokens")
    @classmethod
    def _special_tokens(cls, value):
        if not value:
            raise PydanticCustomError("not_served", "false is not served: the model reads "
                                      "each input with its special tokens")
        return value

    @property
    def inputs(self):
        return self.input  # OpenAI's name


class EmbedRequest(EmbedOptions, Body):
    inputs: Texts


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: str


class RerankRequest(Deep, Prioritised, Truncated):
    """Jina's and Cohere's /rerank (also vLLM's and Infinity's)."""

    query: str
    documents: Annotated[list[str | RerankDocument], Field(min_length=1)] = Field(
        description='texts, or objects with a "text" (Jina\'s and Cohere\'s other form)')
    top_n: Annotated[int, Field(ge=0, le=LARGEST), BeforeValidator(whole_number)] | None = (
        Field(None, description="return the best N (default, or 0 as vLLM sends it: all)"))
    return_documents: bool = False
    name_of = staticmethod(leading("the query", "document"))
    raw_scores: bool = Field(False, description="a cross-encoder's logit, not its "
                             "probability (TEI's field); an embedding model: the cosine")
    max_tokens_per_doc: TextTokens = Field(None, description="each document first cut to N "
                                           "tokens (its special tokens not counted; Cohere's "
                                           "and vLLM's field) as truncation_direction says; "
                                           "none or 0: as the model reads it")
    max_tokens_per_query: TextTokens = Field(None, description="vLLM's: the query first cut "
                                             "to N tokens so; none or 0: as the model reads it")
    truncate_prompt_tokens: PromptTokens = Field(
        None, description="vLLM's: each pair (a cross-encoder's) or text (an embedding "
        "model's) cut to at most N tokens as the model reads it; -1 or none: at the model's "
        "max_length")

    @property
    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    @property
    def texts(self) -> list:
        return [self.query, *self.document_texts]


class TokenizeRequest(Body):
    """TEI's /tokenize."""

    inputs: Texts
    add_special_tokens: bool = True
    prompt_name: str | None = Field(None, description="one of the model's prompts, put "
                                    "before every input (offsets then count its "
                                    "characters); default: none")


class ClassifyRequest(ClassifyOptions, Body):
    inputs: str | Annotated[list[str | Pair], Field(min_length=1)] = Field(
        description="a text, a list of texts, or text pairs as two-item lists")

    @model_validator(mode="after")
    def _zero_shot_texts(self):
        if self.candidate_labels is not None and any(not isinstance(text, str)
                                                     for text in self.texts):
            raise PydanticCustomError("zero_shot_pairs", "candidate_labels: zero-shot "
                                      "classification takes texts, not pairs")
        return self


class QaInput(BaseModel):
    model_config = CONFIG
    question: str = Field(min_length=1, description="kept whole")
    context: str = Field(min_length=1, description="where the answer is found")


class Questions(Body):
    inputs: QaInput | Annotated[list[QaInput], Field(min_length=1)] = Field(
        description="a question and its context, or a list of them")

    @property
    def texts(self) -> list[tuple[str, str]]:
        """(question, context) pairs."""
        inputs = self.inputs if isinstance(self.inputs, list) else [self.inputs]
        return [(i.question, i.context) for i in inputs]


class QaRequest(QaOptions, Questions):
    """Extractive question answering, as transformers' question-answering pipeline."""


class QaAnswer(BaseModel):
    score: float
    start: int = Field(description="the answer's first character in the context")
    end: int = Field(description="the character after its last")
    answer: str


class QaResponse(BaseModel):
    model: str
    results: list[list[QaAnswer]] = Field(description="each input's answers, best first")


class NerRequest(NerOptions, Body):
    inputs: Texts


class FillMaskRequest(FillMaskOptions, Body):
    inputs: Texts


class FillMaskToken(BaseModel):
    score: float = Field(description="its probability at the mask, over the vocabulary")
    token: int
    token_str: str
    sequence: str = Field(description="the input with the mask filled")


class FillMaskResponse(BaseModel):
    model: str
    results: list[list[list[FillMaskToken]]] = Field(
        description="per input, per mask token, the likeliest tokens first")


class DecodeRequest(Body):
    """TEI's /decode: token ids back to text."""

    ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="one input's ids [int], or several [[int]]")
    skip_special_tokens: bool = True

    @property
    def texts(self) -> list:
        return [self.ids] if not self.ids or isinstance(self.ids[0], int) else self.ids


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


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    model: str
    results: list[RerankResult]
    usage: Usage


class Token(BaseModel):
    id: int
    text: str
    start: int | None = Field(description="character offset into the input; null for a "
                              "special token")
    stop: int | None
    special: bool
