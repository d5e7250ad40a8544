"""The shared engine process and its front ends, in one event loop over a real Unix
socket: the frames between them, outputs equal to a model's own engine's, refusals carried
across, and a front end whose engine process is gone answering unavailable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from distilserve.server.core.batching import InputTooLong, NotFinite, OverQueue, QueueFull
from distilserve.server.core.runner import ModelUnavailable
from distilserve.server.core.tokenisation import TokenIds
from distilserve.server.engine import load_engine
from distilserve.server.engine_process import front_end, process, supervisor, wire
from distilserve.server.metrics import Metrics
from distilserve.server.service import Service
from distilserve.server.settings import Settings


async def _read_back(data: bytes):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await wire.read(reader)


def test_a_frame_carries_its_messages_back_as_they_were():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7], np.int32),
              np.zeros((0, 4), np.float16)]
    data = wire.frame([({"id": 3, "pairs": False}, arrays[:2]), ({"op": "cancel", "id": 4}, []),
                       ({"id": 5}, arrays[2:])])
    messages = asyncio.run(_read_back(data))
    assert [header for header, _ in messages] == [{"id": 3, "pairs": False},
                                                  {"op": "cancel", "id": 4}, {"id": 5}]
    back = [a for _, part in messages for a in part]
    assert [len(part) for _, part in messages] == [2, 0, 1]
    assert [a.dtype for a in back] == [a.dtype for a in arrays]
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
    back[0][0, 0] = 9  # writable: postprocessing may work in place
    assert back[0][0, 0] == 9


def test_token_ids_are_split_back_into_each_input():
    encodings = [TokenIds([1, 2, 3], [0, 0, 0]), TokenIds([4], [1]), TokenIds([5, 6], [0, 1])]
    back = wire.split(*wire.token_ids(encodings), [3, 1, 2])
    assert [(ids.tolist(), types.tolist()) for ids, types in back] == \
        [([1, 2, 3], [0, 0, 0]), ([4], [1]), ([5, 6], [0, 1])]
    (ids, types), = wire.split(*wire.token_ids(encodings[:1]), [3])  # one input: as sent
    assert (ids.tolist(), types.tolist()) == ([1, 2, 3], [0, 0, 0])


def test_outputs_and_pairs_of_them_round_trip():
    pairs = [(np.ones(2), np.zeros(2)), (np.full(2, 2.0), np.full(2, 3.0))]
    arrays, paired = wire.outputs(pairs)
    assert paired and len(arrays) == 4
    back = wire.unpack_outputs(arrays, paired)
    assert [(a.tolist(), b.tolist()) for a, b in back] == [([1, 1], [0, 0]), ([2, 2], [3, 3])]


@pytest.mark.parametrize("error", [QueueFull("9 queued"), OverQueue("too many"),
                                   ModelUnavailable("gone"), InputTooLong(2, 300, 256),
                                   NotFinite(1, 40)])
def test_a_refusal_is_raised_again_on_the_front_end_as_it_was_raised(error):
    with pytest.raises(type(error)) as raised:
        wire.raise_failure(wire.failure(error))
    assert str(raised.value) == str(error)


def test_any_other_failure_is_an_engine_error_naming_it():
    with pytest.raises(wire.EngineError, match="ValueError: broken"):
        wire.raise_failure(wire.failure(ValueError("broken")))
    wire.raise_failure({"id": 1})  # no failure: nothing raised


class Engine:
    """An engine process's service, served on ``path`` by ``start`` until ``stop``."""

    def __init__(self, settings: Settings, path: str):
        self.settings, self.path = settings, path

    def start(self) -> None:
        self.service, self.stopping = Service(self.settings, Metrics()), asyncio.Event()
        self.task = asyncio.create_task(process.serve(self.service, self.path, self.stopping))

    async def stop(self) -> None:
        self.stopping.set()
        await self.task


@contextlib.asynccontextmanager
async def engine_and_front_end(repository, path, **settings):
    """An engine serving ``repository`` on ``path``, and a front end's service loaded from
    it; the engine stopped afterwards."""
    settings = Settings(model_repository=repository, engine="shared", **settings)
    engine = Engine(settings, path)
    engine.start()
    front = Service(settings, Metrics())
    await front_end.loader(path)(front)
    try:
        yield front, engine
    finally:
        if not engine.task.done():
            await engine.stop()


@pytest.fixture(scope="module")
def socket_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("engine") / "engine.sock")


def test_a_front_end_serves_the_engines_models_with_their_own_outputs(oip_repository,
                                                                      socket_path, caplog):
    texts = ["a short one", "and a somewhat longer sentence to embed", "x"]
    caplog.set_level(logging.INFO, logger="distilserve")

    async def go():
        async with engine_and_front_end(oip_repository, socket_path) as (front, _):
            # the log tells the one copy of each model from the front ends that send to it
            said = [r.getMessage() for r in caplog.records if r.name == "distilserve"]
            assert sum(m.startswith("serving embed (") for m in said) == 1
            assert sum(m.startswith("serving embed through the engine process (")
                       for m in said) == 1
            assert sorted(front.engines) == ["classify", "embed", "ner"]
            assert "broken" in front.failures  # the engine's failures, said by the front end
            assert front.ready
            answers = {name: await engine.infer(texts, "right")
                       for name, engine in front.engines.items()}
            windowed = await front.engines["embed"].infer(texts, None, windows=(8, 4))
            described = front.engines["embed"].describe()
        return answers, windowed, described

    answers, windowed, described = asyncio.run(go())
    settings = Settings(model_repository=oip_repository)
    for name, answer in answers.items():
        local = load_engine(name, oip_repository / name, settings, Metrics())

        async def run_locally(local=local, name=name):
            await local.start(warmup=False)
            try:
                return (await local.infer(texts, "right"),
                        await local.infer(texts, None, windows=(8, 4)) if name == "embed"
                        else None)
            finally:
                await local.stop()

        own, own_windows = asyncio.run(run_locally())
        assert answer.tokens == own.tokens and answer.characters == own.characters
        assert answer.device == "cpu" and answer.inference_s > 0
        for mine, theirs in zip(answer.outputs, own.outputs):
            if name == "ner":  # (its rows per token, with its encoding)
                np.testing.assert_allclose(mine[0], theirs[0], atol=1e-5)
                assert mine[1].ids == theirs[1].ids
            else:
                np.testing.assert_allclose(mine, theirs, atol=1e-5)
        if answer.postprocessed is not None:
            np.testing.assert_allclose(answer.postprocessed, own.postprocessed, atol=1e-5)
        if own_windows is not None:
            assert [len(w) for w in windowed.outputs] == [len(w) for w in own_windows.outputs]
            np.testing.assert_allclose(np.concatenate(windowed.outputs),
                                       np.concatenate(own_windows.outputs), atol=1e-5)
    assert described["device"] == "cpu" and described["backend"] == "onnx"


@pytest.fixture(scope="module")
def decoding_repository(exports, tmp_path_factory):
    """Fill-mask (its batches decode their mask tokens in the engine) and question
    answering (a row per token, with windows of its pairs)."""
    from distilserve.models.io import checkpoint

    root, repo = tmp_path_factory.mktemp("decoding"), tmp_path_factory.mktemp("repo")
    for task in ("fill-mask", "qa"):
        saved = checkpoint.save(checkpoint.new("bert", "tiny", task, seed=4), root / task)
        exports(saved, repo / task, "onnx", task=task, max_length=32, check=False)
    return repo


def test_fill_mask_and_question_answering_through_the_engine(decoding_repository,
                                                              socket_path):
    masked = ["the [MASK] sat on the mat", "a [MASK] and a [MASK]"]
    pairs = [("who sat?", "the cat sat on the mat " * 6), ("where?", "on the mat")]

    async def go():
        async with engine_and_front_end(decoding_repository, socket_path) as (front, _):
            return (await front.engines["fill-mask"].infer(masked, "right"),
                    await front.engines["qa"].infer(pairs, None, windows=(16, 4)))

    filled, answered = asyncio.run(go())
    settings = Settings(model_repository=decoding_repository)

    async def locally():
        engines = [load_engine(name, decoding_repository / name, settings, Metrics())
                   for name in ("fill-mask", "qa")]
        for engine in engines:
            await engine.start(warmup=False)
        try:
            return (await engines[0].infer(masked, "right"),
                    await engines[1].infer(pairs, None, windows=(16, 4)))
        finally:
            for engine in engines:
                await engine.stop()

    own_filled, own_answered = asyncio.run(locally())
    # each input's (logits [M, V]: a row per mask, its encoding)
    assert [o[0].shape[0] for o in filled.outputs] == [1, 2]
    for (mine, encoding), (theirs, own_encoding) in zip(filled.outputs, own_filled.outputs):
        np.testing.assert_allclose(mine, theirs, atol=1e-4)
        assert encoding.ids == own_encoding.ids
    assert [len(w) for w in answered.outputs] == [len(w) for w in own_answered.outputs]
    assert len(answered.outputs[0]) > 1  # the long context's windows
    for mine, theirs in zip(answered.outputs, own_answered.outputs):
        for (rows, encoding), (own_rows, own_encoding) in zip(mine, theirs):
            np.testing.assert_allclose(rows, own_rows, atol=1e-5)
            assert encoding.ids == own_encoding.ids


def test_the_engines_refusals_reach_the_front_end(oip_repository, socket_path):
    async def go():
        async with engine_and_front_end(oip_repository, socket_path, max_queue=2) as (front, _):
            embed = front.engines["embed"]
            with pytest.raises(OverQueue):
                await embed.infer(["a", "b", "c"], "right")
            with pytest.raises(InputTooLong, match="input 1 has"):
                await embed.infer(["short", "word " * 200], None)
            assert len((await embed.infer(["one", "two"], "right")).outputs) == 2

    asyncio.run(go())


def test_a_full_queue_is_refused_at_the_front_end_and_counted_once(oip_repository,
                                                                     socket_path):
    async def go():
        # one input fills the queue while the idle model waits for company
        async with engine_and_front_end(oip_repository, socket_path, max_queue=1,
                                        max_wait_ms=60_000, warmup=False) as (front, engine):
            waiting = asyncio.create_task(front.engines["embed"].infer(["a"], "right"))
            batcher = engine.service.engines["embed"].runner.batcher
            await wait_until(lambda: batcher.pending)
            with pytest.raises(QueueFull):
                await front.engines["embed"].infer(["b"], "right")
            counted = [s.value for m in engine.service.metrics.registry.collect()
                       for s in m.samples if s.name == "distilserve_rejected_inputs_total"
                       and s.labels.get("model") == "embed"]
            waiting.cancel()
            with batcher.lock:  # the model's thread stops waiting
                batcher.stopping = True
                batcher.inputs.notify_all()
        return counted

    assert asyncio.run(go()) == [1.0]


def test_without_its_engine_process_a_front_end_answers_unavailable(tmp_path):
    async def go():
        client = front_end.EngineClient(str(tmp_path / "nobody.sock"))
        client.start()
        await asyncio.sleep(0.05)
        with pytest.raises(ModelUnavailable, match="engine process"):
            await client.call({"op": "models"})
        for task in client.tasks:
            task.cancel()

    asyncio.run(go())


def test_a_load_by_request_without_the_engine_process_is_refused_as_unavailable(tmp_path):
    from distilserve.server.core.refusals import Refusal

    async def go():
        client = front_end.EngineClient(str(tmp_path / "nobody.sock"))
        client.start()
        follower = front_end.Follower(client, Service(Settings(), Metrics()))
        with pytest.raises(Refusal, match="the engine process that would load it") as refused:
            await follower.control("load", "embed")
        assert refused.value.reason == "unavailable" and refused.value.retry_after == 2
        for task in client.tasks:
            task.cancel()

    asyncio.run(go())


def test_requests_in_flight_when_the_engine_process_goes_are_unavailable(tmp_path):
    """The engine's connection closes with a request unanswered: it is failed, not hung,
    and the next request is refused until the engine is back."""
    path = str(tmp_path / "engine.sock")

    async def go():
        accepted = asyncio.Event()

        async def swallow(reader, writer):
            await wire.read(reader)  # the request, never answered
            accepted.set()
            writer.close()

        server = await asyncio.start_unix_server(swallow, path)
        client = front_end.EngineClient(path)
        client.start()
        await client.connected.wait()
        with pytest.raises(ModelUnavailable, match="gone"):
            await client.call({"op": "models"})
        assert accepted.is_set() and not client.connected.is_set()
        server.close()
        for task in client.tasks:
            task.cancel()

    asyncio.run(go())


def test_an_engine_not_ready_yet_says_what_it_is_doing():
    served = process.models(Service(Settings(), Metrics()))
    assert served == {"ready": False, "status": "starting"}


def test_a_front_end_is_not_ready_while_its_engine_process_is_gone(oip_repository,
                                                                  socket_path):
    async def go():
        async with engine_and_front_end(oip_repository, socket_path) as (front, engine):
            before = front.engines["embed"]
            await engine.stop()
            await wait_until(lambda: not front.ready)
            assert front.status == "the engine process is restarting"
            with pytest.raises(ModelUnavailable):
                await before.infer(["a"], "right")
            engine.start()  # another on the same socket: the front end connects again
            await wait_until(lambda: front.ready)
            assert front.engines["embed"] is before  # its folder unchanged: kept
            assert len((await before.infer(["a"], "right")).outputs) == 1

    asyncio.run(go())


def test_a_request_whose_client_went_away_leaves_the_engines_queue(oip_repository,
                                                                   socket_path):
    async def go():
        # an idle model waits a minute for company: the input stays queued (no warm-up,
        # whose inputs would wait as long)
        async with engine_and_front_end(oip_repository, socket_path, max_wait_ms=60_000,
                                        warmup=False) as (front, engine):
            request = asyncio.create_task(front.engines["classify"].infer(["a"], "right"))
            batcher = engine.service.engines["classify"].runner.batcher
            await wait_until(lambda: batcher.pending)
            (queued,) = batcher.pending
            request.cancel()
            await wait_until(lambda: queued.future.cancelled())
            with batcher.lock:  # the model's thread stops waiting, and runs no batch of it
                batcher.stopping = True
                batcher.inputs.notify_all()

    asyncio.run(go())


async def wait_until(condition, seconds: float = 60) -> None:
    for _ in range(int(seconds * 100)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


def test_a_front_end_polls_only_where_the_engine_runs_on_a_device(oip_repository, socket_path,
                                                                   monkeypatch):
    """DISTILSERVE_ENGINE_POLL_US where the engine's models run on a GPU; on the CPU, whose
    cores the model computes on, a front end does not poll."""
    async def window() -> float:
        async with engine_and_front_end(oip_repository, socket_path, engine_poll_us=1500) as (
                front, _):
            return front.engines["embed"].runner.client.polling.window_s

    assert asyncio.run(window()) == 0.0
    said = process.models

    def on_a_gpu(service) -> dict:
        state = said(service)
        for m in state.get("models", ()):
            m["described"] = {**m["described"], "device": "cuda:0"}
        return state

    monkeypatch.setattr(process, "models", on_a_gpu)
    assert asyncio.run(window()) == 0.0015


def test_a_front_end_polls_while_it_awaits_replies_and_sleeps_after():
    """Polling: while replies are awaited the loop goes round (here, waiting() is asked
    again and again), not once they all came, nor past the window after the last request;
    a window of 0 never polls."""
    async def go():
        calls, awaited = 0, True

        def waiting() -> bool:
            nonlocal calls
            calls += 1
            return awaited

        async def quiet() -> bool:  # whether the loop no longer asks, over a while
            before = calls
            await asyncio.sleep(0.05)
            return calls == before

        polling = front_end.Polling(60.0, waiting)
        polling.start()
        for _ in range(5000):  # (at most 5 s of a machine's time)
            if calls >= 100:
                break
            await asyncio.sleep(0.001)
        assert calls >= 100
        awaited = False
        await asyncio.sleep(0.01)
        assert await quiet() and not polling.polling
        awaited = True  # awaited still, past the window: it has stopped
        front_end.Polling(0.02, waiting).start()
        await asyncio.sleep(0.1)
        assert calls > 0 and await quiet()
        calls = 0
        front_end.Polling(0.0, waiting).start()
        await asyncio.sleep(0.02)
        assert calls == 0

    asyncio.run(go())


def test_front_ends_follow_the_engines_repository_as_it_changes(exports, tiny_checkpoints,
                                                                tmp_path):
    """The engine polls its repository (DISTILSERVE_POLL_SECONDS) and tells the front ends
    when what it serves changes: each serves a folder added, exported again or removed.
    A request sent with a model the engine no longer serves is refused (a 503 to retry)
    and has its front end look, news or none."""
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    path = str(tmp_path / "engine.sock")

    def put_in_place(checkpoint, name: str) -> None:  # whole, as a poll must see it
        exports(checkpoint, staging / name, "onnx", check=False)
        if (repo / name).exists():
            (repo / name).rename(tmp_path / f"old-{name}-{len(list(tmp_path.iterdir()))}")
        (staging / name).rename(repo / name)

    async def go():
        async with engine_and_front_end(repo, path, poll_seconds=0.2, warmup=False) as (
                one, engine):
            other = Service(one.settings, Metrics())
            await front_end.loader(path)(other)
            assert sorted(one.engines) == sorted(other.engines) == ["embed"]

            await asyncio.to_thread(put_in_place, tiny_checkpoints["bert", "classify"],
                                    "classify")
            await wait_until(lambda: "classify" in one.engines and "classify" in other.engines)
            assert len((await one.engines["classify"].infer(["a"], "right")).outputs) == 1

            news, engine.service.on_change = engine.service.on_change, None  # none told
            before = one.engines["embed"]
            await asyncio.to_thread(put_in_place, tiny_checkpoints["minialbert", "embed"],
                                    "embed")
            await wait_until(lambda: engine.service.engines["embed"].family == "minialbert")
            with pytest.raises(ModelUnavailable, match="has loaded another version since"):
                await before.infer(["a"], "right")
            await wait_until(lambda: one.engines["embed"].family == "minialbert")
            assert other.engines["embed"].family == "bert"  # (no request of its has asked)
            with pytest.raises(ModelUnavailable):
                await other.engines["embed"].infer(["a"], "right")
            await wait_until(lambda: other.engines["embed"].family == "minialbert")
            own = await engine.service.engines["embed"].infer(["a"], "right")
            for front in (one, other):
                np.testing.assert_allclose(
                    (await front.engines["embed"].infer(["a"], "right")).outputs[0],
                    own.outputs[0], atol=1e-6)

            engine.service.on_change = news
            (repo / "classify").rename(tmp_path / "gone")
            await wait_until(lambda: "classify" not in one.engines | other.engines)
            assert "classify" not in engine.service.engines

    asyncio.run(go())


def test_a_front_end_says_where_it_read_a_folder_changed_since_the_engine_did(
        exports, tiny_checkpoints, tmp_path, caplog):
    repo = tmp_path / "repo"
    exports(tiny_checkpoints["bert", "embed"], repo / "embed", "onnx", check=False)
    path = str(tmp_path / "engine.sock")

    async def go():
        async with engine_and_front_end(repo, path, warmup=False) as (one, _):
            assert "folder changed" not in caplog.text
            os.utime(repo / "embed" / "manifest.json", ns=(1, 1))  # (not polled: unread)
            await front_end.loader(path)(Service(one.settings, Metrics()))
            assert "model embed: its folder changed after the engine process read it" in (
                caplog.text)

    asyncio.run(go())


def test_models_loaded_and_unloaded_by_request_through_any_front_end(exports, tiny_checkpoints,
                                                                     tmp_path):
    """DISTILSERVE_MODEL_CONTROL=explicit with the shared engine: a front end's load or
    unload is the engine process's, done once that front end serves the outcome; every
    other front end serves it once the engine says its models changed. A load the engine
    refuses is refused at the front end as the engine said it."""
    from distilserve.server.core.refusals import Refusal

    repo = tmp_path / "repo"
    for task in ("embed", "classify"):
        exports(tiny_checkpoints["bert", task], repo / task, "onnx", check=False)
    path = str(tmp_path / "engine.sock")

    async def go():
        async with engine_and_front_end(repo, path, model_control="explicit", workers=2,
                                        warmup=False) as (one, engine):
            other = Service(one.settings, Metrics())
            await front_end.loader(path)(other)
            assert sorted(one.engines) == sorted(other.engines) == ["classify", "embed"]

            await one.unload("classify")
            assert "classify" not in one.engines and "classify" not in engine.service.engines
            await wait_until(lambda: "classify" not in other.engines)
            with pytest.raises(Refusal, match="not served") as refused:
                await other.unload("classify")
            assert refused.value.reason == "not_found"

            await other.load("classify")
            assert len((await other.engines["classify"].infer(["a"], "right")).outputs) == 1
            await wait_until(lambda: "classify" in one.engines)

            served, kept = engine.service.engines["embed"], (one.engines["embed"],
                                                             other.engines["embed"])
            await one.load("embed")  # its folder unchanged: each front end's model kept
            assert engine.service.engines["embed"] is not served
            assert (one.engines["embed"], other.engines["embed"]) == kept
            for model in kept:  # (as the engine's version: not refused as stale)
                assert len((await model.infer(["a"], "right")).outputs) == 1

            (repo / "broken").mkdir()
            (repo / "broken" / "manifest.json").write_text("{not json")
            with pytest.raises(Refusal, match="model 'broken' failed to load") as refused:
                await one.load("broken")
            assert refused.value.reason == "bad_request" and "broken" in one.failures
            await wait_until(lambda: "broken" in other.failures)

    asyncio.run(go())


def test_the_engines_socket_is_made_where_its_path_fits_a_unix_socket(tmp_path, monkeypatch):
    assert supervisor.socket_path(str(tmp_path)) == str(tmp_path / "engine.sock")
    deep = tmp_path / ("d" * 100)  # a TMPDIR past sun_path's 107 bytes
    path = supervisor.socket_path(str(deep))
    folder = Path(path).parent
    try:
        assert folder.parent == Path("/tmp") and folder.name.startswith("distilserve-engine-")
        assert len(path) <= supervisor.SOCKET_PATH_MAX
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # its owner's alone
    finally:
        folder.rmdir()

    def no_room(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(supervisor.tempfile, "mkdtemp", no_room)
    with pytest.raises(OSError, match=(
            f"^the engine process's socket would be {deep}/engine.sock, "
            f"{len(str(deep)) + 12} bytes, past the 107 a Unix socket's path takes, and /tmp "
            "takes no folder \\(Permission denied\\): set TMPDIR to a shorter folder's path$")):
        supervisor.socket_path(str(deep))
