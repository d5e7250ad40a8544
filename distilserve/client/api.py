"""The clients. Both share request building, error mapping and the retry policy; only
the transport (httpx.Client or httpx.AsyncClient) differs."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx


class DistilServeError(Exception):
    """An error answer: ``status``, ``type`` and ``message`` from the body, and the
    ``request_id`` the server logged it under (its X-Request-Id)."""

    def __init__(self, status: int | None, type: str, message: str,
                 request_id: str | None = None):
        super().__init__(("" if status is None else f"{status} ") + f"{type}: {message}"
                         + (f" (request {request_id})" if request_id else ""))
        self.status, self.type, self.message = status, type, message
        self.request_id = request_id


class BadRequest(DistilServeError):
    """400 or 422: the request itself is wrong."""


class Unauthorized(DistilServeError):
    """401: missing or wrong API key."""


class NotFound(DistilServeError):
    """404: unknown model or route."""


class PayloadTooLarge(DistilServeError):
    """413: too many inputs, or too long."""


class Overloaded(DistilServeError):
    """429: the model's queue is full (retried before it is raised)."""


class Unavailable(DistilServeError):
    """503: loading or shutting down (retried before it is raised)."""


class ConnectionFailed(DistilServeError):
    """No answer came: the connection failed (past ``max_retries``, where it is retried)
    or timed out. ``status`` is None; the httpx error is its ``__cause__``."""


class TimedOut(ConnectionFailed):
    """No answer within the client's ``timeout`` (not retried: the server may still be at
    it)."""


_ERRORS = {400: BadRequest, 401: Unauthorized, 404: NotFound, 413: PayloadTooLarge,
           422: BadRequest, 429: Overloaded, 503: Unavailable}
RETRY_STATUSES = (429, 503)
# a connection that failed, not the request: the server restarting or gone from behind a
# load balancer, or a kept-alive connection it closed as the request went out (uvicorn and
# httpx both keep an idle one 5 s). Retried with backoff, since every call may be repeated
# (a model's answer changes nothing); a timeout is not: the server may still be at it.
RETRY_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)


def _failed(error: httpx.TransportError) -> ConnectionFailed:
    """The client's error for httpx's ``error``: no answer came."""
    if isinstance(error, httpx.TimeoutException):
        return TimedOut(None, "timeout", f"no answer in time ({type(error).__name__}: "
                        f"{error})")
    return ConnectionFailed(None, "connection_error", f"{type(error).__name__}: {error}")


def _deep(body: dict, iterations: int | None) -> dict:
    """``body`` with a recursive model's depth for the request (``iterations``), if given."""
    return body if iterations is None else {**body, "iterations": iterations}


def _raise_for(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    try:
        err = response.json()["error"]
        kind, message = err["type"], err["message"]
    except (ValueError, KeyError, TypeError):
        kind, message = "http_error", response.text
    raise _ERRORS.get(response.status_code, DistilServeError)(
        response.status_code, kind, message, response.headers.get("x-request-id"))


def _delay(response: httpx.Response | None, attempt: int, backoff: float) -> float:
    """Retry-After when the answer has one (capped), else exponential backoff."""
    header = response.headers.get("retry-after", "") if response is not None else ""
    wait = retry_after(header)
    return min(backoff * 2 ** attempt if wait is None else wait, 30.0)


def retry_after(header: str, now: datetime | None = None) -> float | None:
    """The seconds a Retry-After header asks to wait, given in seconds (as distilserve
    gives it) or as an HTTP date (as a proxy in front of it may); none for one that is
    neither, 0 for a date gone by."""
    header = header.strip()
    if header.replace(".", "", 1).isdigit():
        return float(header)
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # (-0000: no zone said; HTTP dates are in GMT)
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class _Base:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.2):
        self.base_url = base_url.rstrip("/")
        # a key read from a file ends in a newline, which no header may hold (the server
        # cuts whitespace around its key too)
        self.headers = {"Authorization": f"Bearer {api_key.strip()}"} if api_key else {}
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff

    # truncate: cut an input longer than the model's max_length (false: 413); direction:
    # where, "right" (its end) or "left" (its start)
    @staticmethod
    def _embed_body(inputs, model, normalize, truncate, direction, dimensions, prompt_name):
        return {"inputs": inputs, "model": model, "normalize": normalize, "truncate": truncate,
                "truncation_direction": direction, "dimensions": dimensions,
                "prompt_name": prompt_name}

    @staticmethod
    def _inputs_body(inputs, model, truncate, direction, prompt_name):
        return {"inputs": inputs, "model": model, "truncate": truncate,
                "truncation_direction": direction, "prompt_name": prompt_name}

    @staticmethod
    def _rerank_body(query, documents, model, top_n, return_documents, truncate, direction,
                     raw_scores, max_tokens_per_doc):
        """/v1/rerank's body; ``max_tokens_per_doc``: each document first cut to so many
        tokens."""
        return {"query": query, "documents": documents, "model": model, "top_n": top_n,
                "return_documents": return_documents, "truncate": truncate,
                "truncation_direction": direction, "raw_scores": raw_scores,
                "max_tokens_per_doc": max_tokens_per_doc}

    @staticmethod
    def _tokenize_body(inputs, model, add_special_tokens, prompt_name):
        return {"inputs": inputs, "model": model, "add_special_tokens": add_special_tokens,
                "prompt_name": prompt_name}

    @staticmethod
    def _decode_body(ids, model, skip_special_tokens):
        return {"ids": ids, "model": model, "skip_special_tokens": skip_special_tokens}

    @staticmethod
    def _classify_body(inputs, model, top_k, truncate, direction, raw_scores,
                       candidate_labels=None, hypothesis_template=None, multi_label=False,
                       function_to_apply=None):
        """/v1/classify's body; with ``candidate_labels``, zero-shot (an NLI model)."""
        body = {"inputs": inputs, "model": model, "top_k": top_k, "truncate": truncate,
                "truncation_direction": direction, "raw_scores": raw_scores}
        if function_to_apply is not None:  # else as the model's labels say
            body["function_to_apply"] = function_to_apply
        if candidate_labels is not None:
            body.update(candidate_labels=candidate_labels, multi_label=multi_label)
            if hypothesis_template is not None:  # else the service's
                body["hypothesis_template"] = hypothesis_template
        return body

    @staticmethod
    def _qa_body(inputs, model, top_k, max_answer_len, handle_impossible_answer,
                 align_to_words, max_seq_len, doc_stride):
        return {"inputs": inputs, "model": model, "top_k": top_k,
                "max_answer_len": max_answer_len,
                "handle_impossible_answer": handle_impossible_answer,
                "align_to_words": align_to_words, "max_seq_len": max_seq_len,
                "doc_stride": doc_stride}

    @staticmethod
    def _fill_mask_body(inputs, model, top_k, targets, truncate, direction):
        return {"inputs": inputs, "model": model, "top_k": top_k, "targets": targets,
                "truncate": truncate, "truncation_direction": direction}

    @staticmethod
    def _ner_body(inputs, model, aggregation_strategy, truncate, direction, stride,
                  ignore_labels):
        """/v1/ner's body; ``stride``: a long text read whole, in overlapping windows."""
        body = {"inputs": inputs, "model": model, "truncate": truncate,
                "truncation_direction": direction, "aggregation_strategy": aggregation_strategy,
                "stride": stride}
        if ignore_labels is not None:  # else the service's (O)
            body["ignore_labels"] = ignore_labels
        return body


class DistilServeClient(_Base):
    """Blocking client. ``embed``/``classify``/``ner`` return the lists of the response
    (``embeddings`` or ``results``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers,
                                 timeout=self.timeout)

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        for attempt in range(self.max_retries + 1):
            try:
                response = self.http.request(method, path, json=body)
            except RETRY_ERRORS as e:
                if attempt == self.max_retries:
                    raise _failed(e) from e
                time.sleep(_delay(None, attempt, self.backoff))
                continue
            except httpx.TransportError as e:
                raise _failed(e) from e
            if response.status_code not in RETRY_STATUSES or attempt == self.max_retries:
                return _raise_for(response)
            time.sleep(_delay(response, attempt, self.backoff))

    def embed(self, inputs, model=None, normalize=True, truncate=True, dimensions=None,
              prompt_name=None, truncation_direction="right", *,
              iterations=None) -> list[list[float]]:
        body = self._embed_body(inputs, model, normalize, truncate, truncation_direction,
                                dimensions, prompt_name)
        return self._call("POST", "/v1/embed", _deep(body, iterations))["embeddings"]

    def embed_all(self, inputs, model=None, truncate=True, prompt_name=None,
                  truncation_direction="right") -> list[list[list[float]]]:
        """Per input, every token's vector (a model exported with --token-embeddings)."""
        body = self._inputs_body(inputs, model, truncate, truncation_direction, prompt_name)
        return self._call("POST", "/embed_all", body)

    def embed_sparse(self, inputs, model=None, truncate=True, prompt_name=None,
                     truncation_direction="right") -> list[list[dict]]:
        """Per input, a SPLADE model's non-zero weights: {index, value}."""
        body = self._inputs_body(inputs, model, truncate, truncation_direction, prompt_name)
        return self._call("POST", "/embed_sparse", body)

    def rerank(self, query, documents, model=None, top_n=None, return_documents=False,
               truncate=True, truncation_direction="right", raw_scores=False, *,
               max_tokens_per_doc=None, iterations=None) -> list[dict]:
        """``results``: {index, relevance_score[, document]}, most relevant first."""
        body = self._rerank_body(query, documents, model, top_n, return_documents, truncate,
                                 truncation_direction, raw_scores, max_tokens_per_doc)
        return self._call("POST", "/v1/rerank", _deep(body, iterations))["results"]

    def tokenize(self, inputs, model=None, add_special_tokens=True,
                 prompt_name=None) -> list[list[dict]]:
        """Per input its tokens: {id, text, start, stop, special} (behind the model's
        prompt ``prompt_name``, if named)."""
        return self._call("POST", "/v1/tokenize",
                          self._tokenize_body(inputs, model, add_special_tokens, prompt_name))

    def decode(self, ids, model=None, skip_special_tokens=True) -> list[str]:
        """The text of each list of token ids ([int] for one)."""
        return self._call("POST", "/v1/decode",
                          self._decode_body(ids, model, skip_special_tokens))

    def classify(self, inputs, model=None, top_k=None, truncate=True,
                 truncation_direction="right", raw_scores=False, *, candidate_labels=None,
                 hypothesis_template=None, multi_label=False,
                 function_to_apply=None, iterations=None) -> list[list[dict]]:
        """Each input's labels and scores, best first (``function_to_apply``: softmax,
        sigmoid or none, as transformers' pipeline's); with ``candidate_labels``, those
        labels scored zero-shot by an NLI model."""
        body = self._classify_body(inputs, model, top_k, truncate, truncation_direction,
                                   raw_scores, candidate_labels, hypothesis_template,
                                   multi_label, function_to_apply)
        return self._call("POST", "/v1/classify", _deep(body, iterations))["results"]

    def ner(self, inputs, model=None, aggregation_strategy="simple", truncate=True,
            truncation_direction="right", stride=None, ignore_labels=None, *,
            iterations=None):
        body = self._ner_body(inputs, model, aggregation_strategy, truncate,
                              truncation_direction, stride, ignore_labels)
        return self._call("POST", "/v1/ner", _deep(body, iterations))["results"]

    def qa(self, inputs, model=None, top_k=1, max_answer_len=15,
           handle_impossible_answer=False, align_to_words=True, max_seq_len=None,
           doc_stride=None, *, iterations=None) -> list[list[dict]]:
        """Each {"question", "context"}'s answers, best first: {score, start, end, answer}."""
        body = self._qa_body(inputs, model, top_k, max_answer_len, handle_impossible_answer,
                             align_to_words, max_seq_len, doc_stride)
        return self._call("POST", "/v1/qa", _deep(body, iterations))["results"]

    def fill_mask(self, inputs, model=None, top_k=5, targets=None, truncate=True,
                  truncation_direction="right", *,
                  iterations=None) -> list[list[list[dict]]]:
        """Per input, per mask token, its likeliest tokens: {score, token, token_str,
        sequence}."""
        body = self._fill_mask_body(inputs, model, top_k, targets, truncate,
                                    truncation_direction)
        return self._call("POST", "/v1/fill-mask", _deep(body, iterations))["results"]

    def models(self) -> list[dict]:
        return self._call("GET", "/v1/models")["data"]

    def health(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncDistilServeClient(_Base):
    """The same methods as DistilServeClient, awaitable."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                      timeout=self.timeout)

    async def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        for attempt in range(self.max_retries + 1):
            try:
                response = await self.http.request(method, path, json=body)
            except RETRY_ERRORS as e:
                if attempt == self.max_retries:
                    raise _failed(e) from e
                await asyncio.sleep(_delay(None, attempt, self.backoff))
                continue
            except httpx.TransportError as e:
                raise _failed(e) from e
            if response.status_code not in RETRY_STATUSES or attempt == self.max_retries:
                return _raise_for(response)
            await asyncio.sleep(_delay(response, attempt, self.backoff))

    async def embed(self, inputs, model=None, normalize=True, truncate=True, dimensions=None,
                    prompt_name=None, truncation_direction="right", *, iterations=None):
        body = self._embed_body(inputs, model, normalize, truncate, truncation_direction,
                                dimensions, prompt_name)
        return (await self._call("POST", "/v1/embed", _deep(body, iterations)))["embeddings"]

    async def embed_all(self, inputs, model=None, truncate=True, prompt_name=None,
                        truncation_direction="right"):
        body = self._inputs_body(inputs, model, truncate, truncation_direction, prompt_name)
        return await self._call("POST", "/embed_all", body)

    async def embed_sparse(self, inputs, model=None, truncate=True, prompt_name=None,
                           truncation_direction="right"):
        body = self._inputs_body(inputs, model, truncate, truncation_direction, prompt_name)
        return await self._call("POST", "/embed_sparse", body)

    async def rerank(self, query, documents, model=None, top_n=None, return_documents=False,
                     truncate=True, truncation_direction="right", raw_scores=False, *,
                     max_tokens_per_doc=None, iterations=None):
        body = self._rerank_body(query, documents, model, top_n, return_documents, truncate,
                                 truncation_direction, raw_scores, max_tokens_per_doc)
        return (await self._call("POST", "/v1/rerank", _deep(body, iterations)))["results"]

    async def tokenize(self, inputs, model=None, add_special_tokens=True, prompt_name=None):
        return await self._call("POST", "/v1/tokenize", self._tokenize_body(
            inputs, model, add_special_tokens, prompt_name))

    async def decode(self, ids, model=None, skip_special_tokens=True):
        return await self._call("POST", "/v1/decode",
                                self._decode_body(ids, model, skip_special_tokens))

    async def classify(self, inputs, model=None, top_k=None, truncate=True,
                       truncation_direction="right", raw_scores=False, *,
                       candidate_labels=None, hypothesis_template=None, multi_label=False,
                       function_to_apply=None, iterations=None):
        body = self._classify_body(inputs, model, top_k, truncate, truncation_direction,
                                   raw_scores, candidate_labels, hypothesis_template,
                                   multi_label, function_to_apply)
        return (await self._call("POST", "/v1/classify", _deep(body, iterations)))["results"]

    async def ner(self, inputs, model=None, aggregation_strategy="simple", truncate=True,
                  truncation_direction="right", stride=None, ignore_labels=None, *,
                  iterations=None):
        body = self._ner_body(inputs, model, aggregation_strategy, truncate,
                              truncation_direction, stride, ignore_labels)
        return (await self._call("POST", "/v1/ner", _deep(body, iterations)))["results"]

    async def qa(self, inputs, model=None, top_k=1, max_answer_len=15,
                 handle_impossible_answer=False, align_to_words=True, max_seq_len=None,
                 doc_stride=None, *, iterations=None):
        body = self._qa_body(inputs, model, top_k, max_answer_len, handle_impossible_answer,
                             align_to_words, max_seq_len, doc_stride)
        return (await self._call("POST", "/v1/qa", _deep(body, iterations)))["results"]

    async def fill_mask(self, inputs, model=None, top_k=5, targets=None, truncate=True,
                        truncation_direction="right", *, iterations=None):
        body = self._fill_mask_body(inputs, model, top_k, targets, truncate,
                                    truncation_direction)
        return (await self._call("POST", "/v1/fill-mask", _deep(body, iterations)))["results"]

    async def models(self) -> list[dict]:
        return (await self._call("GET", "/v1/models"))["data"]

    async def health(self) -> bool:
        try:
            return (await self.http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
