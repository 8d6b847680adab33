"""Live and recently finished requests: one id namespace for generation and tasks.

The registry is what Abort consults: live ids abort, ids in the bounded finished memory answer
ALREADY_FINISHED, anything else is NOT_FOUND. It also remembers the KV sessions that prefill
requests handed off, so Abort(kv_session) can find them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

import grpc

from openengine_adapters.backend import KvSession
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import ErrorCode


class LiveRequest:
    """A request between acceptance and the engine confirming it ended."""

    __slots__ = ("request_id", "kv_session_id", "abort_code", "abort_message", "on_abort", "ended", "watch",
                 "ending")

    def __init__(self, request_id: str, kv_session_id: str | None) -> None:
        self.request_id = request_id
        self.kv_session_id = kv_session_id
        self.abort_code: ErrorCode | None = None
        self.abort_message = ""
        self.on_abort: Callable[[], None] | None = None
        self.ended = asyncio.Event()
        self.watch = None  # the Generate stream's core.watchdog.Watch (None for tasks)
        self.ending = False  # its clean-up has begun (the stream's own or the stall watchdog's)

    @property
    def aborted(self) -> bool:
        return self.abort_code is not None

    def mark_aborted(self, code: ErrorCode, message: str) -> bool:
        """Record why the request is being stopped; False if it already was."""
        if self.abort_code is not None:
            return False
        self.abort_code, self.abort_message = code, message
        if self.on_abort is not None:
            self.on_abort()
        return True


# What one remembered finished id costs beyond its own bytes (str object, dict slot, list node), roughly.
ENTRY_OVERHEAD_BYTES = 96
FINISHED_ID_BYTES = 8 * 1024 * 1024


class RequestRegistry:
    def __init__(self, finished_capacity: int = 65536, session_capacity: int = 65536,
                 finished_bytes: int = FINISHED_ID_BYTES) -> None:
        """The finished-id memory keeps the newest ids within both ``finished_capacity`` ids and
        ``finished_bytes`` (id bytes plus ENTRY_OVERHEAD_BYTES each): long ids cannot grow it."""
        self._live: dict[str, LiveRequest] = {}
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._finished_capacity = finished_capacity
        self._finished_budget = finished_bytes
        self.finished_bytes = 0
        self._sessions: OrderedDict[str, KvSession] = OrderedDict()
        self._session_capacity = session_capacity

    def __len__(self) -> int:
        return len(self._live)

    def live(self) -> list[LiveRequest]:
        return list(self._live.values())

    def get(self, request_id: str) -> LiveRequest | None:
        return self._live.get(request_id)

    @property
    def finished_count(self) -> int:
        return len(self._finished)

    def is_finished(self, request_id: str) -> bool:
        return request_id in self._finished

    def register(self, request_id: str, kv_session_id: str | None = None) -> LiveRequest:
        if request_id in self._live:
            raise RequestRejected(
                grpc.StatusCode.ALREADY_EXISTS,
                f"request_id: {request_id!r} is already in flight",
                ErrorCode.DUPLICATE_REQUEST,
            )
        entry = LiveRequest(request_id, kv_session_id)
        self._live[request_id] = entry
        return entry

    def discard(self, entry: LiveRequest) -> None:
        """Forget a request that was never accepted (it does not enter the finished memory)."""
        if self._live.get(entry.request_id) is entry:
            del self._live[entry.request_id]

    def complete(self, entry: LiveRequest) -> None:
        """The engine confirmed the request ended: move its id to the finished memory."""
        if self._live.get(entry.request_id) is entry:
            del self._live[entry.request_id]
            rid = entry.request_id
            self.finished_bytes -= self._finished.pop(rid, 0)
            cost = len(rid.encode("utf-8", "replace")) + ENTRY_OVERHEAD_BYTES
            self._finished[rid] = cost
            self.finished_bytes += cost
            while len(self._finished) > self._finished_capacity or self.finished_bytes > self._finished_budget:
                self.finished_bytes -= self._finished.popitem(last=False)[1]
        entry.ended.set()

    def by_session(self, session_id: str) -> list[LiveRequest]:
        return [e for e in self._live.values() if e.kv_session_id == session_id]

    # -- handed-off KV sessions (prefill side) -----------------------------------
    def add_session(self, session: KvSession) -> None:
        self._sessions[session.session_id] = session
        while len(self._sessions) > self._session_capacity:
            self._sessions.popitem(last=False)

    def pop_session(self, session_id: str) -> KvSession | None:
        return self._sessions.pop(session_id, None)

    def sessions(self) -> list[KvSession]:
        return list(self._sessions.values())
