"""The clients against a real server on 127.0.0.1, and their retry policy against a
mock transport."""

import asyncio
import email.utils
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import pytest

from distilserve.client import (
    AsyncDistilServeClient,
    BadRequest,
    ConnectionFailed,
    DistilServeClient,
    DistilServeError,
    NotFound,
    Overloaded,
    TimedOut,
    Unauthorized,
)
from distilserve.client.api import retry_after
from distilserve.models.io import checkpoint
from tests import web
from tests.conftest import running_server


@pytest.fixture(scope="module")
def url(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("client-repo")
    for task in ("embed", "classify", "ner"):
        exports(tiny_checkpoints["cmow", task], repo / f"cmow-{task}", "onnx", check=False)
    with running_server(repo, api_key="k") as url:
        yield url


def test_sync_client_mirrors_the_routes(url):
    with DistilServeClient(url, api_key="k") as c:
        assert c.health()
        assert {m["id"] for m in c.models()} == {"cmow-embed", "cmow-classify", "cmow-ner"}
        assert len(c.embed(["a", "b"])) == 2
        assert len(c.classify("text", top_k=1)[0]) == 1
        assert isinstance(c.ner("Angela in Paris", aggregation_strategy="none")[0], list)
        with pytest.raises(NotFound) as e:
            c.embed("x", model="missing")
        assert e.value.status == 404 and "missing" in e.value.message
        assert len(e.value.request_id) == 32 and e.value.request_id in str(e.value)
        with pytest.raises(BadRequest):
            c.embed([])
        short = c.embed(["a", "b"], dimensions=8)
        assert len(short[0]) == 8 and abs(sum(x * x for x in short[0]) - 1) < 1e-5
        ranked = c.rerank("query", ["one", "two", "three"], top_n=2, return_documents=True)
        assert len(ranked) == 2 and ranked[0]["relevance_score"] >= ranked[1]["relevance_score"]
        assert ranked[0]["document"]["text"] in ("one", "two", "three")
        documents = ["alpha beta gamma delta", "alpha beta"]
        cut = c.rerank("query", documents, max_tokens_per_doc=2, return_documents=True)
        assert cut[0]["relevance_score"] == pytest.approx(cut[1]["relevance_score"], abs=1e-6)
        assert {r["document"]["text"] for r in cut} == set(documents)  # as sent
        tokens = c.tokenize("Hello world", model="cmow-embed")
        # the input's own text, as TEI gives it (the tokenizer lower-cases: "hello")
        assert [t["text"] for t in tokens[0]] == ["[CLS]", "Hello", "world", "[SEP]"]
        assert (tokens[0][2]["start"], tokens[0][2]["stop"]) == (6, 11)
        ids = [t["id"] for t in tokens[0]]
        assert c.decode(ids, model="cmow-embed") == ["hello world"]
        assert c.decode([ids], model="cmow-embed", skip_special_tokens=False) == [
            "[CLS] hello world [SEP]"]
        with pytest.raises(BadRequest, match="more than the width of model 'cmow-embed'"):
            c.embed("x", dimensions=100_000)
        with pytest.raises(BadRequest, match="prompt_name 'query': model 'cmow-embed' has no"):
            c.embed("x", prompt_name="query")  # sent: this model has none
        with pytest.raises(BadRequest, match="prompt_name 'query': model 'cmow-embed' has no"):
            c.tokenize("x", model="cmow-embed", prompt_name="query")
        long = "word " * 600 + "the end"  # over max_length: which end is cut matters
        assert c.embed(long, truncation_direction="left") != c.embed(long)
        assert len(c.classify(long, truncation_direction="left")[0]) == 2
        probabilities, logits = (c.classify("text", raw_scores=raw)[0] for raw in (False, True))
        assert [r["label"] for r in logits] == [r["label"] for r in probabilities]
        assert abs(sum(r["score"] for r in probabilities) - 1) < 1e-5
        assert probabilities != logits
        assert c.classify("text", function_to_apply="none")[0] == logits
        independent = c.classify("text", function_to_apply="sigmoid")[0]
        assert [r["label"] for r in independent] == [r["label"] for r in logits]
        assert abs(sum(r["score"] for r in independent) - 1) > 1e-5
        assert isinstance(c.ner(long, truncation_direction="left")[0], list)
        whole = c.ner(long, stride=8, ignore_labels=[])[0]  # read whole, O's groups too
        assert whole[-1]["end"] == len(long) > c.ner(long, ignore_labels=[])[0][-1]["end"]
        assert len(c.rerank("q", [long], truncate=True, truncation_direction="left")) == 1
        with pytest.raises(BadRequest, match="truncation_direction"):
            c.embed("x", truncation_direction="middle")
    with DistilServeClient(url) as anonymous, pytest.raises(Unauthorized):
        anonymous.models()


def test_a_key_read_from_a_file_works_as_it_is(url):
    """(its newline: before, httpx refused the header, LocalProtocolError)"""
    with DistilServeClient(url, api_key="k\n") as c:
        assert len(c.models()) == 3


def test_async_client_mirrors_the_routes(url):
    async def go():
        async with AsyncDistilServeClient(url, api_key="k") as c:
            assert await c.health()
            vectors, results, ranked, tokens = await asyncio.gather(
                c.embed("a", dimensions=4), c.classify([["a", "b"]], function_to_apply="none"),
                c.rerank("q", ["d1", "d2"]), c.tokenize(["x", "y z"], model="cmow-ner"))
            assert len(vectors) == 1 and len(vectors[0]) == 4 and len(results[0]) == 2
            assert sorted(r["index"] for r in ranked) == [0, 1]
            assert [len(t) for t in tokens] == [3, 4]
            ids = [[t["id"] for t in input_tokens] for input_tokens in tokens]
            assert await c.decode(ids, model="cmow-ner") == ["x", "y z"]
            return await c.models()

    assert len(asyncio.run(go())) == 3


def test_both_clients_classify_zero_shot(exports, tmp_path):
    nli = checkpoint.save(checkpoint.new("bert", "tiny", "classify",
                                         ["entailment", "neutral", "contradiction"]),
                          tmp_path / "nli-checkpoint")
    exports(nli, tmp_path / "repo" / "nli", "onnx", check=False)
    labels = ["pets", "towns", "food"]
    with running_server(tmp_path / "repo") as url:
        expected = web.post(url + "/v1/classify", json={
            "inputs": ["A dog.", "A cake."], "candidate_labels": labels, "multi_label": True,
            "hypothesis_template": "About {}."}).json()["results"]
        with DistilServeClient(url) as c:
            assert c.classify(["A dog.", "A cake."], candidate_labels=labels, multi_label=True,
                              hypothesis_template="About {}.") == expected
            best = c.classify("A dog.", candidate_labels=labels, top_k=1)[0]
            assert len(best) == 1 and best[0]["label"] in labels

        async def go():
            async with AsyncDistilServeClient(url) as c:
                return await c.classify(["A dog.", "A cake."], candidate_labels=labels,
                                        multi_label=True, hypothesis_template="About {}.")

        assert asyncio.run(go()) == expected


def test_both_clients_answer_questions(exports, tmp_path):
    squad = checkpoint.save(checkpoint.new("distilbert", "tiny", "qa"), tmp_path / "squad")
    exports(squad, tmp_path / "repo" / "squad", "onnx", check=False)
    asked = [{"question": "Where?", "context": "It is in Paris."},
             {"question": "Who?", "context": "Ada wrote it."}]
    with running_server(tmp_path / "repo") as url:
        expected = web.post(url + "/v1/qa", json={"inputs": asked, "top_k": 2}).json()[
            "results"]
        with DistilServeClient(url) as c:
            assert c.qa(asked, top_k=2) == expected
            (one,) = c.qa(asked[0], handle_impossible_answer=True, top_k=50)
            assert "" in [a["answer"] for a in one]  # the empty answer, among all
            windowed = {"inputs": asked, "max_seq_len": 12, "doc_stride": 2}
            assert c.qa(asked, max_seq_len=12, doc_stride=2) == web.post(
                url + "/v1/qa", json=windowed).json()["results"]

        async def go():
            async with AsyncDistilServeClient(url) as c:
                return await c.qa(asked, top_k=2)

        assert asyncio.run(go()) == expected


def test_both_clients_give_token_and_sparse_embeddings(exports, tiny_checkpoints, splade_checkpoint,
                                                       tmp_path):
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "tokens", "onnx",
            token_embeddings=True, check=False)
    exports(splade_checkpoint, tmp_path / "splade", "onnx", check=False)
    with running_server(tmp_path) as both, DistilServeClient(both) as c:
        vectors = c.embed_all(["Hello world", "a"])
        assert [len(v) for v in vectors] == [4, 3] and len(vectors[0][0]) == 32
        one = c.embed_all("Hello world", truncation_direction="left")  # a batch of its own
        assert np.allclose(one, vectors[:1], atol=1e-5)
        weights = c.embed_sparse("Hello world")
        dense = np.array(c.embed("Hello world", model="splade", normalize=False)[0])
        indices = [w["index"] for w in weights[0]]
        assert indices == np.flatnonzero(dense).tolist()
        assert np.allclose([w["value"] for w in weights[0]], dense[indices])
        with pytest.raises(BadRequest, match="is not a SPLADE model"):
            c.embed_sparse("x", model="tokens")

        async def go():
            async with AsyncDistilServeClient(both) as a:
                return await asyncio.gather(a.embed_all("Hello world"),
                                            a.embed_sparse("Hello world"))

        tokens, sparse = asyncio.run(go())
        assert np.allclose(tokens, one) and [w["index"] for w in sparse[0]] == indices


def _client_answering(answers: list, kind=DistilServeClient) -> tuple:
    """A client whose server answers the given statuses in turn (then 200), or whose
    connection fails with an answer that is an httpx error."""
    calls, answers = [], iter(answers)

    def handler(request):
        calls.append(request)
        status = next(answers, 200)
        if isinstance(status, Exception):
            raise status
        body = ({"embeddings": [[1.0]]} if status == 200 else
                {"error": {"type": "overloaded", "message": "busy"}})
        return httpx.Response(status, json=body, headers={"Retry-After": "0"})

    client = kind("http://test", max_retries=2, backoff=0)
    http = httpx.Client if kind is DistilServeClient else httpx.AsyncClient
    client.http = http(base_url="http://test", transport=httpx.MockTransport(handler))
    return client, calls


def test_retries_on_429_and_503_then_succeeds():
    client, calls = _client_answering([503, 429])
    assert client.embed("x") == [[1.0]]
    assert len(calls) == 3


def test_gives_up_after_max_retries_with_a_typed_error():
    client, calls = _client_answering([429, 429, 429, 429])
    with pytest.raises(Overloaded) as e:
        client.embed("x")
    assert len(calls) == 3 and e.value.status == 429 and e.value.message == "busy"


def test_retry_after_in_seconds_or_as_an_http_date():
    now = datetime(2026, 12, 2, 7, 28, 0, tzinfo=UTC)
    assert retry_after("2", now) == 2.0 and retry_after(" 0.5 ", now) == 0.5
    assert retry_after("Wed, 02 Dec 2026 07:28:05 GMT", now) == 5.0
    assert retry_after("Wed, 02 Dec 2026 07:27:00 GMT", now) == 0.0  # gone by
    assert retry_after("", now) is None and retry_after("soon", now) is None
    assert retry_after("-1", now) is None


def test_a_retry_waits_as_the_answers_retry_after_says_capped_else_backs_off(monkeypatch):
    """A proxy's 503 with an HTTP date is waited for (up to 30 s), as one in seconds."""
    waits = []
    monkeypatch.setattr("distilserve.client.api.time.sleep", waits.append)
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=90),
                                        usegmt=True)
    answers = iter([httpx.Response(503, headers={"Retry-After": later}),
                    httpx.Response(429, headers={"Retry-After": "1.5"}), httpx.Response(503),
                    httpx.Response(200, json={"embeddings": [[1.0]]})])
    client = DistilServeClient("http://test", max_retries=3, backoff=0.25)
    client.http = httpx.Client(base_url="http://test",
                               transport=httpx.MockTransport(lambda request: next(answers)))
    assert client.embed("x") == [[1.0]]
    assert waits == [30.0, 1.5, 1.0]  # the date capped; then seconds; then 0.25 x 2 ** 2


# what a kept-alive connection closed by the server as the request went out raises (either,
# measured: 6 of 300 requests spaced by uvicorn's keep-alive), then a server not listening
DROPPED = [httpx.RemoteProtocolError("Server disconnected without sending a response."),
           httpx.ReadError("[Errno 104] Connection reset by peer")]
REFUSED = httpx.ConnectError("[Errno 111] Connection refused")


def test_both_clients_retry_a_dropped_or_refused_connection():
    client, calls = _client_answering([*DROPPED])
    assert client.embed("x") == [[1.0]] and len(calls) == 3
    aclient, acalls = _client_answering([DROPPED[1], REFUSED], AsyncDistilServeClient)
    assert asyncio.run(aclient.embed("x")) == [[1.0]] and len(acalls) == 3


@pytest.mark.parametrize("kind", [DistilServeClient, AsyncDistilServeClient])
def test_a_connection_failing_past_max_retries_is_the_clients_error_a_timeout_not_retried(kind):
    def embed(client):
        answer = client.embed("x")
        return asyncio.run(answer) if asyncio.iscoroutine(answer) else answer

    client, calls = _client_answering([REFUSED] * 3, kind)
    with pytest.raises(ConnectionFailed, match="^connection_error: ConnectError: "
                       r"\[Errno 111\] Connection refused$") as e:
        embed(client)
    assert len(calls) == 3 and e.value.status is None and e.value.__cause__ is REFUSED
    assert isinstance(e.value, DistilServeError) and not isinstance(e.value, TimedOut)
    client, calls = _client_answering([httpx.ReadTimeout("timed out")], kind)
    with pytest.raises(TimedOut, match="ReadTimeout: timed out"):  # the server may still
        embed(client)                                                # be at it: not resent
    assert len(calls) == 1
    client, calls = _client_answering([httpx.UnsupportedProtocol("no scheme")], kind)
    with pytest.raises(ConnectionFailed, match="UnsupportedProtocol"):  # not retried
        embed(client)
    assert len(calls) == 1
