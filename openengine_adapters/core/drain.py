"""Drain: stop taking work, report progress, finish (or abort at the deadline), then COMPLETE.

Events: STARTED with counts, IN_PROGRESS whenever the counts change (and at least every
``heartbeat`` seconds), COMPLETE when no request and no KV session remains. An absent deadline
means none, an explicit 0 means immediate. At the deadline, ``abort_after_deadline`` aborts what
is left (each stream ends with a retryable DRAINING error) and the drain still completes;
without it the drain ends with one terminal DRAINING ``EngineError`` naming what remains. Work
that does not end within ``abort_grace_s`` of its abort, or any failure after acceptance, ends
the drain with one terminal ``EngineError`` (never an unbounded wait, never a broken stream).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from openengine_adapters.core.stream import engine_error
from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import lifecycle_pb2

DrainResponse = lifecycle_pb2.DrainResponse


class Lifecycle:
    """Whether the server takes new work; listeners hear every change (grpc health sync)."""

    def __init__(self) -> None:
        self.accepting = True
        self.listeners: list[Callable[[], None]] = []

    @property
    def draining(self) -> bool:
        return not self.accepting

    def stop_accepting(self) -> None:
        if self.accepting:
            self.accepting = False
            for listener in self.listeners:
                listener()

    def check_accepting(self) -> None:
        if not self.accepting:
            # retryable at once, elsewhere: the same as a stream the drain aborted
            raise RequestRejected(
                grpc.StatusCode.UNAVAILABLE,
                "server is draining and does not accept new requests",
                ErrorCode.DRAINING,
                retry_after_ms=0,
            )


def _progress(state: int, in_flight: int, sessions: int | None, message: str = "") -> DrainResponse:
    resp = DrainResponse(state=state, in_flight_requests=in_flight, message=message)
    if sessions is not None:
        resp.open_kv_sessions = sessions
    return resp


async def run_drain(
    request: lifecycle_pb2.DrainRequest,
    lifecycle: Lifecycle,
    counts: Callable[[], tuple[int, int | None]],
    abort_all: Callable[[ErrorCode, str], Awaitable[None]],
    poll_interval: float = 0.05,
    heartbeat: float = 1.0,
    abort_grace_s: float = 30.0,
) -> AsyncIterator[DrainResponse]:
    if request.stop_accepting_new_requests:
        lifecycle.stop_accepting()
    deadline = None
    if request.HasField("deadline_ms"):
        deadline = time.monotonic() + request.deadline_ms / 1000.0
    in_flight, sessions = counts()
    yield _progress(lifecycle_pb2.DRAIN_STATE_STARTED, in_flight, sessions)
    try:
        async for event in _drain_progress(request, counts, abort_all, deadline, poll_interval, heartbeat,
                                           abort_grace_s):
            yield event
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as exc:  # after acceptance a failure is one terminal EngineError, then OK
        yield DrainResponse(error=engine_error(EngineFailure(ErrorCode.INTERNAL, f"drain failed: {exc}")))


async def _drain_progress(request, counts, abort_all, deadline, poll_interval, heartbeat, abort_grace_s):
    in_flight, sessions = counts()
    last, last_sent, aborted_at = (in_flight, sessions), time.monotonic(), None
    while in_flight or sessions:
        now = time.monotonic()
        if deadline is not None and now >= deadline and aborted_at is None:
            if not request.abort_after_deadline:
                failure = EngineFailure(
                    ErrorCode.DRAINING,
                    f"drain deadline passed with {in_flight} requests in flight"
                    + (f" and {sessions} open KV sessions" if sessions else ""),
                    retryable=True, retry_after_ms=0,
                    details={"in_flight_requests": in_flight, "open_kv_sessions": sessions or 0},
                )
                yield DrainResponse(error=engine_error(failure), in_flight_requests=in_flight)
                return
            aborted_at = now
            await abort_all(ErrorCode.DRAINING, "aborted: drain deadline passed")
        if aborted_at is not None and now - aborted_at > abort_grace_s:
            failure = EngineFailure(
                ErrorCode.INTERNAL,
                f"{in_flight} requests did not end within {abort_grace_s:g} s of being aborted",
                details={"in_flight_requests": in_flight, "open_kv_sessions": sessions or 0})
            yield DrainResponse(error=engine_error(failure), in_flight_requests=in_flight)
            return
        await asyncio.sleep(poll_interval)
        in_flight, sessions = counts()
        now = time.monotonic()
        if (in_flight, sessions) != last or now - last_sent >= heartbeat:
            if in_flight or sessions:
                yield _progress(lifecycle_pb2.DRAIN_STATE_IN_PROGRESS, in_flight, sessions)
            last, last_sent = (in_flight, sessions), now
    yield _progress(lifecycle_pb2.DRAIN_STATE_COMPLETE, 0, sessions,
                    "aborted remaining work at the deadline" if aborted_at is not None else "")
