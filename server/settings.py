"""Every setting of the service in one place; each has a DISTILSERVE_* environment twin
(DISTILSERVE_PORT, DISTILSERVE_MAX_BATCH_SIZE, ...)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DISTILSERVE_", protected_namespaces=())

    model_repository: Path | None = Field(None, description="folder of model folders; "
                                          "none: the embedded default")
    host: str = "127.0.0.1"
    port: int = 8000
    cache_dir: Path = Field(Path.home() / ".cache" / "distilserve",
                            description="where the embedded default repository is built")
    api_key: SecretStr | None = Field(None, description="require Authorization: Bearer KEY")

    # request limits
    max_inputs: int = Field(256, ge=1, description="inputs per request")
    max_input_chars: int = Field(20_000, ge=1, description="characters per input")
    max_body_bytes: int = Field(4_000_000, ge=1024, description="request body size")

    # batching, per model
    max_batch_size: int = Field(32, ge=1, description="inputs per forward pass")
    max_batch_tokens: int = Field(16_384, ge=1, description="padded tokens per forward pass")
    max_wait_ms: float = Field(0.0, ge=0, description="how long a batch may wait for more "
                               "inputs while the model is idle")
    max_queue: int = Field(1024, ge=1, description="queued inputs per model before 429")

    # runtime
    threads: int = Field(0, ge=0, description="intra-op threads per model (0: all cores)")
    warmup: bool = True
    access_log: bool = Field(False, description="log every request (uvicorn's access log; "
                             "costs throughput under load)")
