"""Watchdogs: streams whose client stopped reading, and an engine that hangs or dies.

One timer task per server scans every open stream (Generate and KV/runtime subscriptions), so the
per-message cost is two attribute writes (``Watch.sending`` / ``Watch.sent``), not a timer or a
task per message. The design follows TensorRT-LLM's own OpenEngine server
(``tensorrt_llm/grpc/openengine/streaming.py``, ``StallWatchdog``): only the time a message waits
for the client to take it is measured, so a slow engine (nothing to send) never looks like a stalled
client; a stalled stream's engine request is aborted and its registration released by the watchdog
itself, since the stream's generator is suspended in ``yield`` and may never resume to clean up.

- **Stall:** a message pending for ``stall_timeout_s`` ends the stream (``Watch.on_stall``): the
  engine request is aborted, the admission slot (or subscription slot) freed, the RPC cancelled.
- **Hang:** work pending and no engine progress (no chunk for any request, no task finished) for
  ``progress_timeout_s``: Health turns NOT_READY, and every open stream ends with one terminal
  retryable EngineError. The hang is sticky: an idle server is not a recovered engine, so Health
  stays NOT_READY until the engine makes progress again, real output or a probe inference that the
  watchdog keeps running while the engine is hung (docs/lifecycle.md has the state machine).
- **Death:** ``EngineBackend.dead()`` names a reason: the same, at once, for good (the launcher then
  stops the server and exits, ``server.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import ErrorCode

log = logging.getLogger(__name__)


class Watch:
    """One open stream as the watchdog sees it: the task serving it, since when a message has been
    waiting for the client (None: nothing pending), and why it was interrupted."""

    __slots__ = ("task", "pending_since", "on_stall", "failure")

    def __init__(self, on_stall: Callable[[], None] | None = None) -> None:
        self.task = asyncio.current_task()
        self.pending_since: float | None = None
        self.on_stall = on_stall
        self.failure: EngineFailure | None = None

    def interrupt(self, failure: EngineFailure) -> None:
        """End the stream with ``failure`` as its terminal error: its task is woken from whatever it
        awaits (a hung engine), and the stream's own handler turns the cancellation into the error."""
        if self.failure is None and self.task is not None and not self.task.done():
            self.failure = failure
            self.task.cancel()

    def claims(self, task: asyncio.Task | None) -> bool:
        """Whether a CancelledError in ``task`` is this watch's interruption (then it is uncancelled)."""
        return self.failure is not None and task is not None and task.uncancel() == 0


def engine_failure(message: str) -> EngineFailure:
    """The terminal error of streams ended by a hung or dead engine: retryable at once, elsewhere."""
    return EngineFailure(ErrorCode.INTERNAL, message, retryable=True, retry_after_ms=0)


class Watchdog:
    def __init__(self, stall_timeout_s: float, progress_timeout_s: float,
                 pending_work: Callable[[], int], dead: Callable[[], str | None],
                 on_engine_failure: Callable[[EngineFailure], None],
                 on_state_change: Callable[[], None],
                 probe: Callable[[], Awaitable[None]] | None = None, probe_timeout_s: float = 30.0) -> None:
        self.stall_timeout_s = stall_timeout_s
        self.progress_timeout_s = progress_timeout_s
        self.streams: set[Watch] = set()
        self.progress = 0  # bumped by every engine chunk and finished task
        self.stalled_streams = 0  # streams ended because their client stopped reading
        self.hung = False
        self.dead_reason: str | None = None
        self._pending_work = pending_work
        self._dead = dead
        self._on_engine_failure = on_engine_failure
        self._on_state_change = on_state_change
        self._seen_progress = -1
        self._progress_at = time.monotonic()
        self._task: asyncio.Task | None = None
        self._probe = probe  # a minimal inference: while hung, its finishing is the engine's progress
        self.probe_timeout_s = probe_timeout_s
        self._probe_task: asyncio.Task | None = None
        self.probes_started = 0

    @property
    def interval_s(self) -> float:
        spans = [s for s in (self.stall_timeout_s, self.progress_timeout_s) if s > 0]
        return max(0.05, min([1.0] + [s / 4 for s in spans]))

    def watch(self, on_stall: Callable[[], None] | None = None) -> Watch:
        w = Watch(on_stall)
        self.streams.add(w)
        return w

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._probe_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._probe_task = None

    def _keep_probing(self) -> None:
        """While hung, one probe inference at a time: the first that finishes is progress."""
        if self._probe is None or (self._probe_task is not None and not self._probe_task.done()):
            return
        self.probes_started += 1
        self._probe_task = asyncio.ensure_future(self._run_probe())

    async def _run_probe(self) -> None:
        try:
            await asyncio.wait_for(self._probe(), self.probe_timeout_s)
        except Exception as exc:  # TimeoutError included: still hung, the next check probes again
            log.info("probe of the hung engine did not finish: %s", exc or type(exc).__name__)
            await asyncio.sleep(self.interval_s)  # an engine that refuses at once is not probed in a loop
            return
        self.progress += 1

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check(time.monotonic())
            except Exception:  # pragma: no cover - a watchdog bug must not stop the watchdog
                log.exception("watchdog check failed")

    def check(self, now: float) -> None:
        if self.stall_timeout_s > 0:
            for w in [w for w in self.streams if w.pending_since is not None
                      and now - w.pending_since >= self.stall_timeout_s]:
                self.streams.discard(w)
                self.stalled_streams += 1
                log.warning("a client did not take a message for %.0f s: its stream is ended", now - w.pending_since)
                if w.on_stall is not None:
                    w.on_stall()
        hung, failure = self.hung, None
        if self.progress_timeout_s > 0:
            pending = self._pending_work()
            if self.progress != self._seen_progress:  # output, a finished task or probe: the engine works
                self._seen_progress, self._progress_at, hung = self.progress, now, False
            elif not pending and not hung:
                self._progress_at = now  # idle: nothing to wait for (a hung engine stays hung)
            if pending and now - self._progress_at >= self.progress_timeout_s:
                hung = True
                failure = engine_failure(f"the engine made no progress for {now - self._progress_at:.0f} s "
                                         f"with {pending} requests pending")
        dead = self._dead()
        if dead:
            failure = engine_failure(f"the engine died: {dead}")
        changed = (hung, dead) != (self.hung, self.dead_reason)
        if changed:
            (log.error if hung or dead else log.info)(
                "engine %s", f"died: {dead}" if dead else "hung: no progress with work pending" if hung
                else "progress resumed")
        self.hung, self.dead_reason = hung, dead
        if hung and not dead:
            self._keep_probing()
        if failure is not None:
            self._on_engine_failure(failure)
        if changed:
            self._on_state_change()
