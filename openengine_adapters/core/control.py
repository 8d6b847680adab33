"""Control of running work: Health, Abort, Drain, and the drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from openengine_adapters.core.drain import run_drain
from openengine_adapters.core.live_requests import LiveRequest
from openengine_adapters.core.state import CoreState
from openengine_adapters.errors import EngineFailure, invalid, not_found
from openengine_adapters.types import EngineRole, ErrorCode, Feature
from openengine_adapters.v1 import lifecycle_pb2
from openengine_adapters.validation.kv import parse_kv_session

log = logging.getLogger(__name__)

ABORT_CONFIRM_S = 2.0  # Abort waits this long for its targets to end before it interrupts their streams
SHUTDOWN_ABORT_GRACE_S = 3.0  # SIGTERM: after the drain grace, how long aborted work may take to end


class ControlRpcs(CoreState):
    async def Health(self, request: lifecycle_pb2.HealthRequest, context):
        probe_model = None
        if request.include_inference_probe:
            probe_model = self.catalog.resolve(request.model).names[0]
        elif request.model:
            self.catalog.resolve(request.model)
        if request.role not in EngineRole._value2member_map_:
            raise invalid(f"role: unknown value {request.role}")
        state, checks = await self.health.report(probe_model, EngineRole(request.role))
        resp = lifecycle_pb2.HealthResponse(state=int(state))
        for c in checks:
            resp.checks.add(name=c.name, state=int(c.state), message=c.message)
        return resp

    async def abort_entries(self, entries: list[LiveRequest], code: ErrorCode, message: str,
                            confirm_s: float = ABORT_CONFIRM_S) -> int:
        """Abort ``entries``; the number that really ended. The engine is told to stop them; a stream
        the engine does not end within ``confirm_s`` (a hung engine) is interrupted, ending with its
        terminal event; one that still does not end (its client does not read) is not counted."""
        targets = [e for e in entries if e.mark_aborted(code, message)]
        if not targets:
            return 0
        try:
            await asyncio.wait_for(self.backend.abort([e.request_id for e in targets]), confirm_s)
        except TimeoutError:  # a hung engine: its streams are interrupted below
            log.warning("the engine did not take the abort of %d requests within %g s", len(targets), confirm_s)
        if await self._wait_ended(targets, confirm_s):
            for e in targets:  # a stream still open (its watch still watched), not one in its clean-up
                if not e.ended.is_set() and e.watch in self.watchdog.streams:
                    e.watch.interrupt(EngineFailure(e.abort_code, e.abort_message, retryable=True))
            await self._wait_ended(targets, confirm_s / 4)
        return sum(e.ended.is_set() for e in targets)

    @staticmethod
    async def _wait_ended(entries: list[LiveRequest], timeout: float) -> int:
        """Wait up to ``timeout`` for ``entries`` to end; how many have not."""
        waits = [asyncio.ensure_future(e.ended.wait()) for e in entries if not e.ended.is_set()]
        if waits:
            await asyncio.wait(waits, timeout=timeout)
            for w in waits:
                w.cancel()
        return sum(not e.ended.is_set() for e in entries)

    async def Abort(self, request: lifecycle_pb2.AbortRequest, context):
        self._require(Feature.ABORT, "Abort")
        which = request.WhichOneof("target")
        if which is None:
            raise invalid("target: exactly one of request_id, kv_session or all_requests must be set")
        if which == "all_requests":
            n = await self.abort_entries(self.registry.live(), ErrorCode.CANCELLED,
                                         "aborted by Abort(all_requests)")
            return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ABORTED,
                                               message=f"aborted {n} requests")
        if which == "request_id":
            rid = request.request_id
            if not rid:
                raise invalid("request_id: must be non-empty")
            entry = self.registry.get(rid)
            if entry is not None:
                if entry.aborted:
                    return lifecycle_pb2.AbortResponse(
                        status=lifecycle_pb2.ABORT_STATUS_ABORTED, message="abort already in progress")
                if not await self.abort_entries([entry], ErrorCode.CANCELLED, "aborted by Abort(request_id)"):
                    return lifecycle_pb2.AbortResponse(
                        status=lifecycle_pb2.ABORT_STATUS_ABORTED,
                        message=f"abort requested; the request did not end within {ABORT_CONFIRM_S:g} s")
                return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ABORTED)
            if self.registry.is_finished(rid):
                return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED)
            raise not_found(f"request_id: no request {rid!r}")
        session = parse_kv_session(request.kv_session, "kv_session")
        entries = self.registry.by_session(session.session_id)
        n = await self.abort_entries(entries, ErrorCode.CANCELLED, "aborted by Abort(kv_session)")
        known = self.registry.pop_session(session.session_id)
        released = await self.backend.release_kv_session(known or session)
        if not entries and known is None and not released:
            raise not_found(f"kv_session.session_id: no KV session {session.session_id!r}",
                            ErrorCode.KV_SESSION_NOT_FOUND)
        return lifecycle_pb2.AbortResponse(
            status=lifecycle_pb2.ABORT_STATUS_ABORTED,
            message=f"aborted {n} requests; released session KV: {released or known is not None}")

    def _drain_counts(self) -> tuple[int, int | None]:
        return len(self.registry), self.open_kv_sessions()

    def open_kv_sessions(self) -> int | None:
        return self.backend.open_kv_sessions()

    async def _abort_for_drain(self, code: ErrorCode, message: str) -> None:
        if Feature.ABORT in self.backend.features:
            await self.abort_entries(self.registry.live(), code, message)
        for session in self.registry.sessions():
            self.registry.pop_session(session.session_id)
            await self.backend.release_kv_session(session)

    async def Drain(self, request: lifecycle_pb2.DrainRequest, context):
        async for response in run_drain(request, self.lifecycle, self._drain_counts,
                                        self._abort_for_drain):
            yield response

    async def drain_and_stop(self, grace_s: float) -> None:
        """SIGTERM: stop accepting, let work finish for ``grace_s``, then abort what is left."""
        request = lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True,
                                             deadline_ms=int(grace_s * 1000),
                                             abort_after_deadline=True)
        async for event in run_drain(request, self.lifecycle, self._drain_counts, self._abort_for_drain,
                                     abort_grace_s=SHUTDOWN_ABORT_GRACE_S):
            if event.HasField("error"):
                log.error("drain on shutdown ended with an error: %s", event.error.message)
        if self._cleanups:  # bounded: a hung engine cannot hold the exit
            await asyncio.wait(set(self._cleanups), timeout=SHUTDOWN_ABORT_GRACE_S)
        await self.watchdog.stop()
        if self.coalescer is not None:
            await self.coalescer.stop()

