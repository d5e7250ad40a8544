"""A model folder's manifest.json: written by ``distilserve export`` (models/export/),
read by the service (distilserve/server/engine.py), the bench and the load tests. An unreadable or
invalid manifest is a ManifestError naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from distilserve.models import families
from distilserve.models.tasks import POOLINGS

FILE = "manifest.json"
# a fill-mask model's language-model decoder (weight [V, E], bias [V]), beside its artifact
DECODER = "decoder.safetensors"


class ManifestError(Exception):
    """A manifest that cannot be used; the message names the file and the field."""


class TokenizerFacts(BaseModel):
    """What the service takes from transformers' tokenizer besides the Rust one: its
    special tokens and how it decodes. Recorded by export where checkpoint/tokenizer.json,
    read by tokenizers alone, is the tokenizer transformers loads from the folder; then the
    service reads it so and imports neither transformers nor torch to serve an ONNX model."""

    unk_token_id: int | None = None  # NER: a word the vocabulary does not hold
    cls_token_id: int | None = None  # QA: the token that answers "no answer"
    mask_token: str | None = None  # fill-mask: the token it fills
    mask_token_id: int | None = None
    # fill-mask's texts are transformers' decode: the Rust tokenizer's, then (where true)
    # its clean-up of spaces before punctuation; None: the tokenizer's class decodes its
    # own way (the service then decodes with transformers)
    clean_up_tokenization_spaces: bool | None = None

    def suffice(self, task: str) -> bool:
        """Whether these facts and the Rust tokenizer give all a model of ``task`` takes
        from transformers' tokenizer: not for fill-mask where its class decodes its own way."""
        return not (task == "fill-mask" and self.clean_up_tokenization_spaces is None)

    @classmethod
    def of(cls, tokenizer) -> TokenizerFacts:
        """A transformers tokenizer's."""
        from transformers import PreTrainedTokenizerFast

        base = PreTrainedTokenizerFast
        own = (type(tokenizer)._decode is not base._decode
               or type(tokenizer).clean_up_tokenization is not base.clean_up_tokenization)
        return cls(unk_token_id=tokenizer.unk_token_id, cls_token_id=tokenizer.cls_token_id,
                   mask_token=tokenizer.mask_token, mask_token_id=tokenizer.mask_token_id,
                   clean_up_tokenization_spaces=None if own else
                   bool(tokenizer.clean_up_tokenization_spaces))


class Manifest(BaseModel):
    # extra: what a newer export, or a builder (the embedded default's "training"), adds
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    task: Literal["embed", "classify", "ner", "qa", "fill-mask"]
    family: str
    backend: Literal["onnx", "torchscript", "torch"]
    max_length: int = Field(gt=0, description="longest input in tokens")
    artifact: str | None = Field(None, description="the served file, in the folder; none: "
                                 "the checkpoint/ folder (backend torch)")
    labels: list[str] = []
    relevant_label: str | None = None  # a cross-encoder's relevance output (rerank)
    # a classifier whose labels are independent (sigmoid each, not a softmax over them)
    multi_label: bool = False
    pooling: str | None = None  # embedding models: how tokens are pooled
    # an embedding model whose artifact gives the token vectors [B, T, D] (export
    # --token-embeddings): the service pools them as ``pooling`` says
    token_embeddings: bool = False
    # names the model answers to besides its folder's (export --alias)
    aliases: list[str] = []
    # embedding models: texts put before an input by name (sentence-transformers' prompts),
    # the default one before every input that names none
    prompts: dict[str, str] = {}
    default_prompt_name: str | None = None
    dimensions: int | None = Field(None, gt=0)  # embedding models: the width
    loop: Literal["unroll", "keep"] | None = None  # recursive families
    num_iterations: int | None = Field(None, gt=0)  # a recursive model's trained depth
    device: str | None = None  # run here, over DISTILSERVE_DEVICE
    dtype: str | None = None  # in this dtype, over DISTILSERVE_DTYPE
    # embedding models: the vocabulary of token-id inputs, over DISTILSERVE_TOKEN_IDS
    token_ids: Literal["model", "cl100k_base", "o200k_base"] | None = None
    # how the export went: parity, fp16/bf16 against fp32, int8 agreement
    parity: dict[str, Any] | None = None
    dtypes: dict[str, dict[str, Any]] | None = None
    quantization: dict[str, Any] | None = None
    files: list[str] = []
    parameters: int | None = None
    export_seconds: float | None = None
    versions: dict[str, str] = {}
    source: str | None = None
    checkpoint_extra: dict[str, Any] = {}
    tokenizer: TokenizerFacts | None = None  # none: the service loads it with transformers

    @property
    def allowed_dtypes(self) -> list[str]:
        """The dtypes the model may run in: its family's, less any its export found too far
        from fp32 (a manifest written before dtypes were checked: the family's)."""
        family = families.REGISTRY[self.family].dtypes
        if self.dtypes is None:
            return list(family)
        return [d for d in family if d == "fp32" or (self.dtypes.get(d) or {}).get("passed")]

    @field_validator("family")
    @classmethod
    def _a_family(cls, family: str) -> str:
        if family not in families.REGISTRY:
            raise ValueError(f"{family!r} is not one of {', '.join(families.REGISTRY)}")
        return family

    @model_validator(mode="after")
    def _a_pooling(self):
        known = (*POOLINGS, "splade", families.REGISTRY[self.family].pooling)
        if self.pooling not in (None, *known):  # CMOW's is its own
            raise ValueError(f"pooling {self.pooling!r} is not one of "
                             f"{', '.join(dict.fromkeys(known))}")
        return self

    @field_validator("artifact")
    @classmethod
    def _in_the_folder(cls, artifact: str | None) -> str | None:
        if artifact is not None and Path(artifact).name != artifact:
            raise ValueError(f"{artifact!r} must be a file in the folder")
        return artifact

    @model_validator(mode="after")
    def _default_prompt_is_a_prompt(self):
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not one of "
                             f"its prompts ({', '.join(self.prompts) or 'none'})")
        return self

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        file = Path(folder) / FILE
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            raise ManifestError(f"{file}: missing (write model folders with distilserve "
                                "export)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(f"{file}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{file}: not a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "manifest"
            raise ManifestError(f"{file}: {where}: {first['msg']}") from None

    def write(self, folder: Path) -> None:
        text = json.dumps(self.model_dump(mode="json"), indent=2)
        (Path(folder) / FILE).write_text(text + "\n")
