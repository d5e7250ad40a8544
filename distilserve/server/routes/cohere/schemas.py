"""Cohere's embed bodies: v2's (/v2/embed), and v1's, which /v1/embed takes beside the
native body (``EmbedBody``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from distilserve.server.core.inference import numbered
from distilserve.server.routes.native.schemas import Body, EmbedRequest, RerankRequest
from distilserve.server.routes.options import CONFIG, Count, Dimensions, either

CohereInputType = Literal["search_document", "search_query", "classification", "clustering"]
INPUT_TYPE = ("the model's prompt it is put behind, where it has one: query, document (or "
              "passage, corpus), classification, clustering")
CohereTypes = Annotated[list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]],
                        Field(min_length=1)]


class _CohereEmbed(Body):
    """What Cohere's v2 and v1 embed bodies share."""

    input_type: CohereInputType = Field(description=INPUT_TYPE)
    embedding_types: CohereTypes = ["float"]
    output_dimension: Dimensions
    truncate: Literal["NONE", "START", "END"] = "END"
    images: list | None = Field(None, description="not served: texts only")
    name_of = staticmethod(lambda index: f"text {index}")

    @field_validator("images")
    @classmethod
    def _texts_only(cls, value):
        if value is not None:
            raise PydanticCustomError("not_served", "images are not served here: send texts")
        return value


class CohereContent(BaseModel):
    """One part of an input's content: a text (an image is not served)."""

    model_config = CONFIG
    type: Literal["text", "image_url"]
    text: str | None = None

    @model_validator(mode="after")
    def _a_text(self):
        if self.type == "image_url":
            raise PydanticCustomError("not_served", "images are not served here: send "
                                      "text parts")
        if self.text is None:
            raise PydanticCustomError("missing", 'a part of type "text" needs its "text"')
        return self


class CohereInput(BaseModel):
    """One input of ``inputs``: its content, one embedding of its parts in order."""

    model_config = CONFIG
    content: Annotated[list[CohereContent], Field(min_length=1)]

    @property
    def text(self) -> str:
        """Its text parts, a line each."""
        return "\n".join(part.text for part in self.content)


class CohereEmbedRequest(_CohereEmbed):
    """Cohere's v2 embed (``cohere.ClientV2.embed``): ``texts``, or ``inputs`` of text
    parts (images are not served)."""

    texts_: Annotated[list[str], Field(min_length=1)] | None = Field(None, alias="texts")
    inputs: Annotated[list[CohereInput], Field(min_length=1)] | None = Field(
        None, description="each input's content: its text parts, embedded as one text, "
        "a line each")
    max_tokens: Count | None = Field(None, description="each input's tokens at most (its "
                                     "special tokens and the prompt not counted), cut as "
                                     "truncate says (NONE: a 413 for one with more)")

    @model_validator(mode="after")
    def _texts_or_inputs(self):
        if (self.texts_ is None) == (self.inputs is None):
            raise PydanticCustomError("texts_or_inputs", "send texts or inputs, one of them")
        return self

    @property
    def name_of(self):
        """What the client calls an input: a text, or one of its inputs."""
        return numbered if self.inputs is not None else _CohereEmbed.name_of

    @property
    def texts(self) -> list:
        if self.inputs is not None:
            return [each.text for each in self.inputs]
        return self.texts_ or []


class CohereV1EmbedRequest(_CohereEmbed):
    """Cohere's v1 embed (``cohere.Client.embed``), on /v1/embed: ``input_type`` and
    ``embedding_types`` optional (without types: the floats alone, Cohere's
    "embeddings_floats" answer)."""

    texts_: Annotated[list[str], Field(min_length=1)] = Field(alias="texts")
    input_type: CohereInputType | None = Field(None, description=INPUT_TYPE)
    embedding_types: CohereTypes | None = None

    @property
    def texts(self) -> list:
        return self.texts_


# /v1/embed's body: Cohere's v1 (``texts`` and no ``inputs``) or the native one
EmbedBody = either(EmbedRequest, CohereV1EmbedRequest, ("Native", "Cohere"), "texts", "inputs")


class CohereSpans(BaseModel):
    """Cohere's relevant_spans: asked for, not served."""

    model_config = CONFIG
    mode: Literal["enabled", "disabled"]

    @field_validator("mode")
    @classmethod
    def _disabled(cls, value):
        if value == "enabled":
            raise PydanticCustomError("not_served", "relevant spans are not served here")
        return value


class CohereRerankRequest(RerankRequest):
    """Cohere's v2 rerank (``cohere.ClientV2.rerank``): /v1/rerank's body, its
    max_tokens_per_doc too."""

    relevant_spans: CohereSpans | None = Field(None, description='not served: "disabled"')


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_by_type", "embeddings_floats"] = "embeddings_by_type"
    embeddings: dict[str, list] | list[list[float]] = Field(
        description="each type asked for: one embedding per text (base64: a string of its "
        "float32 bytes); v1's embeddings_floats: the float embeddings")
    texts: list[str]
    meta: dict
