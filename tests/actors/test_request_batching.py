"""RequestBatcher: callers' requests share one model call up to a size or a deadline."""

from __future__ import annotations

import asyncio
import threading

import pytest

from actors.request_batching import RequestBatcher


def doubling(calls: list[list[list[int]]]):
    def run(batch: list[list[int]]) -> list[list[int]]:
        calls.append(batch)
        return [[2 * x for x in request] for request in batch]

    return run


def test_concurrent_callers_share_one_call_and_each_gets_its_own_result():
    calls: list = []
    batcher = RequestBatcher(doubling(calls), max_items=100, max_wait_s=0.2, size=len)

    async def main():
        return await asyncio.gather(*(batcher.submit([i, i + 1]) for i in range(5)))

    results = asyncio.run(main())
    assert results == [[2 * i, 2 * i + 2] for i in range(5)]
    assert len(calls) == 1 and batcher.batch_sizes == [10]


def test_a_full_batch_runs_before_the_deadline_and_requests_are_never_split():
    calls: list = []
    batcher = RequestBatcher(doubling(calls), max_items=4, max_wait_s=30.0, size=len)

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(batcher.submit([1, 2]), batcher.submit([3, 4]), batcher.submit([5, 6, 7]),
                                       batcher.submit([8, 9, 10, 11, 12]))
        return results, loop.time() - start

    # [1,2]+[3,4] fill 4 items; [5,6,7] cannot join [8..12] (oversized), so each runs alone. Every batch
    # closes by size: none waits for the 30 s deadline, which the 60 s bound would otherwise expose.
    async def bounded():
        return await asyncio.wait_for(main(), timeout=60)

    results, _ = asyncio.run(bounded())
    assert results == [[2, 4], [6, 8], [10, 12, 14], [16, 18, 20, 22, 24]]
    assert [len(b) for b in calls[:1]] == [2] and batcher.batch_sizes[0] == 4
    assert all(len(request) <= 4 or len(batch) == 1 for batch in calls for request in batch)


def test_a_lone_request_waits_at_most_the_deadline():
    calls: list = []
    batcher = RequestBatcher(doubling(calls), max_items=1000, max_wait_s=0.05, size=len)

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        result = await batcher.submit([7])
        return result, loop.time() - start

    result, waited = asyncio.run(main())
    assert result == [14] and batcher.batch_sizes == [1]
    assert waited >= 0.05


def test_requests_arriving_during_a_run_form_the_next_batch():
    release = threading.Event()
    calls: list = []

    def run(batch):
        calls.append(list(batch))
        if len(calls) == 1:
            release.wait(timeout=10)
        return [x * 10 for x in batch]

    batcher = RequestBatcher(run, max_items=10, max_wait_s=0.0)

    async def main():
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)  # the first batch [1] is running now
        later = [asyncio.ensure_future(batcher.submit(x)) for x in (2, 3, 4)]
        await asyncio.sleep(0.05)
        release.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(main())
    assert first == 10 and later == [20, 30, 40]
    assert calls == [[1], [2, 3, 4]]


def test_a_failing_batch_fails_its_callers_and_the_batcher_keeps_serving():
    def run(batch):
        if "bad" in batch:
            raise ValueError("a broken image")
        return [x.upper() for x in batch]

    batcher = RequestBatcher(run, max_items=2, max_wait_s=0.05)

    async def main():
        bad = await asyncio.gather(batcher.submit("bad"), batcher.submit("ok"), return_exceptions=True)
        return bad, await batcher.submit("fine")

    bad, fine = asyncio.run(main())
    assert isinstance(bad[0], ValueError) and isinstance(bad[1], ValueError)
    assert fine == "FINE"


@pytest.mark.parametrize(("max_items", "max_wait_s"), [(0, 1.0), (4, -1.0)])
def test_bad_limits_are_refused(max_items, max_wait_s):
    with pytest.raises(ValueError, match="must be"):
        RequestBatcher(lambda b: b, max_items=max_items, max_wait_s=max_wait_s)
