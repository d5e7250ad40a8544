"""Request and response bodies (the routes the reference pages list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from distilserve.server import errors
from distilserve.server.core.inference import numbered

Strategy = Literal["none", "simple", "first", "average", "max"]
ZERO_SHOT_TEMPLATE = "This example is {}."  # transformers' zero-shot-classification's
Texts = str | Annotated[list[str], Field(min_length=1)]
Pair = Annotated[list[str], Field(min_length=2, max_length=2)]


def _check_unicode(text: str, what: str) -> None:
    """JSON's \\uXXXX escapes can spell lone surrogates, which are no text at all (the
    tokenizer cannot take them): refused, ``what`` named."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError("invalid_text", "{what} is not valid Unicode: a lone "
                                  "surrogate at character {at}",
                                  {"what": what, "at": e.start}) from None


def with_options(body_type: type[BaseModel], model: str | None, inputs, options: dict):
    """A /v1 body of ``body_type`` for ``inputs``, its options another protocol's
    parameters (the Open Inference Protocol's, the Hugging Face Inference API's); refused
    naming the parameters that are not the route's."""
    try:
        return body_type.model_validate({**options, "model": model, "inputs": inputs})
    except ValidationError as e:
        raise errors.refused(e, "parameters: ") from None


def leading(first: str, then: str) -> Callable[[int], str]:
    """What a client calls the text at an index of one text and then its inputs (a
    rerank's query and documents, /similarity's source sentence and sentences): ``first``,
    then ``then N`` counted from 0."""
    return lambda index: f"{then} {index - 1}" if index else first


def _whole(value):
    """JSON Schema's integers include 3.0; the strict models take it as 3 (but not 3.5,
    "3" or true)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# bounded: no model could use more (a vocabulary, a width, a count of labels or
# documents), and nothing past a machine integer reaches numpy
LARGEST = 2**31 - 1
Count = Annotated[int, Field(ge=1, le=LARGEST), BeforeValidator(_whole)]
# one input as the model's own vocabulary ids, no special tokens
TokenIds = list[Annotated[int, Field(ge=0, le=LARGEST), BeforeValidator(_whole)]]
Dimensions = Annotated[Count | None, Field(None, description="keep the first N "
                                           "components, re-normalised (Matryoshka-style)")]


class Body(BaseModel):
    """A request body: strictly typed, naming its model (or none), its texts numbered as
    the client sent them."""

    # strict: true/false are booleans (not 0, 1 or "false"), numbers are not strings
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)
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
        """Every text is Unicode (_check_unicode)."""
        for i, text in enumerate(self.texts):
            if isinstance(text, list):  # token ids
                continue
            for part in (text,) if isinstance(text, str) else text:
                _check_unicode(part, self.name_of(i))
        return self


class Truncation(BaseModel):
    """How an input longer than the model's max_length tokens is cut, if at all."""

    model_config = Body.model_config
    truncate: bool = Field(True, description="cut an input longer than the model's "
                           "max_length tokens (false: such an input is a 413)")
    # TEI's field, with its spelling ("Right", "Left") too
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="where an input is cut: its end (right) or its start (left, "
        "keeping the most recent text)")

    @property
    def truncation(self) -> str | None:
        """How the engine cuts a long input: "right", "left", or None (refused)."""
        return self.truncation_direction.lower() if self.truncate else None


class Truncated(Truncation, Body):
    """A request whose inputs may be longer than the model's max_length tokens."""


class Deep(BaseModel):
    """A request that runs a model (the native, OpenAI's, TEI's and Infinity's): a
    recursive model's depth may be chosen."""

    iterations: int | None = Field(None, ge=1, description="a recursive model's depth for "
                                   "this request: 1 to its trained depth (GET /v1/models: "
                                   "iterations); default: its trained depth. For a model "
                                   "whose loop is kept (ONNX, TorchScript) or served from "
                                   "its checkpoint")


class EmbeddingsRequest(Deep, Body):
    """OpenAI's /v1/embeddings."""

    input: (Texts | Annotated[TokenIds, Field(min_length=1)]
            | Annotated[list[TokenIds], Field(min_length=1)]) = Field(
        description="a text, a non-empty list of texts, or token ids: [int] (one input) or "
        "[[int]], the model's own vocabulary ids without special tokens")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions = None
    user: str | None = None

    @property
    def inputs(self):
        return self.input  # OpenAI's name


class EmbedRequest(Deep, Truncated):
    inputs: Texts
    normalize: bool = True
    prompt_name: str | None = Field(None, description="one of the model's prompts (GET "
                                    "/v1/models lists them), put before every input; "
                                    "default: its default prompt, if it has one")
    dimensions: Dimensions = None


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: str


class RerankRequest(Deep, Truncated):
    """Jina's and Cohere's /rerank (also vLLM's and Infinity's)."""

    query: str
    documents: Annotated[list[str | RerankDocument], Field(min_length=1)] = Field(
        description='texts, or objects with a "text" (Jina\'s and Cohere\'s other form)')
    top_n: Count | None = Field(None, description="return the best N (default all)")
    return_documents: bool = False
    name_of = staticmethod(leading("the query", "document"))
    raw_scores: bool = Field(False, description="a cross-encoder's logit, not its "
                             "probability (TEI's field); an embedding model: the cosine")

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


# transformers' text-classification pipeline's function_to_apply: how logits become scores
Function = Literal["softmax", "sigmoid", "none"]
FUNCTION = ("as transformers' text-classification pipeline's: softmax, sigmoid (each "
            "label's logit on its own) or none (the logits); default: the sigmoid for one "
            "label or a multi-label model, else the softmax")


class Scored(BaseModel):
    """A classifier's request: how its logits become scores."""

    model_config = Body.model_config
    raw_scores: bool = Field(False, description="the logits, not probabilities (TEI's field)")

    def _function_to_apply(self) -> Function | None:
        """The function_to_apply asked for, where the request can ask for one."""
        return None

    @property
    def function(self) -> Function | None:
        """The function_to_apply (postprocess.label_scores'): none for raw_scores; None:
        as the model's labels say."""
        return "none" if self.raw_scores else self._function_to_apply()

    @model_validator(mode="after")
    def _one_function(self):
        if self.raw_scores and self._function_to_apply() not in (None, "none"):
            raise PydanticCustomError(
                "two_functions", "raw_scores asks for the logits and function_to_apply for "
                "the {function}: send one", {"function": self._function_to_apply()})
        return self


class ClassifyRequest(Deep, Scored, Truncated):
    inputs: str | Annotated[list[str | Pair], Field(min_length=1)] = Field(
        description="a text, a list of texts, or text pairs as two-item lists")
    top_k: Count | None = Field(None, description="return the N most likely labels "
                                "(default all)")
    function_to_apply: Function | None = Field(None, description=FUNCTION)
    candidate_labels: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="zero-shot classification, as transformers' zero-shot-"
        "classification pipeline: these labels, not the model's, each scored by an NLI "
        "model (one with an entailment label) as the hypothesis hypothesis_template makes "
        "of it, the text its premise; texts only")
    hypothesis_template: str = Field(ZERO_SHOT_TEMPLATE, description="zero-shot: a "
                                     "candidate label's hypothesis, {} where the label goes")
    multi_label: bool = Field(False, description="zero-shot: each candidate label scored on "
                              "its own (entailment against contradiction), not against the "
                              "others")

    @field_validator("candidate_labels")
    @classmethod
    def _labels(cls, labels: list[str] | None) -> list[str] | None:
        for i, label in enumerate(labels or ()):
            _check_unicode(label, f"label {i}")
        return labels

    @field_validator("hypothesis_template")
    @classmethod
    def _template(cls, template: str) -> str:
        _check_unicode(template, "it")
        if "{}" not in template:
            raise PydanticCustomError("zero_shot_template", "it holds no {} for the label "
                                      "to go in")
        return template

    def _function_to_apply(self) -> Function | None:
        return self.function_to_apply

    @model_validator(mode="after")
    def _zero_shot(self):
        if self.candidate_labels is not None and any(not isinstance(text, str)
                                                     for text in self.texts):
            raise PydanticCustomError("zero_shot_pairs", "candidate_labels: zero-shot "
                                      "classification takes texts, not pairs")
        if self.candidate_labels is not None and self.function_to_apply is not None:
            raise PydanticCustomError("zero_shot_function", "function_to_apply: zero-shot "
                                      "classification scores labels as multi_label says "
                                      "(raw_scores: the entailment logits)")
        return self

    def hypotheses(self) -> list[str]:
        """Each candidate label's hypothesis."""
        return [self.hypothesis_template.replace("{}", label)
                for label in self.candidate_labels]


class QaInput(BaseModel):
    model_config = Body.model_config
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


class QaRequest(Deep, Questions):
    """Extractive question answering, as transformers' question-answering pipeline."""

    top_k: Count = Field(1, description="the N best answers of each")
    max_answer_len: Count = Field(15, description="an answer's most tokens")
    handle_impossible_answer: bool = Field(False, description="the empty answer too, with "
                                           "its score (start and end 0)")
    align_to_words: bool = Field(True, description="an answer's span widened to whole words")
    max_seq_len: Count | None = Field(None, description="a window's tokens, the question's "
                                      "with the context's (default: the model's max_length, "
                                      "at most 384)")
    doc_stride: Annotated[int, Field(ge=0, le=LARGEST)] | None = Field(
        None, description="the tokens of a context a window shares with the one before "
        "(default: half a window, at most 128)")


class QaAnswer(BaseModel):
    score: float
    start: int = Field(description="the answer's first character in the context")
    end: int = Field(description="the character after its last")
    answer: str


class QaResponse(BaseModel):
    model: str
    results: list[list[QaAnswer]] = Field(description="each input's answers, best first")


class NerRequest(Deep, Truncated):
    inputs: Texts
    aggregation_strategy: Strategy = "simple"
    ignore_labels: list[str] = Field(["O"], description="entities of these labels left "
                                     "out (the pipeline's; given, they replace O)")
    stride: Annotated[int, Field(ge=0, le=LARGEST)] | None = Field(
        None, description="read a text longer than max_length tokens whole, in windows of "
        "max_length tokens each sharing this many with the one before (the "
        "token-classification pipeline's stride; truncate and truncation_direction then do "
        "not apply)")

    @field_validator("stride")
    @classmethod
    def _aggregated(cls, stride: int | None, info: ValidationInfo) -> int | None:
        if stride is not None and info.data.get("aggregation_strategy") == "none":
            raise PydanticCustomError("stride_unaggregated", "a text read in windows needs "
                                      "an aggregation_strategy other than none (a token's "
                                      "index would be its window's)")
        return stride


class Fill(BaseModel):
    model_config = Body.model_config
    top_k: Count = Field(5, description="the likeliest tokens of each mask (at most as many "
                         "as targets)")
    targets: str | Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="score only these tokens (a word not in the vocabulary: its first "
        "token, as the pipeline takes it)")

    @property
    def target_list(self) -> list[str] | None:
        return [self.targets] if isinstance(self.targets, str) else self.targets


class FillMaskRequest(Deep, Fill, Truncated):
    """transformers' fill-mask pipeline: texts with the model's mask token ([MASK])."""

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
