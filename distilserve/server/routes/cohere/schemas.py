"""Cohere's embed bodies: v2's (/v2/embed), and v1's, which /v1/embed takes beside the
native body (``EmbedBody``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from distilserve.server.routes.native.schemas import Body, EmbedRequest
from distilserve.server.routes.options import Dimensions

CohereInputType = Literal["search_document", "search_query", "classification", "clustering"]
INPUT_TYPE = ("the model's prompt it is put behind, where it has one: query, document (or "
              "passage, corpus), classification, clustering")
CohereTypes = Annotated[list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]],
                        Field(min_length=1)]


class CohereEmbedRequest(Body):
    """Cohere's v2 embed (``cohere.ClientV2.embed``): texts (images are not served)."""

    texts_: Annotated[list[str], Field(min_length=1)] = Field(alias="texts")
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

    @property
    def texts(self) -> list:
        return self.texts_


class CohereV1EmbedRequest(CohereEmbedRequest):
    """Cohere's v1 embed (``cohere.Client.embed``), on /v1/embed: ``input_type`` and
    ``embedding_types`` optional (without types: the floats alone, Cohere's
    "embeddings_floats" answer)."""

    input_type: CohereInputType | None = Field(None, description=INPUT_TYPE)
    embedding_types: CohereTypes | None = None


def _embed_body(value) -> str:
    """Which body /v1/embed was sent: Cohere's v1 (``texts`` and no ``inputs``) or the
    native one; the errors are then that body's alone."""
    if isinstance(value, CohereV1EmbedRequest) or (
            isinstance(value, dict) and "texts" in value and "inputs" not in value):
        return "Cohere"
    return "Native"


EmbedBody = Annotated[Annotated[EmbedRequest, Tag("Native")]
                      | Annotated[CohereV1EmbedRequest, Tag("Cohere")],
                      Discriminator(_embed_body)]


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_by_type", "embeddings_floats"] = "embeddings_by_type"
    embeddings: dict[str, list] | list[list[float]] = Field(
        description="each type asked for: one embedding per text (base64: a string of its "
        "float32 bytes); v1's embeddings_floats: the float embeddings")
    texts: list[str]
    meta: dict
