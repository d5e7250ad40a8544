"""Every setting of the service in one place; each has a DISTILSERVE_* environment twin
(DISTILSERVE_PORT, DISTILSERVE_MAX_BATCH_SIZE, ...)."""

from __future__ import annotations

import difflib
import gc
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from distilserve.models.runtime.cores import available_cores


def _alias_pairs(text: str) -> list[tuple[str, str]]:
    """``alias=folder,...`` as (alias, folder) pairs; a ValueError naming a pair that is
    not one."""
    pairs = []
    for pair in (p for p in text.split(",") if p.strip()):
        alias, equals, folder = pair.partition("=")
        if not equals or not alias.strip() or not folder.strip():
            raise ValueError(f"{pair.strip()!r} is not alias=folder")
        pairs.append((alias.strip(), folder.strip()))
    return pairs


PREFIX = "DISTILSERVE_"
# what Kubernetes sets in a pod for each Service of its namespace, NAME_SERVICE_HOST,
# NAME_SERVICE_PORT[_PORTNAME] and NAME_PORT[_N_TCP[_PROTO|_PORT|_ADDR]] (NAME_PORT's
# value a URL): not settings, where a Service is named distilserve or distilserve-...
SERVICE_LINK = re.compile(r".*_SERVICE_(HOST|PORT(_\w+)?)|.*_PORT_\d+_(TCP|UDP|SCTP)(_\w+)?")
SERVICE_LINK_VALUE = re.compile(r"(tcp|udp|sctp)://")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, protected_namespaces=())

    model_repository: Path | None = Field(None, description="folder of model folders; "
                                          "none: the embedded default")
    host: str = Field("127.0.0.1", description="the address to listen on; another than "
                      "loopback (0.0.0.0) without an API key exposes every route, and the "
                      "start warns of it")
    port: int = Field(8000, ge=1, le=65535, description="the HTTP port")
    grpc_port: int | None = Field(None, ge=1, le=65535, description="also serve gRPC on "
                                  "this port, not the HTTP one (Triton's is 8001): the Open "
                                  "Inference Protocol (KServe's V2, Triton's), Text "
                                  "Embeddings Inference's tei.v1, grpc.health.v1 and "
                                  "reflection; none: no gRPC")
    workers: int = Field(1, ge=1, description="processes serving the port; one that dies "
                         "is restarted")
    engine: Literal["auto", "shared", "per-worker"] = Field(
        "auto", description="where the models run with several workers: shared, one engine "
        "process holding one copy of each model, fed token ids by the workers (which parse, "
        "validate and tokenise), its batches formed from all their requests; per-worker, a "
        "copy of every model in each worker; auto: shared on a GPU, per-worker on the CPU")
    engine_poll_us: int = Field(2000, ge=0, le=1_000_000, description="with the shared "
                                "engine on a GPU, how long a front end's event loop polls, "
                                "rather than sleeps, for the engine's replies after it sends "
                                "a request (microseconds): a reply that comes meanwhile "
                                "wakes no sleeping process, at the cost of the front end's "
                                "core while it waits; 0: it sleeps at once (as it does "
                                "where the models run on the CPU, whose cores it would take)")
    cache_dir: Path = Field(Path.home() / ".cache" / "distilserve",
                            description="where the embedded default repository is built")
    api_key: SecretStr | None = Field(None, description="require Authorization: Bearer KEY "
                                      "on every request but a GET of /health, /ready, "
                                      "/ping, / or /v2/health/live and /v2/health/ready "
                                      "(whitespace around it is not part of it; set but "
                                      "empty: an error)")
    require_all_models: bool = Field(False, description="/ready stays 503 while any model "
                                     "folder failed to load (default: 200, failures listed)")
    poll_seconds: float = Field(0.0, ge=0, description="look at the model repository this "
                                "often: load folders added or exported again, unload those "
                                "removed, without a restart (Triton's poll mode); 0: never, "
                                "else at least 0.1")
    model_control: Literal["none", "explicit"] = Field(
        "none", description="explicit: models loaded and unloaded by request too (Triton's "
        "model control mode: POST /v2/repository/models/NAME/load and /unload, gRPC's "
        "RepositoryModelLoad and RepositoryModelUnload); one worker or engine shared, no "
        "polling")
    cors_allow_origins: str = Field("", description="origins whose web pages may call the "
                                    "service from a browser (CORS), comma-separated, or * "
                                    "for any; none by default")
    model_aliases: str = Field("", description="names models answer to besides their "
                               "folders', as alias=folder, comma-separated (e.g. "
                               "text-embedding-3-small=all-minilm-l6-v2)")
    token_ids: Literal["model", "cl100k_base", "o200k_base"] = Field(
        "model", description="the vocabulary of token-id inputs to /v1/embeddings: the "
        "model's own, or OpenAI's (cl100k_base, o200k_base: read back into text and embedded "
        "as it, for clients that tokenise with tiktoken, as LangChain's OpenAIEmbeddings "
        "does by default); a model's manifest may name its own")

    # connections
    header_timeout: float = Field(10.0, gt=0, description="seconds a client has to send a "
                                  "request's headers once it connects or starts a request; "
                                  "then the connection is closed")
    keep_alive_timeout: float = Field(5.0, gt=0, description="seconds an idle keep-alive "
                                      "connection is kept open")
    body_timeout: float = Field(30.0, gt=0, description="seconds a client has to send a "
                                "request's body once its headers are in; then 408 and the "
                                "connection is closed")
    max_connections: int = Field(2048, ge=1, description="open connections (per worker); "
                                 "one more is answered 503 with Retry-After when accepted, "
                                 "and closed")
    max_client_connections: int = Field(1024, ge=0, description="open connections from one "
                                        "client address (per worker), as max_connections; "
                                        "0: no cap (behind a proxy all connections come from)")

    # request limits
    max_inputs: int = Field(2048, ge=1, description="inputs (rerank: documents) per request "
                            "(OpenAI's own limit; LangChain's OpenAIEmbeddings sends 1000)")
    max_input_chars: int = Field(20_000, ge=1, description="characters per input")
    max_body_bytes: int = Field(4_000_000, ge=1024, description="request body size")
    compress_min_bytes: int = Field(0, ge=0, description="answers of at least this many "
                                    "bytes are sent gzip-compressed (level 1) to a client "
                                    "whose Accept-Encoding takes gzip; 0: none (worth it for "
                                    "clients on slow links)")

    # batching, per model (unset: the CPU or GPU value, by where the model runs)
    max_batch_size: int | None = Field(None, ge=1, description="inputs per forward pass "
                                       "(default 32 on the CPU, 64 there in bf16, 256 on a "
                                       "GPU)")
    max_batch_tokens: int | None = Field(None, ge=1, description="padded tokens per forward "
                                         "pass (default 512 per intra-op thread on the CPU, "
                                         "65536 on a GPU)")
    max_wait_ms: float = Field(0.0, ge=0, le=60_000, description="how long a batch may wait "
                               "for more inputs while the model is idle (at most a minute)")
    max_queue: int = Field(4096, ge=1, description="queued inputs per model before 429 (a "
                           "request of more: 413)")

    # runtime (a model's manifest may name its own device and dtype)
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto: a GPU when one is "
                        "visible (an ONNX model without onnxruntime-gpu: its checkpoint)")
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", description="compute dtype; auto: fp16 or bf16 on a GPU, bf16 on a CPU with "
        "bf16 matrix units (AMX, AVX-512 BF16, Arm BF16; an ONNX model then runs from its "
        "checkpoint, traced with TorchScript), fp32 otherwise, as the model allows")
    threads: int = Field(0, ge=0, le=1024, description="intra-op threads per model (0: "
                         "this process's share of the cores, all of them over the workers)")
    cuda_graph_tokens: int = Field(4096, ge=0, description="on a GPU, batches of up to this "
                                   "many padded tokens run from CUDA graphs (torch and "
                                   "TorchScript backends); 0: none")
    warmup: bool = Field(True, description="run each model before /ready turns 200 (on a "
                         "GPU, every batch shape and its CUDA graph)")
    gc_threshold: int = Field(50_000, ge=1, description="container objects allocated (net) "
                              "between two of Python's collections of its youngest "
                              "generation while serving (Python's default, 700, "
                              "collects hundreds of times a second under load and finds "
                              "no garbage: a request's objects die by reference counting)")
    switch_interval_ms: float = Field(0.5, gt=0, le=100, description="how long a thread "
                                      "may hold Python's lock while another waits for it, "
                                      "while serving (Python's default, 5 ms, keeps the "
                                      "model's thread, back from a forward pass or from "
                                      "tokenising, waiting on the event loop)")
    access_log: bool = Field(False, description="log every request (uvicorn's access log; "
                             "costs throughput under load)")
    otlp_endpoint: str | None = Field(None, description="send OpenTelemetry traces (a span "
                                      "per request) to this OTLP/HTTP collector, e.g. "
                                      "http://otel-collector:4318 (TEI's --otlp-endpoint); "
                                      "none: no traces")
    otlp_service_name: str = Field("distilserve", description="the service's name in its "
                                   "traces")
    log_format: Literal["text", "json"] = Field(
        "text", description="text, or json: one JSON object a line (time, level, logger, "
        "message; an access line's client, method, path, status) for log collectors")

    @field_validator("port", "grpc_port", mode="before")
    @classmethod
    def _a_port(cls, value):
        """A port number, not what Kubernetes sets in every pod of a namespace for a Service
        named distilserve (or distilserve-grpc): DISTILSERVE_PORT=tcp://ADDRESS:PORT."""
        if isinstance(value, str) and SERVICE_LINK_VALUE.match(value):
            raise ValueError(f"{value!r} is the address Kubernetes gives a Service's pods, not "
                             "a port: set the port, or enableServiceLinks: false in the pod's "
                             "spec")
        return value

    @field_validator("poll_seconds")
    @classmethod
    def _a_poll(cls, value: float) -> float:
        """0 or at least 0.1 s: polling more often keeps a core busy."""
        if 0 < value < 0.1:
            raise ValueError(f"{value} s: 0 (never) or at least 0.1")
        return value

    @field_validator("api_key")
    @classmethod
    def _a_key(cls, value: SecretStr | None) -> SecretStr | None:
        """A key from a file (a Kubernetes secret's, say) often ends in a newline, which no
        Authorization header can hold: it is cut. One set but empty (a secret that was not
        filled in) is refused rather than serving without a key."""
        if value is None:
            return None
        key = value.get_secret_value().strip()
        if not key:
            raise ValueError("set but empty: unset DISTILSERVE_API_KEY to serve without a key")
        return SecretStr(key)

    @field_validator("otlp_endpoint")
    @classmethod
    def _a_collector(cls, value: str | None) -> str | None:
        """The collector's http:// or https:// URL (its spans go to URL/v1/traces)."""
        from urllib.parse import urlsplit

        if value is not None:
            url = urlsplit(value)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(f"{value!r} is not an http:// or https:// URL (e.g. "
                                 "http://otel-collector:4318)")
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        from distilserve.models.runtime.base import BackendError, check_device

        try:
            return check_device(value)
        except BackendError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _two_ports(self):
        """gRPC on a port of its own: on the HTTP port, both binds went through (neither
        listened yet) and the service started, its models loaded, but answered no HTTP
        request, and nothing said why."""
        if self.grpc_port == self.port:
            raise ValueError(f"grpc_port {self.grpc_port} is the HTTP port too: gRPC needs a "
                             "port of its own (Triton's is 8001)")
        return self

    @model_validator(mode="after")
    def _one_controller(self):
        """Models loaded by request are one process's: not with several workers of their
        own (each would load its own; the shared engine process loads them for all), nor
        with polling (which serves the repository as it is)."""
        if self.model_control == "explicit" and (
                self.workers > 1 and self.engine != "shared" or self.poll_seconds):
            raise ValueError("model_control explicit loads a model in one process, as "
                             "asked: not with workers > 1 (but with engine shared, whose "
                             "process loads them) or poll_seconds")
        return self

    def bearer_key(self) -> str | None:
        """The key every request must bear (``Authorization: Bearer KEY``); None: none."""
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def aliases(self) -> dict[str, str]:
        """DISTILSERVE_MODEL_ALIASES: alias -> folder."""
        return dict(_alias_pairs(self.model_aliases))

    @field_validator("model_aliases")
    @classmethod
    def _aliases(cls, value: str) -> str:
        _alias_pairs(value)
        return value

    def cors_origins(self) -> list[str]:
        return [o.strip() for o in self.cors_allow_origins.split(",") if o.strip()]

    def tune_interpreter(self) -> Callable[[], None]:
        """Python's collector and thread switching set for serving (gc_threshold,
        switch_interval_ms); returns what puts Python's own back."""
        thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
        gc.set_threshold(self.gc_threshold, *thresholds[1:])
        sys.setswitchinterval(self.switch_interval_ms / 1000)

        def put_back() -> None:
            gc.set_threshold(*thresholds)
            sys.setswitchinterval(switch)

        return put_back

    def model_threads(self) -> int:
        """Intra-op threads per model: DISTILSERVE_THREADS, else the cores this process may
        use (a container's CPU limit too: distilserve/models/runtime/cores.py) shared out
        among the worker processes: workers that each take every core slow one another
        (all of them to a shared engine process, the one running models)."""
        shares = 1 if self.engine == "shared" else self.workers
        return self.threads or max(1, available_cores() // shares)

    def batch_limits(self, device: str, dtype: str = "fp32") -> tuple[int, int]:
        """(inputs, padded tokens) per forward pass for a model on ``device`` in ``dtype``.
        On the CPU a batch does the most tokens a second at some 512 padded tokens per
        thread, at any width, and fewer past it (its activations leave the caches); in
        bf16, on the CPU's matrix units, a batch of short inputs reaches that at 64 inputs
        where fp32 gains nothing past 32."""
        gpu = not device.startswith("cpu")
        return (self.max_batch_size or (256 if gpu else 64 if dtype == "bf16" else 32),
                self.max_batch_tokens or (65_536 if gpu else 512 * self.model_threads()))


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each DISTILSERVE_* variable of ``environ`` that names no setting (a typo,
    which would be ignored unsaid), with the setting it is closest to; Kubernetes' links
    to Services (SERVICE_LINK) left out."""
    names = [name.upper() for name in Settings.model_fields]
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        name = upper.removeprefix(PREFIX)
        link = SERVICE_LINK.fullmatch(upper) or SERVICE_LINK_VALUE.match(environ[variable])
        if upper.startswith(PREFIX) and name not in names and not link:
            close = difflib.get_close_matches(name, names, n=1)
            lines.append(f"{variable} is not a setting: ignored"
                         + (f" (did you mean {PREFIX}{close[0]}?)" if close else ""))
    return lines
