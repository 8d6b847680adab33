"""Fan-out of an event source to many subscribers, each with a bounded queue.

A subscriber that falls ``maxsize`` events behind is cut off with a retryable OVERLOADED
``EngineFailure`` (its stream then ends with one terminal error and gRPC OK); the publisher
never blocks and the other subscribers are unaffected. Publishing is synchronous and cheap, so
an engine's stat logger or a ZMQ reader can call it from its own loop iteration.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import ErrorCode

T = TypeVar("T")


class Subscription(Generic[T]):
    __slots__ = ("_queue", "_maxsize", "_wakeup", "_predicate", "_failure", "_hub")

    def __init__(self, hub: EventHub[T], maxsize: int, predicate: Callable[[T], bool] | None):
        self._hub = hub
        self._queue: deque[T] = deque()
        self._maxsize = maxsize
        self._wakeup = asyncio.Event()
        self._predicate = predicate
        self._failure: EngineFailure | None = None

    def _offer(self, item: T) -> None:
        if self._failure is not None or (self._predicate is not None and not self._predicate(item)):
            return
        if len(self._queue) >= self._maxsize:
            self._fail(EngineFailure(
                ErrorCode.OVERLOADED,
                f"subscriber fell more than {self._maxsize} events behind and was disconnected",
                retryable=True, retry_after_ms=0,
            ))
            return
        self._queue.append(item)
        self._wakeup.set()

    def _fail(self, failure: EngineFailure) -> None:
        self._failure = failure
        self._queue.clear()
        self._wakeup.set()

    def __len__(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        """Leave the hub (idempotent); iteration also does this when it ends."""
        self._hub._subscribers.discard(self)
        self._queue.clear()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                while self._queue:
                    yield self._queue.popleft()
                if self._failure is not None:
                    raise self._failure
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            self.close()


class EventHub(Generic[T]):
    def __init__(self, maxsize: int = 1024) -> None:
        self.maxsize = maxsize
        self._subscribers: set[Subscription[T]] = set()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def subscribe(self, predicate: Callable[[T], bool] | None = None) -> Subscription[T]:
        sub = Subscription(self, self.maxsize, predicate)
        self._subscribers.add(sub)
        return sub

    def publish(self, item: T) -> None:
        for sub in tuple(self._subscribers):
            sub._offer(item)

    def close(self, failure: EngineFailure) -> None:
        """End every subscription with ``failure`` (e.g. the engine stopped)."""
        for sub in tuple(self._subscribers):
            sub._fail(failure)
