import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from server.batching import Batcher, Item, QueueFull, pad, take_batch


def _item(length):
    return Item(list(range(1, length + 1)), [0] * length, future=None)


def test_take_batch_starts_with_the_oldest_and_groups_by_length():
    pending = [_item(10), _item(50), _item(11), _item(9), _item(48)]
    batch = take_batch(pending, max_size=3, max_tokens=10_000)
    assert [it.length for it in batch] == [10, 11, 9]


def test_take_batch_respects_the_token_budget():
    pending = [_item(10), _item(100), _item(12)]
    batch = take_batch(pending, max_size=8, max_tokens=40)
    assert [it.length for it in batch] == [10, 12]  # 100 would pad to 2 x 100


def test_pad_right_pads_with_a_mask():
    arrays = pad([_item(2), _item(4)])
    assert arrays["input_ids"].tolist() == [[1, 2, 0, 0], [1, 2, 3, 4]]
    assert arrays["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_batcher_merges_waiting_inputs_and_refuses_a_full_queue():
    sizes = []

    def run(arrays):
        sizes.append(len(arrays["input_ids"]))
        return arrays["input_ids"].sum(1, keepdims=True).astype(np.float32)

    async def go():
        b = Batcher(run, ThreadPoolExecutor(1), max_size=16, max_tokens=1000, max_queue=20,
                    max_wait_s=0.01)
        b.start()
        items = b.submit([([i, i], [0, 0]) for i in range(10)])
        with pytest.raises(QueueFull):
            b.submit([([1], [0])] * 11)
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    results = asyncio.run(go())
    assert [float(r[0]) for r in results] == [2.0 * i for i in range(10)]
    assert sizes == [10]
