"""The tasks' options, as every protocol names them: the /v1 bodies hold them beside their
model and inputs (routes/native/schemas.py), the Open Inference Protocol's ``parameters``
are them, and the Hugging Face Inference API's ``parameters`` are made into them. Each set
has the core call that runs it (core/tasks.py, core/inference.embedded)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from distilserve.server import errors
from distilserve.server.core import postprocess, tasks
from distilserve.server.core.inference import Call, embedded

# strict: true/false are booleans (not 0, 1 or "false"), numbers are not strings; what a
# protocol adds of its own (OpenAI's user, Triton's binary_data_output) is left alone
CONFIG = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)
Strategy = Literal["none", "simple", "first", "average", "max"]
ZERO_SHOT_TEMPLATE = "This example is {}."  # transformers' zero-shot-classification's


def check_unicode(text: str, what: str) -> None:
    """JSON's \\uXXXX escapes can spell lone surrogates, which are no text at all (the
    tokenizer cannot take them): refused, ``what`` named."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError("invalid_text", "{what} is not valid Unicode: a lone "
                                  "surrogate at character {at}",
                                  {"what": what, "at": e.start}) from None


def whole_number(value):
    """JSON Schema's integers include 3.0; the strict models take it as 3 (but not 3.5,
    "3" or true)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# bounded: no model could use more (a vocabulary, a width, a count of labels or
# documents), and nothing past a machine integer reaches numpy
LARGEST = 2**31 - 1
Count = Annotated[int, Field(ge=1, le=LARGEST), BeforeValidator(whole_number)]
Dimensions = Annotated[Count | None, Field(None, description="keep the first N "
                                           "components, re-normalised (Matryoshka-style)")]
# vLLM's truncate_prompt_tokens: a number of tokens as the model reads an input, -1 its
# max_length
PromptTokens = Annotated[int, Field(ge=-1, le=LARGEST), BeforeValidator(whole_number)] | None
# a rerank's max_tokens_per_doc and vLLM's max_tokens_per_query: tokens of text, 0 or None
# not cut (vLLM's default)
TextTokens = Annotated[int, Field(ge=0, le=LARGEST), BeforeValidator(whole_number)] | None


def either(first: type, second: type, tags: tuple[str, str], marked_by: str, unless: str):
    """A route's body of two kinds (the native and another protocol's), told apart by its
    fields: ``second`` where it has ``marked_by`` and not ``unless``, else ``first``; the
    errors are then that kind's alone. ``tags``: the kinds' names, as the errors say."""
    def which(value) -> str:
        if isinstance(value, second) or (
                isinstance(value, dict) and marked_by in value and unless not in value):
            return tags[1]
        return tags[0]

    return Annotated[Annotated[first, Tag(tags[0])] | Annotated[second, Tag(tags[1])],
                     Discriminator(which)]


def parameters(options_type: type[BaseModel], given: dict | None) -> BaseModel:
    """Another protocol's parameters (the Open Inference Protocol's, the Hugging Face
    Inference API's made into these names) as ``options_type``; refused naming those that
    are not the task's."""
    try:
        return options_type.model_validate(given or {})
    except ValidationError as e:
        raise errors.refused(e, "parameters: ") from None


class Truncation(BaseModel):
    """How an input longer than the model's max_length tokens is cut, if at all."""

    model_config = CONFIG
    truncate: bool = Field(True, description="cut an input longer than the model's "
                           "max_length tokens (false: such an input is a 413)")
    # TEI's field, with its spelling ("Right", "Left") too, and vLLM's name for it
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", validation_alias=AliasChoices("truncation_direction", "truncation_side"),
        description="where an input is cut: its end (right) or its start (left, keeping the "
        "most recent text); also vLLM's truncation_side")

    @property
    def truncation(self) -> str | None:
        """How the engine cuts a long input: "right", "left", or None (refused)."""
        return self.truncation_direction.lower() if self.truncate else None


class Deep(BaseModel):
    """A request that runs a model (the native, OpenAI's, TEI's and Infinity's): a
    recursive model's depth may be chosen."""

    model_config = CONFIG
    iterations: int | None = Field(None, ge=1, description="a recursive model's depth for "
                                   "this request: 1 to its trained depth (GET /v1/models: "
                                   "iterations); default: its trained depth. For a model "
                                   "whose loop is kept (ONNX, TorchScript) or served from "
                                   "its checkpoint")


# vLLM's -------------------------------------------------------------------------------
class Packing(BaseModel):
    """How outputs' numbers are sent: OpenAI's encoding_format, with vLLM's bytes
    encodings and the dtype and byte order of its packed numbers."""

    model_config = CONFIG
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = Field(
        "float", description="float: JSON numbers; base64: each output's packed numbers "
        "(embed_dtype, endianness) in base64; vLLM's bytes: the body is the outputs' packed "
        "numbers one after another, its metadata header says where each lies (and the "
        "answer's model and usage); bytes_only: the same without the header")
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = Field(
        "float32", description="vLLM's: the packed numbers' type, each rounded to the "
        "nearest")
    endianness: Literal["little", "big", "native"] = Field(
        "little", description="vLLM's: the packed numbers' byte order (native: the "
        "server's)")

    @property
    def in_bytes(self) -> bool:
        """The answer is the packed outputs themselves (routes/common.packed_reply)."""
        return self.encoding_format in ("bytes", "bytes_only")

    def payload(self, output: np.ndarray) -> np.ndarray | str:
        """One output as the JSON answer holds it: its numbers, or their base64."""
        return postprocess.embedding_payload(output, self.encoding_format, self.embed_dtype,
                                             self.endianness)


class Prioritised(BaseModel):
    """vLLM's priority: where a request's inputs go in its model's queue."""

    model_config = CONFIG
    priority: Annotated[int, Field(ge=-LARGEST, le=LARGEST), BeforeValidator(whole_number)] = \
        Field(0, description="vLLM's: a batch starts from the queued inputs of the lowest "
              "priority (then as it would); default 0")


class Activation(BaseModel):
    """vLLM's use_activation, and its older names: whether an output goes through the
    model's function (an embedding normalised, a classifier's logits made probabilities)."""

    model_config = CONFIG
    use_activation: bool | None = Field(None, description="false: the model's raw output "
                                        "(an embedding not normalised, a classifier's "
                                        "logits); default true")
    normalize: bool | None = Field(None, description="use_activation's older name")
    activation: bool | None = Field(None, description="use_activation's older name")
    softmax: bool | None = Field(None, description="use_activation's older name")

    @property
    def activated(self) -> bool:
        return next((v for v in (self.use_activation, self.normalize, self.activation,
                                 self.softmax) if v is not None), True)


# embeddings -----------------------------------------------------------------------------
class EmbedOptions(Deep, Truncation):
    normalize: bool = True
    prompt_name: str | None = Field(None, description="one of the model's prompts (GET "
                                    "/v1/models lists them), put before every input; "
                                    "default: its default prompt, if it has one")
    dimensions: Dimensions = None


def embed(call: Call, model: str | None, texts: list, o: EmbedOptions):
    """(model, embeddings [N, D], run)."""
    return embedded(call, model, texts, o.dimensions, o.prompt_name, o.truncation,
                    o.normalize, iterations=o.iterations)


# classification -------------------------------------------------------------------------
# transformers' text-classification pipeline's function_to_apply: how logits become scores
Function = Literal["softmax", "sigmoid", "none"]
FUNCTION = ("as transformers' text-classification pipeline's: softmax, sigmoid (each "
            "label's logit on its own) or none (the logits); default: the sigmoid for one "
            "label or a multi-label model, else the softmax")


class Scored(BaseModel):
    """A classifier's request: how its logits become scores."""

    model_config = CONFIG
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


class ClassifyOptions(Deep, Scored, Truncation):
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
            check_unicode(label, f"label {i}")
        return labels

    @field_validator("hypothesis_template")
    @classmethod
    def _template(cls, template: str) -> str:
        check_unicode(template, "it")
        if "{}" not in template:
            raise PydanticCustomError("zero_shot_template", "it holds no {} for the label "
                                      "to go in")
        return template

    def _function_to_apply(self) -> Function | None:
        return self.function_to_apply

    @model_validator(mode="after")
    def _zero_shot(self):
        if self.candidate_labels is not None and self.function_to_apply is not None:
            raise PydanticCustomError("zero_shot_function", "function_to_apply: zero-shot "
                                      "classification scores labels as multi_label says "
                                      "(raw_scores: the entailment logits)")
        return self

    def hypotheses(self) -> list[str]:
        """Each candidate label's hypothesis."""
        return [self.hypothesis_template.replace("{}", label)
                for label in self.candidate_labels]


def classify(call: Call, model: str | None, texts: list, o: ClassifyOptions):
    """(model, each input's labels and scores, run): zero-shot where the options name
    candidate labels."""
    if o.candidate_labels:
        return tasks.zero_shot(call, model, texts, o.candidate_labels, o.hypotheses(),
                               o.truncation, o.multi_label, o.raw_scores, o.top_k,
                               o.iterations)
    return tasks.classify(call, model, texts, o.truncation, o.function, o.top_k,
                          o.iterations)


# token classification -------------------------------------------------------------------
class NerOptions(Deep, Truncation):
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


def recognise(call: Call, model: str | None, texts: list[str], o: NerOptions):
    """(model, each text's entities, run)."""
    return tasks.recognise(call, model, texts, o.truncation, o.aggregation_strategy,
                           tuple(o.ignore_labels), o.stride, o.iterations)


# question answering ---------------------------------------------------------------------
class QaOptions(Deep):
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


def answer(call: Call, model: str | None, pairs: list[tuple[str, str]], o: QaOptions):
    """(model, each (question, context)'s answers, run)."""
    return tasks.answer(call, model, pairs, o.top_k, o.max_answer_len,
                        o.handle_impossible_answer, o.align_to_words, o.max_seq_len,
                        o.doc_stride, o.iterations)


# fill-mask ------------------------------------------------------------------------------
class Fill(BaseModel):
    model_config = CONFIG
    top_k: Count = Field(5, description="the likeliest tokens of each mask (at most as many "
                         "as targets)")
    targets: str | Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="score only these tokens (a word not in the vocabulary: its first "
        "token, as the pipeline takes it)")

    @property
    def target_list(self) -> list[str] | None:
        return [self.targets] if isinstance(self.targets, str) else self.targets


class FillMaskOptions(Deep, Fill, Truncation):
    """transformers' fill-mask pipeline's: texts with the model's mask token ([MASK])."""


def fill(call: Call, model: str | None, texts: list[str], o: FillMaskOptions):
    """(model, per text and mask its likeliest tokens, run)."""
    return tasks.fill(call, model, texts, o.truncation, o.top_k, o.target_list, o.iterations)
