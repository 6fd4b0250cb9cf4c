"""Batching requests from several callers into one model call, up to a size or a deadline.

A scorer serves explorers and the learner at once; a reward model is far cheaper per image in one
large batch than in many small ones, but a caller should not wait long for partners. So a batch
closes when it holds `max_items` items or when its first request has waited `max_wait_s`,
whichever comes first (the dynamic batching of inference servers such as Triton's
`max_queue_delay_microseconds`). Requests are never split: one larger than `max_items` runs alone.
One batch runs at a time (there is one model); requests arriving meanwhile form the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


class RequestBatcher(Generic[Request, Result]):
    def __init__(self, run: Callable[[list[Request]], Sequence[Result]], *, max_items: int, max_wait_s: float,
                 size: Callable[[Request], int] = lambda _: 1) -> None:
        """`run`: the batch → one result per request, in order (called in a worker thread, one at a
        time); `size`: a request's item count (images), which `max_items` bounds."""
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be non-negative, got {max_wait_s}")
        self.run, self.max_items, self.max_wait_s, self.size = run, max_items, max_wait_s, size
        self.pending: list[tuple[Request, asyncio.Future[Result]]] = []
        self.batch_sizes: list[int] = []  # items per batch run, for metrics and tests
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, request: Request) -> Result:
        """The request's result, once the batch it joined has run (its exception, if `run` raised)."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        future: asyncio.Future[Result] = loop.create_future()
        self.pending.append((request, future))
        self._arrived.set()
        return await future

    def _pending_items(self) -> int:
        return sum(self.size(request) for request, _ in self.pending)

    def _take(self) -> list[tuple[Request, asyncio.Future[Result]]]:
        batch, items = [], 0
        while self.pending:
            n = self.size(self.pending[0][0])
            if batch and items + n > self.max_items:
                break
            batch.append(self.pending.pop(0))
            items += n
        return batch

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.pending:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = loop.time() + self.max_wait_s
            while self._pending_items() < self.max_items and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), timeout=left)
                except TimeoutError:
                    break
            batch = self._take()
            self.batch_sizes.append(sum(self.size(request) for request, _ in batch))
            try:
                results = await asyncio.to_thread(self.run, [request for request, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} requests")
            except Exception as error:  # every caller of the failed batch gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
