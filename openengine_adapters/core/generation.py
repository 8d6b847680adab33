"""Generate: validate -> admit -> register -> backend -> assemble, one token stream per request.

Anything refused before acceptance is raised (the wire answers it with a status and the error
trailer); after acceptance the stream ends with exactly one terminal event. Cancellation and
deadlines stop the engine's work; a request's admission slot and id are held until the engine
confirms the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from openengine_adapters.backend import GenerateParams
from openengine_adapters.core.coalescing import coalesced
from openengine_adapters.core.live_requests import LiveRequest
from openengine_adapters.core.state import CoreState
from openengine_adapters.core.stream import GenerateStream
from openengine_adapters.core.trace_headers import engine_trace_headers
from openengine_adapters.core.watchdog import Watch
from openengine_adapters.errors import EngineFailure, RequestRejected, refusal
from openengine_adapters.types import EngineRole, ErrorCode, Feature
from openengine_adapters.validation.extra import parse_extra
from openengine_adapters.validation.generate import parse_generate
from openengine_adapters.validation.ids import check_request_id

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 10.0  # each step of ending a request (engine abort, closing its stream) is bounded by this


class GenerationRpcs(CoreState):
    async def Generate(self, request, context, extra: Mapping[str, Any] | None = None,
                       trace_headers: Mapping[str, str] | None = None, lenient: bool = False) -> AsyncIterator:
        """``extra`` (v0.1.0 GenerateRequest.extra) and ``trace_headers`` (W3C Trace Context from
        gRPC metadata) come from the v0.1.0 surface, which has no revision-1 field for them;
        ``lenient`` reads the request as v0.1.0 does (``validation.leniency``)."""
        # watched from admission: an engine that dies or hangs while still taking the request (SGLang
        # accepts it on its first output) refuses it retryably, instead of the server's stop cancelling it
        watch = self.watchdog.watch()
        try:
            params, entry, chunks = await self._accept_generate(request, extra, trace_headers, lenient)
        except asyncio.CancelledError:
            self.watchdog.streams.discard(watch)
            if not watch.claims(asyncio.current_task()):
                raise
            raise refusal(watch.failure) from None
        except Exception as exc:  # a backend bug before acceptance too: a status, never a crash
            self.watchdog.streams.discard(watch)
            if not isinstance(exc, RequestRejected):
                log.exception("Generate %r failed before acceptance", request.request_id)
            raise refusal(exc) from exc
        assembler = GenerateStream(params, prefill=self.identity.role == EngineRole.PREFILL)
        clean = engine_ended = interrupted = False
        entry.watch = watch
        watch.on_stall = lambda: self._stalled(entry, chunks, watch)
        now = time.monotonic
        try:
            final: list = []
            try:
                if entry.aborted:  # Abort arrived while the engine was taking the request
                    await self.backend.abort([entry.request_id])
                ended = [False]
                batches = self._batches(entry, chunks, assembler, ended)
                if self.coalescer is not None:
                    batches = coalesced(batches, self.coalescer)
                async with contextlib.aclosing(batches):
                    async for batch in batches:
                        for response in batch:
                            watch.pending_since = now()  # the stall watchdog times the client's read
                            yield response
                        watch.pending_since = None
                engine_ended = ended[0]
            except asyncio.CancelledError:
                if not watch.claims(asyncio.current_task()):
                    raise
                interrupted = True  # a hung or dead engine, or an Abort it did not act on
            except EngineFailure as failure:
                if not assembler.done:
                    final = [assembler.error(failure)]
            except Exception as exc:
                log.exception("request %s failed in the engine", params.request_id)
                if not assembler.done:
                    final = [assembler.error(EngineFailure(ErrorCode.INTERNAL, f"engine error: {exc}"))]
            if not assembler.done and not final:
                if entry.abort_code == ErrorCode.CANCELLED:
                    final = assembler.cancel_remaining(entry.abort_message)
                elif entry.aborted:
                    final = [assembler.error(EngineFailure(
                        entry.abort_code, entry.abort_message, retryable=True, retry_after_ms=0))]
                elif watch.failure is not None:
                    final = [assembler.error(watch.failure)]
                else:
                    final = [assembler.error(assembler.incomplete())]
            for response in final:
                watch.pending_since = now()
                yield response
            clean = True
        finally:
            self.watchdog.streams.discard(watch)
            # the engine is told to stop unless its own stream ended the request
            cleanup = self._end_request(entry, chunks, engine_running=not engine_ended)
            if clean and not interrupted:
                await cleanup
            else:  # cancelled or interrupted: finish off the engine work without holding the stream
                self._background(cleanup)

    async def _batches(self, entry: LiveRequest, chunks, assembler: GenerateStream, ended: list[bool]):
        """The responses of each engine chunk, in order; ``ended[0]`` is set when the engine's own
        stream ended the request (so it need not be told to stop)."""
        watchdog = self.watchdog
        async for chunk in chunks:
            watchdog.progress += 1
            if entry.aborted and entry.abort_code != ErrorCode.CANCELLED:
                return  # a drain abort ends with its retryable error, whatever the engine sent
            if chunk.prefill_ready is not None:
                self.registry.add_session(chunk.prefill_ready)
            batch = assembler.feed(chunk)
            if assembler.done:
                ended[0] = True
                if batch:
                    yield batch
                return
            if batch:
                yield batch
        ended[0] = True

    async def _accept_generate(self, request, extra, trace_headers, lenient: bool = False):
        self._require(Feature.GENERATE, "Generate")
        self._check_accepting()
        check_request_id(request.request_id, "request_id")
        request_id = request.request_id or f"oe-{uuid.uuid4().hex}"
        card = self.catalog.resolve(request.model)
        params: GenerateParams = parse_generate(request, request_id, card, self._engine,
                                                self.leniency if lenient else None)
        trace_headers = engine_trace_headers(trace_headers)  # our RPC span's context when tracing is on
        if extra or trace_headers:
            params = dataclasses.replace(params, extra=parse_extra(extra or {}, self.backend.request_extra),
                                         trace_headers=dict(trace_headers or {}))
        await self.backend.validate_generate(params)
        entry = self._admit(request_id, params.kv_session.session_id if params.kv_session else None)
        try:
            chunks = await self.backend.generate(params)
        except BaseException:
            self._unadmit(entry)
            raise
        return params, entry, chunks

    def _stalled(self, entry: LiveRequest, chunks, watch: Watch) -> None:
        """The client of a Generate stream took no message for the stall time: free the request
        (engine abort, id, admission slot) now and cancel the RPC; the stream's generator, suspended
        in ``yield``, may never run its own clean-up."""
        entry.mark_aborted(ErrorCode.OVERLOADED,
                           f"the client took no message for {self.options.stall_timeout_s:g} s")
        self._background(self._end_request(entry, chunks, engine_running=True))
        if watch.task is not None:
            watch.task.cancel()

    async def _end_request(self, entry: LiveRequest, chunks, engine_running: bool) -> None:
        """Stop the engine work (if it still runs) and close the chunk stream; each step is bounded,
        so a dead engine cannot hold the request's id and admission slot forever. Runs once per
        request (the stream's own clean-up and the stall watchdog's may both ask)."""
        if entry.ending:
            return
        entry.ending = True
        steps = []
        if engine_running and Feature.ABORT in self.backend.features:
            steps.append(lambda: self.backend.abort([entry.request_id]))
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            steps.append(aclose)
        try:
            for step in steps:
                try:
                    await asyncio.wait_for(step(), ABORT_TIMEOUT_S)
                except Exception:
                    log.exception("cleanup of request %s failed", entry.request_id)
        finally:
            self.registry.complete(entry)
            self.admission.release()
