import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from distilserve.server.core.batching import (
    Batcher,
    InputTooLong,
    Item,
    NotFinite,
    OverQueue,
    Postprocessed,
    QueueFull,
    Request,
    Stopped,
    not_finite,
    pad,
    take_batch,
    time_spent,
)
from distilserve.server.core.runner import warmup_shapes


def _encoding(length):
    return SimpleNamespace(ids=list(range(1, length + 1)), type_ids=[0] * length)


def _item(length, request=None):
    return Item("text", "right", future=None, encoding=_encoding(length),
                request=request or Request())


def test_take_batch_starts_with_the_oldest_and_groups_by_length():
    pending = [_item(10), _item(50), _item(11), _item(9), _item(48)]
    batch = take_batch(pending, max_size=3, max_tokens=10_000)
    assert [it.length for it in batch] == [10, 11, 9]


def test_take_batch_starts_with_the_request_least_served_then_its_own_inputs():
    bulk, small = Request(), Request()
    pending = [_item(10, bulk), _item(10, bulk), _item(10, small), _item(10, small),
               _item(10, bulk)]
    assert take_batch(pending, 2, 10_000) == pending[:2]  # none started: the oldest
    bulk.started = 2  # two of the bulk request's inputs ran already
    # the small request now, and of inputs as long, its own before the bulk's
    assert take_batch(pending, 3, 10_000) == [pending[2], pending[3], pending[0]]


def test_take_batch_starts_with_the_lowest_priority_then_as_before():
    """vLLM's priority: a batch starts from the request of the lowest priority, however
    young or served; among equals, as before."""
    bulk, later, urgent = Request(priority=1), Request(priority=1), Request(priority=-2)
    pending = [_item(10, bulk), _item(30, later), _item(50, urgent), _item(52, urgent)]
    assert take_batch(pending, 2, 10_000) == pending[2:]
    urgent.started = 5  # served more than the others: still first
    assert take_batch(pending, 1, 10_000) == pending[2:3]
    bulk.started = 1  # among the priority-1 requests, the one least served
    assert take_batch(pending[:2], 1, 10_000) == pending[1:2]


def test_a_request_of_a_lower_priority_starts_before_those_queued_ahead():
    batches = _batches_of(lambda b: [  # the bulk's ids [1, 1] each, the query's [1, 2]
        *(it for _ in range(5) for it in b.submit(["a b"] * 4, "right", priority=1)),
        *b.submit(["c dd"], "right")])  # priority 0, queued last
    assert [1, 2] in batches[0]  # at priority 1 it would have waited for five batches


def test_not_finite_names_the_inputs_whose_own_outputs_are_not():
    batch = [_item(2), _item(4), _item(3)]
    pooled = np.ones((3, 5), dtype=np.float32)
    assert not_finite(pooled, batch) == []
    pooled[1, 2] = np.inf
    assert not_finite(pooled, batch) == [batch[1]]
    per_token = np.ones((3, 4, 2), dtype=np.float32)  # [B, T, X], padded to 4 tokens
    per_token[0, 2:] = np.nan  # the first input's padding: not its outputs
    assert not_finite(per_token, batch) == []
    per_token[2, 1, 0] = -np.inf
    assert not_finite(per_token, batch) == [batch[2]]
    decoded = [np.ones((1, 9)), np.array([[np.nan]]), np.ones((2, 9))]  # fill-mask's
    assert not_finite(decoded, batch) == [batch[1]]
    with np.errstate(invalid="ignore"):
        paired = Postprocessed(pooled, pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
    assert not_finite(paired, batch) == [batch[1]]
    output, unit = paired[0]  # a row: its output and its output postprocessed
    np.testing.assert_array_equal(output, pooled[0])
    np.testing.assert_allclose(unit, pooled[0] / np.sqrt(5))


def test_a_batch_answers_its_finite_inputs_and_fails_the_others():
    def run(arrays):  # an input of three words overflows
        out = arrays["input_ids"].sum(1, keepdims=True).astype(np.float32)
        out[arrays["attention_mask"].sum(1) == 3] = np.inf
        return out

    async def go():
        b = Batcher(lambda texts, truncation: [
            SimpleNamespace(ids=[1] * len(t.split()), type_ids=[0] * len(t.split()))
            for t in texts], run, max_length=8, max_size=16, max_tokens=1000, max_queue=20)
        items = b.submit(["a", "a b c", "a b"], truncation="right")
        b.start()
        results = await asyncio.gather(*(it.future for it in items), return_exceptions=True)
        await b.stop()
        return results

    first, second, third = asyncio.run(go())
    assert float(first[0]) == 1.0 and float(third[0]) == 2.0
    assert isinstance(second, NotFinite) and str(second).startswith(
        "input 1: the model's outputs for its 3 tokens are not finite")


def test_time_spent_counts_overlapping_batches_once():
    def item(started, finished):
        it = _item(3)
        it.enqueued, it.tokenized_s, it.started, it.finished = 0.0, 0.5, started, finished
        return it

    # queued at 0, tokenised for 0.5; batches 1-3 and 2-4 (on a GPU, the second started
    # while the first ran) run 3 s together, and 5-6 one more: of 6 s, 1.5 s waiting
    items = [item(1, 3), item(1, 3), item(2, 4), item(5, 6)]
    assert time_spent(items) == (0.5, 1.5, 4.0)
    assert time_spent([item(1, 3)]) == (0.5, 0.5, 2.0)


def _batches_of(queue) -> list[list[list[int]]]:
    """Each batch's input ids, as a batcher of up to 4 inputs a batch runs the items that
    ``queue(batcher)`` submits, queued before it starts."""
    batches = []

    async def go():
        b = _batcher([], max_size=4, max_queue=100)
        run = b.run
        b.run = lambda arrays: batches.append(arrays["input_ids"].tolist()) or run(arrays)
        items = queue(b)
        b.start()
        await asyncio.gather(*(it.future for it in items))
        await b.stop()

    asyncio.run(go())
    return batches


def test_a_request_queued_behind_a_large_one_waits_for_one_batch_not_all():
    batches = _batches_of(lambda b: [  # ids [1, 1] each (the words' lengths), then [1, 2]
        *b.submit(["a b"] * 40, "right"), *b.submit(["c dd"], "right")])
    assert [len(rows) for rows in batches] == [4] * 10 + [1]  # 41 inputs, batches of 4
    assert [1, 2] in batches[1]  # the second batch, not the last


def test_take_batch_respects_the_token_budget():
    pending = [_item(10), _item(100), _item(12)]
    batch = take_batch(pending, max_size=8, max_tokens=40)
    assert [it.length for it in batch] == [10, 12]  # 100 would pad to 2 x 100


def test_take_batch_on_the_cpu_leaves_out_an_input_whose_padding_costs_more_than_it():
    """An input joins if the padded tokens it adds are at most its own and max_padding
    more: a long one among short ones waits for its own batch, as a short one among long
    ones does; near lengths still share (the last window of a long text beside its full
    ones: 512 + 136 padded to 2 x 512 took longer than each at its own length)."""
    windows = [_item(512), _item(512), _item(136)]
    assert [it.length for it in take_batch(windows, 8, 4096, 32)] == [512, 512]
    assert [it.length for it in take_batch(windows, 8, 4096)] == [512, 512, 136]  # GPU
    assert [it.length for it in take_batch(windows[2:] + windows[:2], 8, 4096, 32)] == [136]
    sentences = [_item(n) for n in (20, 22, 18, 25, 9, 60)]
    # near enough to share: 22, 18, 25 (padding the three before it by 3 tokens each) and
    # 9 (padded to 25); not 60, which would pad five inputs by 35 tokens each
    assert [it.length for it in take_batch(sentences, 8, 4096, 32)] == [20, 22, 18, 25, 9]
    assert len(take_batch(sentences, 8, 4096)) == 6
    # the first input always runs, however long
    assert take_batch([_item(300)], 8, 4096, 32)[0].length == 300


def test_take_batch_counts_padding_at_the_length_the_batch_runs_at():
    """A backend that rounds a batch's length up (to 16 tokens here, as the CPU's fused
    copies do) pads an input up to that length for nothing: 40 inputs of 12 tokens and 9
    of 13 share a batch that, counted at their own lengths, would leave the 13s out (each
    padding 40 inputs by one); the token budget is the rounded batch's too."""
    sixteens = lambda tokens: -(-tokens // 16) * 16  # noqa: E731
    sentences = [_item(12) for _ in range(40)] + [_item(13) for _ in range(9)]
    assert len(take_batch(sentences, 64, 1024, 32)) == 40
    assert len(take_batch(sentences, 64, 1024, 32, sixteens)) == 49
    assert len(take_batch(sentences, 64, 512, 32, sixteens)) == 32  # 32 x 16 tokens


def test_warmup_shapes_start_with_the_most_memory_and_stay_within_the_limits():
    shapes = warmup_shapes(256, 65_536, 512)
    assert shapes[0] == (128, 512)  # the longest inputs, as many as the budget allows
    assert all(b <= 256 and t <= 512 and b * t <= 65_536 for b, t in shapes)
    assert len(set(shapes)) == len(shapes) and (256, 256) in shapes and (1, 8) in shapes
    assert shapes[1:] == sorted(shapes[1:], reverse=True)
    assert warmup_shapes(5, 100, 6) == [(5, 6), (4, 6), (2, 6), (1, 6)]  # limits not powers of 2
    assert warmup_shapes(32, 100, 512)[0] == (1, 100)  # a budget under max_length


def test_take_batch_never_mixes_depths():
    """A recursive model's inputs at different depths (iterations) run apart: the first
    input's depth chooses the batch, whatever the lengths."""
    pending = [_item(10), _item(10), _item(10), _item(12), _item(10)]
    for item, depth in zip(pending, (2, None, 2, 2, 3)):
        item.depth = depth
    assert take_batch(pending, 8, 10_000) == [pending[0], pending[2], pending[3]]
    assert take_batch(pending[1:2] + pending[4:], 8, 10_000) == [pending[1]]


def test_a_batchers_depths_each_run_apart_and_say_their_depth():
    calls, seen, batches = [], [], []

    async def go():
        b = _batcher(calls, on_batch=lambda size, seconds, depth: batches.append((size, depth)))
        run = b.run
        b.run = lambda arrays: seen.append(int(arrays.get("num_iterations", -1))) or run(arrays)
        items = [*b.submit(["a b", "c"], "right", depth=2), *b.submit(["d"], "right"),
                 *b.submit(["e f g"], "right", depth=2)]
        b.start()  # all queued before the thread looks
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    assert [float(r[0]) for r in asyncio.run(go())] == [2.0, 1.0, 1.0, 3.0]
    assert sorted(seen) == [-1, 2] and sorted(batches) == [(1, None), (3, 2)]


def test_pad_right_pads_with_a_mask():
    arrays = pad([_encoding(2), _encoding(4)])
    assert arrays["input_ids"].tolist() == [[1, 2, 0, 0], [1, 2, 3, 4]]
    assert arrays["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert "num_iterations" not in arrays
    assert pad([_encoding(2)], depth=3)["num_iterations"] == np.array(3, dtype=np.int64)


def _batcher(calls, **kw):
    """Texts are words; a text's encoding has one id per word (each the word's length)."""
    def encode(texts, truncation):
        calls.append(("encode", len(texts)))
        return [SimpleNamespace(ids=[len(w) for w in t.split()],
                                type_ids=[0] * len(t.split())) for t in texts]

    def run(arrays):
        calls.append(("run", len(arrays["input_ids"])))
        return arrays["input_ids"].sum(1, keepdims=True).astype(np.float32)

    return Batcher(encode, run, **{
        "max_length": 8, "max_size": 16, "max_tokens": 1000, "max_queue": 20, **kw})


def test_batcher_tokenises_and_merges_waiting_inputs_and_refuses_a_full_queue():
    calls = []

    async def go():
        b = _batcher(calls, max_wait_s=0.01, max_length=16)
        b.start()
        items = b.submit(["a " * i + "bb" for i in range(10)], truncation="right")
        with pytest.raises(QueueFull):  # 10 + 11 > 20: later, there will be room
            b.submit(["x"] * 11, truncation="right")
        with pytest.raises(OverQueue):  # 21 > 20: there never will be
            b.submit(["x"] * 21, truncation="right")
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    results = asyncio.run(go())
    assert [float(r[0]) for r in results] == [i + 2.0 for i in range(10)]
    assert calls == [("encode", 10), ("run", 10)]  # one tokeniser call, one forward pass


def test_an_idle_model_waits_for_company_only_until_its_batch_is_full_or_it_stops():
    """DISTILSERVE_MAX_WAIT_MS (here an hour; Triton's max_queue_delay): a full batch runs
    when it fills, and stopping runs what waits. (Before, the model's thread slept the
    whole wait: this test took an hour; 600 s is for a failure to end.)"""
    calls = []

    async def go():
        b = _batcher(calls, max_wait_s=3600, max_size=4)
        b.start()
        first = b.submit(["a", "b"], truncation="right")
        await asyncio.sleep(0.05)  # the model's thread waits for more
        second = b.submit(["c", "d"], truncation="right")
        await asyncio.wait_for(asyncio.gather(*(it.future for it in first + second)), 600)
        full = list(calls)
        last = b.submit(["e"], truncation="right")[0]
        await asyncio.wait_for(b.stop(), 600)
        return full, last.future.result()

    full, last = asyncio.run(go())
    assert full[-1] == ("run", 4)  # one batch of the four
    assert calls[-1] == ("run", 1) and float(last[0]) == 1.0


def test_an_input_over_max_length_fails_alone():
    calls = []

    async def go():
        b = _batcher(calls)
        b.start()
        long, short = b.submit(["w " * 9, "w w"], truncation=None)
        with pytest.raises(InputTooLong, match="input 0 has 9 tokens"):
            await long.future
        result = await short.future
        await b.stop()
        return result

    assert float(asyncio.run(go())[0]) == 2.0
    assert ("run", 1) in calls


def test_inputs_cut_differently_are_tokenised_apart_and_share_a_batch():
    calls, seen = [], []

    async def go():
        b = _batcher(calls)
        encode = b.encode
        b.encode = lambda texts, truncation: seen.append((truncation, texts)) or encode(
            texts, truncation)
        items = [*b.submit(["a b", "c"], "right"), *b.submit(["d e f"], "left"),
                 *b.submit(["g"], "right")]
        b.start()  # all four queued before the thread looks
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    assert [float(r[0]) for r in asyncio.run(go())] == [2.0, 1.0, 3.0, 1.0]
    assert seen == [("right", ["a b", "c", "g"]), ("left", ["d e f"])]
    assert calls.count(("run", 4)) == 1  # one forward pass for all of them


def test_a_text_the_tokenizer_refuses_fails_alone():
    calls = []

    async def go():
        b = _batcher(calls)
        encode = b.encode

        def picky(texts, truncation):  # refuses any call holding "bad"
            if "bad" in texts:
                raise TypeError("cannot encode")
            return encode(texts, truncation)

        b.encode = picky
        b.start()
        good, bad, other = b.submit(["a b", "bad", "c d e"], truncation="right")
        with pytest.raises(TypeError, match="cannot encode"):
            await bad.future
        results = await asyncio.gather(good.future, other.future)
        await b.stop()
        return results

    assert [float(r[0]) for r in asyncio.run(go())] == [2.0, 3.0]


def test_with_collect_inputs_that_arrive_while_a_batch_runs_start_at_once():
    """A GPU's batches overlap: while the first batch's outputs are awaited (its collect
    blocks until the test lets it go), inputs submitted then are tokenised and started as
    a second batch, but no third starts before the first is collected. Every input still
    gets its own result, and an input too long fails alone."""
    calls, release = [], threading.Event()

    def encode(texts, truncation):
        return [SimpleNamespace(ids=[len(w) for w in t.split()], type_ids=[0] * len(t.split()))
                for t in texts]

    def launch(arrays):
        calls.append(("launch", len(arrays["input_ids"])))
        return arrays["input_ids"].sum(1, keepdims=True).astype(np.float32)

    def collect(handle):
        if not calls.count(("collect", 1)):
            release.wait()  # the first batch's device work goes on until the test says
        calls.append(("collect", len(handle)))
        return handle

    async def until(condition, what):
        for _ in range(6000):  # a minute, where milliseconds do
            if condition():
                return
            await asyncio.sleep(0.01)
        release.set()
        pytest.fail(f"{what} did not happen: {calls}")

    async def go():
        b = Batcher(encode, launch, max_length=8, max_size=2, max_tokens=1000, max_queue=20,
                    collect=collect)
        b.start()
        first = b.submit(["a"], truncation=None)
        await until(lambda: calls == [("launch", 1)], "the first batch")
        later = b.submit(["a b", "w " * 9, "a b c"], truncation=None)  # while the first runs
        await until(lambda: len(calls) == 2, "a second batch while the first runs")
        await asyncio.sleep(0.2)  # room for a third batch to start, if it wrongly could
        assert calls == [("launch", 1), ("launch", 2)]
        with pytest.raises(InputTooLong):  # handed out without waiting for the device
            await later[1].future
        b.submit(["a b c d"], truncation=None)
        await asyncio.sleep(0.2)
        assert len(calls) == 2  # two batches in flight: the third waits
        release.set()
        results = await asyncio.gather(*(it.future for it in first + later),
                                       return_exceptions=True)
        await b.stop()
        return results

    results = asyncio.run(go())
    assert [float(r[0]) for i, r in enumerate(results) if i != 2] == [1.0, 2.0, 3.0]
    assert isinstance(results[2], InputTooLong)
    assert calls == [("launch", 1), ("launch", 2), ("collect", 1), ("launch", 1),
                     ("collect", 2), ("collect", 1)] or calls == [
        ("launch", 1), ("launch", 2), ("collect", 1), ("collect", 2), ("launch", 1),
        ("collect", 1)]


def test_with_collect_stop_finishes_everything_queued_first():
    """Stopping while batches are queued and on the device: every input still gets its
    result, then both threads end."""
    def encode(texts, truncation):
        return [SimpleNamespace(ids=[1] * len(t), type_ids=[0] * len(t)) for t in texts]

    def collect(handle):
        time.sleep(0.02)  # the device's work
        return handle

    async def go():
        b = Batcher(encode, lambda arrays: arrays["input_ids"].sum(1, keepdims=True), 100,
                    max_size=2, max_tokens=1000, max_queue=100, collect=collect)
        b.start()
        items = b.submit([f"{i:>{i + 1}}" for i in range(11)], truncation="right")
        await b.stop()  # at once: most inputs are still queued
        assert not any(thread.is_alive() for thread in b.threads) and len(b.threads) == 2
        return await asyncio.wait_for(asyncio.gather(*(it.future for it in items)), 60)

    assert [float(r[0]) for r in asyncio.run(go())] == [i + 1.0 for i in range(11)]


def test_once_stopping_it_finishes_what_was_queued_and_takes_nothing_more():
    """A model unloaded or replaced (repository polling): a request that chose it before
    gets Stopped (the engine's ModelUnavailable, a 503 to retry), never an answer that
    does not come."""
    calls = []

    async def go():
        b = _batcher(calls)
        b.start()
        queued = b.submit(["a bb", "ccc"], truncation="right")
        stopping = asyncio.ensure_future(b.stop())
        await asyncio.sleep(0)  # stop() has begun
        with pytest.raises(Stopped):
            b.submit(["late"], truncation="right")
        await stopping
        return await asyncio.gather(*(it.future for it in queued))

    assert [float(r[0]) for r in asyncio.run(go())] == [3.0, 3.0]
