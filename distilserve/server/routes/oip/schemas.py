"""The Open Inference Protocol's bodies (KServe's V2, Triton's HTTP/REST API), which
distilserve/server/routes/oip/http_routes.py takes and answers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from distilserve.server.routes.options import CONFIG

# a tensor's or a request's parameters: scalars by name (null: none)
OipParameters = Annotated[dict[str, str | int | float | bool],
                          BeforeValidator(lambda value: {} if value is None else value)]


class OipTensor(BaseModel):
    """A tensor: row-major ``data`` (nested or flat), or with Triton's binary extension
    ``parameters.binary_data_size`` bytes after the JSON header."""

    model_config = CONFIG
    name: str
    datatype: str = Field(description="BYTES for texts (each UTF-8), FP32 for numbers")
    shape: list[int]
    parameters: OipParameters = {}
    data: list | None = None


class OipRequestedOutput(BaseModel):
    model_config = CONFIG
    name: str
    parameters: OipParameters = Field(
        {}, description='{"binary_data": true}: this output as binary data; '
        '{"classification": k}: a classifier\'s k best classes')


class OipInferRequest(BaseModel):
    model_config = CONFIG
    id: str | None = None
    parameters: OipParameters = Field(
        {}, description="the route's options (normalize, dimensions, prompt_name, "
        "raw_scores, aggregation_strategy, truncate, truncation_direction) and "
        "binary_data_output: every output as binary data")
    inputs: Annotated[list[OipTensor], Field(min_length=1)]
    outputs: list[OipRequestedOutput] | None = Field(
        None, description="the outputs to return (default: all of the model's)")


class OipInferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict | None = None
    outputs: list[OipTensor]


class OipTensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1: any size")


class OipModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[OipTensorMetadata]
    outputs: list[OipTensorMetadata]


class OipServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class OipIndexRequest(BaseModel):
    """Triton's repository index: an empty body, or ``{"ready": true}``."""

    model_config = CONFIG
    ready: bool = Field(False, description="the models served alone")


class OipControlRequest(BaseModel):
    """Triton's load and unload: an empty body, or its ``parameters`` (a load's config and
    files are refused; an unload's unload_dependents is taken: a model has none)."""

    model_config = CONFIG
    parameters: OipParameters = {}


class OipRepositoryModel(BaseModel):
    name: str
    state: Literal["READY", "UNAVAILABLE"]
    reason: str | None = None


class OipDuration(BaseModel):
    count: int
    ns: int


class OipInferenceStats(BaseModel):
    success: OipDuration
    fail: OipDuration
    queue: OipDuration
    compute_input: OipDuration
    compute_infer: OipDuration
    compute_output: OipDuration
    cache_hit: OipDuration
    cache_miss: OipDuration


class OipBatchStats(BaseModel):
    batch_size: int
    compute_infer: OipDuration


class OipModelStats(BaseModel):
    name: str
    version: str
    last_inference: int = Field(description="when a request was last answered, "
                                "milliseconds since the epoch (0: never)")
    inference_count: int = Field(description="inputs run")
    execution_count: int = Field(description="batches run")
    inference_stats: OipInferenceStats
    batch_stats: list[OipBatchStats]


class OipStatistics(BaseModel):
    model_stats: list[OipModelStats]


class OipConfigTensor(BaseModel):
    name: str
    data_type: str
    dims: list[int]
    reshape: dict | None = None


class OipModelConfig(BaseModel):
    """Triton's model configuration (config.pbtxt's fields, as Triton's JSON gives them)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    input: list[OipConfigTensor]
    output: list[OipConfigTensor]
    dynamic_batching: dict
    instance_group: list[dict]
    parameters: dict[str, dict[str, str]]


def inlined(schema: dict) -> dict:
    """A model's JSON schema with its $defs in place of their references (the OpenAPI
    document holds only the models of the bodies FastAPI reads itself)."""
    defs = schema.pop("$defs", {})

    def resolve(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        return [resolve(item) for item in node] if isinstance(node, list) else node

    return resolve(schema)
