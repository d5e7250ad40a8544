"""The bodies of Text Embeddings Inference's routes and of the Hugging Face Inference
API's at POST / and /models/NAME (distilserve/server/routes/tei/http_routes.py), and Infinity's
/classify: each a /v1 body in TEI's, the Inference API's or Infinity's shape."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from distilserve.server.core.tokenisation import WholeIds
from distilserve.server.routes.native.schemas import (
    Body,
    EmbedRequest,
    FillMaskToken,
    QaAnswer,
    Questions,
    RerankRequest,
    Score,
    Texts,
    TokenIds,
    Truncated,
    Usage,
    leading,
)
from distilserve.server.routes.options import (
    CONFIG,
    FUNCTION,
    Count,
    Deep,
    Fill,
    Function,
    Scored,
    Strategy,
    Truncation,
)


class HfFillMaskParameters(Fill):
    top_k: Count | None = None  # (FillMaskOptions' default)


class HfFillMaskRequest(Truncated):
    """huggingface_hub's fill_mask: /v1/fill-mask's, its options as ``parameters``."""

    inputs: Texts
    parameters: HfFillMaskParameters | None = None


# one input of TEI's /predict: [text] or [text, text]
Sequence = Annotated[list[str], Field(min_length=1, max_length=2)]


class HfClassifyParameters(BaseModel):
    model_config = CONFIG
    top_k: Count | None = Field(None, description="the N most likely labels (default all)")
    function_to_apply: Function | None = Field(None, description=FUNCTION)


class TeiPredictRequest(Deep, Scored, Truncated):
    """TEI's /predict: a text, a pair [text, text], or a batch [[text], [text, text], ...];
    with the Hugging Face Inference API's ``parameters`` (huggingface_hub's
    text_classification) too."""

    inputs: str | Sequence | Annotated[list[Sequence], Field(min_length=1)] = Field(
        description="a text, a pair of texts [text, text], or a batch of [text] and "
        "[text, text] items")
    parameters: HfClassifyParameters | None = None

    def _function_to_apply(self) -> Function | None:
        return self.parameters and self.parameters.function_to_apply

    @property
    def batch(self) -> bool:
        return not isinstance(self.inputs, str) and isinstance(self.inputs[0], list)

    @property
    def texts(self) -> list:
        sequences = self.inputs if self.batch else [self.inputs]
        return [s if isinstance(s, str) else s[0] if len(s) == 1 else (s[0], s[1])
                for s in sequences]


class TeiRerankRequest(Deep, Truncated):
    """TEI's /rerank."""

    query: str
    texts_: Annotated[list[str], Field(min_length=1)] = Field(alias="texts")
    raw_scores: bool = Field(False, description="a cross-encoder's logit, not its "
                             "probability; an embedding model: the cosine")
    return_text: bool = False
    name_of = staticmethod(leading("the query", "document"))
    max_tokens_per_doc: ClassVar[None] = None  # (TEI's documents are cut as the model reads)
    truncate_prompt_tokens: ClassVar[None] = None
    max_tokens_per_query: ClassVar[None] = None

    @property
    def document_texts(self) -> list[str]:
        return self.texts_

    @property
    def texts(self) -> list:
        return [self.query, *self.texts_]


# TEI's token ids: one input as the model's whole input, its special tokens included (as
# /tokenize gives them)
TeiIds = Annotated[TokenIds, Field(min_length=1)]
TeiInputs = str | TeiIds | Annotated[list[str | TeiIds], Field(min_length=1)]
TEI_INPUTS = ("a text, token ids [int] (the model's vocabulary; the whole input, its special "
              "tokens included, as /tokenize gives them), or a non-empty list of them")


def whole(texts: list) -> list:
    """Token-id inputs as TEI takes them: each the model's whole input."""
    return [WholeIds(t) if isinstance(t, list) else t for t in texts]


class TeiEmbedRequest(EmbedRequest):
    """TEI's /embed (and POST /'s feature extraction): /v1/embed's body, its inputs texts
    or token ids."""

    inputs: TeiInputs = Field(description=TEI_INPUTS)

    @property
    def texts(self) -> list:
        return whole(super().texts)


class TeiInputsRequest(Truncated):
    """TEI's /embed_all and /embed_sparse."""

    inputs: TeiInputs = Field(description=TEI_INPUTS)
    prompt_name: str | None = Field(None, description="as /v1/embed's")

    @property
    def texts(self) -> list:
        return whole(super().texts)


class TeiSimilarityInputs(BaseModel):
    model_config = CONFIG
    source_sentence: str
    sentences: Annotated[list[str], Field(min_length=1)] = Field(
        description="the texts compared with source_sentence")


class TeiSimilarityParameters(Truncation):
    prompt_name: str | None = Field(None, description="as /v1/embed's")


class TeiSimilarityRequest(Body):
    """TEI's /similarity (huggingface_hub's InferenceClient.sentence_similarity posts it
    to /)."""

    inputs: TeiSimilarityInputs
    parameters: TeiSimilarityParameters | None = None
    name_of = staticmethod(leading("the source sentence", "sentence"))

    @property
    def texts(self) -> list:
        return [self.inputs.source_sentence, *self.inputs.sentences]


def _root_body(value) -> str:
    """Which of TEI's bodies POST / was sent: /similarity's (its inputs an object) or
    /embed's; the errors are then that body's alone."""
    inputs = value.get("inputs") if isinstance(value, dict) else getattr(value, "inputs", None)
    return "Similarity" if isinstance(inputs, dict | TeiSimilarityInputs) else "Embed"


TeiRootRequest = Annotated[Annotated[TeiEmbedRequest, Tag("Embed")]
                           | Annotated[TeiSimilarityRequest, Tag("Similarity")],
                           Discriminator(_root_body)]


def _rerank_body(value) -> str | None:
    """Which body /rerank was sent: Cohere's (``documents``) or TEI's (``texts``)."""
    if isinstance(value, RerankRequest) or isinstance(value, dict) and "documents" in value:
        return "Cohere"
    if isinstance(value, TeiRerankRequest) or isinstance(value, dict) and "texts" in value:
        return "Tei"
    return None  # neither: the error says what a body needs


TeiRerankBody = Annotated[
    Annotated[TeiRerankRequest, Tag("Tei")] | Annotated[RerankRequest, Tag("Cohere")],
    Discriminator(_rerank_body, custom_error_type="invalid_body", custom_error_message=(
        "a rerank body has 'texts' (TEI's) or 'documents' (Cohere's, as /v1/rerank)"))]


class TeiInfo(BaseModel):
    """TEI's GET /info."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict = Field(description='{"embedding": {"pooling"}}, or {"classifier": '
                             '{"id2label", "label2id"}} ("reranker" for a cross-encoder)')
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None


class TeiSparseValue(BaseModel):
    index: int = Field(description="the vocabulary entry (a token id)")
    value: float


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


# the Hugging Face Inference API's bodies at POST / (huggingface_hub's InferenceClient) for
# what TEI does not do there: zero-shot and token classification, question answering
class HfZeroShotParameters(BaseModel):
    model_config = CONFIG
    candidate_labels: Annotated[list[str], Field(min_length=1)]
    hypothesis_template: str | None = None  # (ClassifyOptions' default)
    multi_label: bool | None = None


class HfZeroShotRequest(Truncated):
    """huggingface_hub's zero_shot_classification: /v1/classify's zero-shot, its options
    as ``parameters``."""

    inputs: Texts
    parameters: HfZeroShotParameters


class HfZeroShotAnswer(BaseModel):
    sequence: str
    labels: list[str]
    scores: list[float]


class HfQaParameters(BaseModel):
    model_config = CONFIG
    top_k: Count | None = None  # (None: QaOptions' default)
    max_answer_len: Count | None = None
    handle_impossible_answer: bool | None = None
    align_to_words: bool | None = None
    max_question_len: int | None = Field(None, description="ignored, as the pipeline ignores "
                                         "it with a fast tokenizer")
    doc_stride: int | None = None
    max_seq_len: int | None = None


class HfQaRequest(Questions):
    """huggingface_hub's question_answering: /v1/qa's, its options as ``parameters``."""

    parameters: HfQaParameters | None = None


class HfTokenParameters(BaseModel):
    model_config = CONFIG
    aggregation_strategy: Strategy | None = None  # (NerOptions' default)
    ignore_labels: list[str] | None = None  # (None: NerOptions' default)
    stride: int | None = None


class HfTokenRequest(Truncated):
    """huggingface_hub's token_classification: /v1/ner's, its options as ``parameters``."""

    inputs: Texts
    parameters: HfTokenParameters | None = None


# what POST / answers: /embed's, /similarity's, /predict's or /rerank's answer, and the
# Hugging Face Inference API's zero-shot and token classification and question answering
TeiAnswer = (list[list[float]] | list[float] | list[Score] | list[list[Score]] | list[TeiRank]
             | HfZeroShotAnswer | list[HfZeroShotAnswer] | list[dict] | list[list[dict]]
             | QaAnswer | list[QaAnswer] | list[QaAnswer | list[QaAnswer]]
             | list[list[list[FillMaskToken]]])


class TeiVertexRequest(BaseModel):
    """Vertex AI's prediction request, as TEI takes it at /vertex."""

    model_config = CONFIG
    instances: Annotated[list[dict], Field(min_length=1)] = Field(
        description="each a body POST / takes")


class TeiVertexResponse(BaseModel):
    predictions: list[TeiAnswer] = Field(description="each instance's answer, in order")


# Infinity's /classify
class InfinityClassifyRequest(Deep, Scored, Truncated):
    """Infinity's /classify."""

    input: Texts = Field(description="a text or a list of texts")

    @property
    def inputs(self):
        return self.input  # Infinity's name


class InfinityClassifyResponse(BaseModel):
    object: Literal["classify"] = "classify"
    data: list[list[Score]]
    model: str
    usage: Usage
