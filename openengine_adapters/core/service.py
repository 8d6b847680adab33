"""The engine-agnostic core: every RPC of both wire surfaces runs here, on one EngineBackend.

Its methods take and return revision-1 messages, the superset of the two contracts: the
revision-1 surface registers it as is (``wire.revision1``), the v0.1.0 surface translates at its
boundary (``wire.v0_1``). So both surfaces share one request table, admission, drain state and
KV-session table, and every validation rule is written once.

Every call follows validate -> admit -> register -> backend -> assemble. Anything refused before
acceptance is a non-OK status (with the EngineError in the ``openengine-error-bin`` trailer);
after acceptance a stream ends with exactly one terminal event. Cancellation and deadlines stop
the engine's work; a request's admission slot and id are held until the engine confirms the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from openengine_adapters import schema
from openengine_adapters.backend import EngineBackend, GenerateParams, LoadSnapshot, LoraAdapterInfo
from openengine_adapters.core.admission import Admission
from openengine_adapters.core.catalog import ModelCatalog
from openengine_adapters.core.coalescing import MessageBudget, coalesced
from openengine_adapters.core.drain import Lifecycle, run_drain
from openengine_adapters.core.health import HealthReporter
from openengine_adapters.core.registry import LiveRequest, RequestRegistry
from openengine_adapters.core.stream import GenerateStream, engine_error
from openengine_adapters.core.trace_headers import engine_trace_headers
from openengine_adapters.core.watchdog import Watch, Watchdog
from openengine_adapters.errors import (
    ERROR_TRAILER,
    RETRY_AFTER_TRAILER,
    EngineFailure,
    RequestRejected,
    invalid,
    not_found,
    refusal,
    rejected,
)
from openengine_adapters.messages import engine as engine_messages
from openengine_adapters.messages import kv as kv_messages
from openengine_adapters.messages import model as model_messages
from openengine_adapters.messages import observability as observability_messages
from openengine_adapters.security.policy import lora_load_refusal
from openengine_adapters.task_results import classify_response, embed_response, score_response
from openengine_adapters.types import EngineRole, ErrorCode, Feature, RuntimeEventType
from openengine_adapters.v1 import (
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    observability_pb2,
)
from openengine_adapters.validation.extra import parse_extra
from openengine_adapters.validation.generate import EngineContext, parse_generate
from openengine_adapters.validation.ids import check_request_id
from openengine_adapters.validation.kv import WILDCARD_HOSTS, parse_kv_session
from openengine_adapters.validation.leniency import Leniency
from openengine_adapters.validation.tasks import parse_classify, parse_embed, parse_score

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 10.0
ABORT_CONFIRM_S = 2.0  # Abort waits this long for its targets to end before it interrupts their streams
SHUTDOWN_ABORT_GRACE_S = 3.0  # SIGTERM: after the drain grace, how long aborted work may take to end


@dataclass(frozen=True)
class ServiceOptions:
    instance_id: str = ""
    max_in_flight: int | None = None
    retry_after_ms: int = 100
    finished_id_memory: int = 65536
    advertise_host: str = "127.0.0.1"
    probe_timeout_s: float = 30.0
    coalesce_max_delay_ms: float = 0.0  # > 0 turns adaptive coalescing on (core.coalescing)
    coalesce_message_budget: float = 10000.0  # token messages per second before streams group theirs
    lora_root: str | None = None  # LoadLora takes only directories under it (None: any, loopback callers only)
    max_subscriptions: int | None = 64  # open KV + runtime event subscriptions; None = unlimited
    stall_timeout_s: float = 30.0  # a stream whose client takes no message for this long is ended; 0 = off
    progress_timeout_s: float = 120.0  # work pending and no engine progress this long = hung; 0 = off
    ignored_options: str = "refuse"  # v0.1.0: options the engine would ignore are refused or dropped (leniency)


# the native KV-event source's topic: the RPC that serves it (v0.1.0's Control service)
NATIVE_KV_EVENTS_TOPIC = "openengine.v1.Control/SubscribeKvEvents"

def _unimplemented(what: str) -> RequestRejected:
    return RequestRejected(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not implemented by this engine "
                           "adapter", ErrorCode.UNSUPPORTED_FEATURE)


def rejection_trailer(r: RequestRejected) -> tuple[tuple[str, str | bytes], ...]:
    """The machine-readable EngineError trailer (and the retry hint) of a refusal (revision 1's encoding)."""
    err = engine_error(EngineFailure(r.code, r.message, retryable=r.retryable,
                                     retry_after_ms=r.retry_after_ms, details=r.details))
    trailer: list[tuple[str, str | bytes]] = [(ERROR_TRAILER, err.SerializeToString())]
    if r.retry_after_ms is not None:
        trailer.append((RETRY_AFTER_TRAILER, str(r.retry_after_ms)))
    return tuple(trailer)


async def reject(context: grpc.aio.ServicerContext, r: RequestRejected):
    """End the call with the rejection's status plus the machine-readable EngineError trailer."""
    await context.abort(r.status, r.message, trailing_metadata=rejection_trailer(r))


def routable_url(url: str, host: str) -> str:
    """``tcp://*:5558`` -> ``tcp://HOST:5558``: a bind wildcard is never advertised."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    address, colon, port = rest.rpartition(":")
    if colon and address in WILDCARD_HOSTS:
        return f"{scheme}://{host}:{port}"
    return url


def _lora_message(info: LoraAdapterInfo) -> lora_pb2.LoraAdapter:
    return lora_pb2.LoraAdapter(lora_id=info.lora_id, lora_name=info.lora_name,
                                source_path=info.source_path)


def _unary(method):
    """Turn RequestRejected/EngineFailure from a unary handler into the right status."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a backend bug too: a precise status, never a crash
            if not isinstance(exc, RequestRejected | EngineFailure):
                log.exception("%s failed", method.__name__)
            await reject(context, refusal(exc))

    return wrapper


class EngineService:
    def __init__(self, backend: EngineBackend, options: ServiceOptions = ServiceOptions(),
                 admission: Admission | None = None) -> None:
        self.backend = backend
        self.options = options
        self.identity = backend.identity()
        self.catalog = ModelCatalog(backend.models())
        self._check_declarations()
        self.instance_id = options.instance_id or f"{self.identity.engine_name}-{uuid.uuid4().hex[:12]}"
        self.registry = RequestRegistry(options.finished_id_memory)
        self.admission = admission or Admission(options.max_in_flight, options.retry_after_ms)
        self.lifecycle = Lifecycle()
        self.health = HealthReporter(backend, self.lifecycle, self.identity.role,
                                     probe_timeout_s=options.probe_timeout_s)
        # adaptive coalescing of token messages under load (core.coalescing); None = off
        self.coalescer = (MessageBudget(options.coalesce_max_delay_ms / 1000, options.coalesce_message_budget,
                                        chunks=lambda: self.watchdog.progress, streams=lambda: len(self.registry))
                          if options.coalesce_max_delay_ms > 0 else None)
        self._loras: dict[str, LoraAdapterInfo] = {}
        self._lora_lock = asyncio.Lock()
        self._cleanups: set[asyncio.Task] = set()
        self.subscriptions = 0  # open KV and runtime event streams (each costs every engine step)
        self.watchdog = Watchdog(options.stall_timeout_s, options.progress_timeout_s,
                                 pending_work=lambda: len(self.registry), dead=self._engine_dead,
                                 on_engine_failure=self._end_all_streams,
                                 on_state_change=self._engine_state_changed,
                                 probe=self._probe_engine, probe_timeout_s=options.probe_timeout_s)
        self.health.watchdog = self.watchdog
        self.leniency = Leniency(options.ignored_options)  # what the v0.1.0 reading accepts, counted
        self.grpc_port: int | None = None  # the server's bound port, once it has one (native KV-event source)
        self.engine_died = asyncio.Event()  # set once the watchdog finds the engine dead (server.run exits)
        conn = backend.kv_connector()
        self._engine = EngineContext(
            role=self.identity.role,
            data_parallel_size=self.identity.parallelism.data_parallel_size or 1,
            loaded_loras=self._loras,
            transfer_backend=conn.transfer_backend if conn is not None else "",
            local_decode_refusal=backend.local_decode_refusal,
        )

    def _check_declarations(self) -> None:
        """A model card may only advertise what the backend implements, within the spec's
        discovery rules (no UNSPECIFIED in lists, limits > 0): a bad card stops start-up."""
        features = self.backend.features
        for card in self.catalog.cards:
            problems = model_messages.card_problems(card)
            if problems:
                raise ValueError(f"model card {card.model_id!r} breaks the contract: {'; '.join(problems)}")
            tasks = card.tasks
            for task, feature in (("embed", Feature.EMBED), ("classify", Feature.CLASSIFY),
                                  ("score", Feature.SCORE)):
                cap = getattr(tasks, task, None) if tasks else None
                if cap is not None and cap.supported and feature not in features:
                    raise ValueError(f"model {card.model_id} advertises {task} without {feature}")
            if card.supports_lora and Feature.LORA not in features:
                raise ValueError(f"model {card.model_id} advertises LoRA without Feature.LORA")

    def _require(self, feature: Feature, what: str) -> None:
        if feature not in self.backend.features:
            raise _unimplemented(what)

    async def start(self) -> None:
        if self.coalescer is not None:
            self.coalescer.start()
        await self.backend.start()
        if Feature.LORA in self.backend.features:
            for adapter in await self.backend.list_loras():
                self._loras[adapter.lora_name] = adapter
        self.watchdog.start()

    def _check_accepting(self) -> None:
        """New work is refused while draining, and while the engine is dead or hung (retryable
        elsewhere): a hung engine takes work again once a probe inference proves it makes progress."""
        self.lifecycle.check_accepting()
        if self.watchdog.dead_reason:
            raise rejected(ErrorCode.INTERNAL, f"the engine died: {self.watchdog.dead_reason}", retry_after_ms=0)
        if self.watchdog.hung:
            raise rejected(ErrorCode.INTERNAL, "the engine is hung (no progress with work pending); it takes work "
                           "again once a probe inference finishes", retry_after_ms=0)

    def _engine_state_changed(self) -> None:
        if self.watchdog.dead_reason:
            self.engine_died.set()
        self._background(self.health.refresh())

    async def _probe_engine(self) -> None:
        """The watchdog's probe of a hung engine: the Health probe of the first model, this role."""
        await self.backend.probe(self.catalog.cards[0].names[0], self.identity.role)

    def _engine_dead(self) -> str | None:
        try:
            return self.backend.dead()
        except Exception as exc:  # a broken hook is a dead engine's symptom, never a crash
            return f"the engine's liveness check failed: {exc}"

    def _end_all_streams(self, failure: EngineFailure) -> None:
        """A hung or dead engine: every request and subscription ends with ``failure`` (retryable)."""
        for entry in self.registry.live():
            entry.mark_aborted(failure.code, failure.message)
        for watch in list(self.watchdog.streams):
            watch.interrupt(failure)

    def _stalled(self, entry: LiveRequest, chunks, watch: Watch) -> None:
        """The client of a Generate stream took no message for the stall time: free the request
        (engine abort, id, admission slot) now and cancel the RPC; the stream's generator, suspended
        in ``yield``, may never run its own clean-up."""
        entry.mark_aborted(ErrorCode.OVERLOADED,
                           f"the client took no message for {self.options.stall_timeout_s:g} s")
        self._background(self._end_request(entry, chunks, engine_running=True))
        if watch.task is not None:
            watch.task.cancel()

    # ------------------------------------------------------------------ generation

    async def Generate(self, request, context, extra: Mapping[str, Any] | None = None,
                       trace_headers: Mapping[str, str] | None = None, lenient: bool = False) -> AsyncIterator:
        """``extra`` (v0.1.0 GenerateRequest.extra) and ``trace_headers`` (W3C Trace Context from
        gRPC metadata) come from the v0.1.0 surface, which has no revision-1 field for them;
        ``lenient`` reads the request as v0.1.0 does (``validation.leniency``)."""
        try:
            params, entry, chunks = await self._accept_generate(request, extra, trace_headers, lenient)
        except Exception as exc:  # a backend bug before acceptance too: a status, never a crash
            if not isinstance(exc, RequestRejected):
                log.exception("Generate %r failed before acceptance", request.request_id)
            await reject(context, refusal(exc))
            return
        assembler = GenerateStream(params, prefill=self.identity.role == EngineRole.PREFILL)
        clean = engine_ended = interrupted = False
        watch = entry.watch = self.watchdog.watch(lambda: self._stalled(entry, chunks, watch))
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

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

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

    def _admit(self, request_id: str, kv_session_id: str | None = None) -> LiveRequest:
        entry = self.registry.register(request_id, kv_session_id)
        try:
            self.admission.acquire()
        except RequestRejected:
            self.registry.discard(entry)
            raise
        return entry

    def _unadmit(self, entry: LiveRequest) -> None:
        self.registry.discard(entry)
        self.admission.release()

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

    # ------------------------------------------------------------------ tasks

    async def _task(self, request, context, parse, call, build, task: str):
        try:
            # no _require here: without the feature no card advertises the task, and the spec
            # answers an unsupported task with FAILED_PRECONDITION (from parse)
            self._check_accepting()
            card, params = parse(request, self.catalog, self._loras)
            entry = self._admit(params.context.request_id)
        except RequestRejected as r:
            await reject(context, r)
        work = asyncio.ensure_future(call(params))
        entry.on_abort = work.cancel
        try:
            result = await work
            self.watchdog.progress += 1
            return build(params, result, getattr(card.tasks, task))
        except asyncio.CancelledError:
            if work.cancelled() and entry.aborted and asyncio.current_task().cancelling() == 0:
                failure = rejected(entry.abort_code, entry.abort_message,
                                   retry_after_ms=None if entry.abort_code == ErrorCode.CANCELLED else 0)
            else:  # the client went away: stop the engine work
                work.cancel()
                raise
        except Exception as exc:
            if not isinstance(exc, RequestRejected | EngineFailure):
                log.exception("%s %s failed in the engine", task, params.context.request_id)
            failure = refusal(exc)
        finally:
            if not work.done():
                work.cancel()
            if work.cancelled() and Feature.ABORT in self.backend.features:
                self._background(self.backend.abort([entry.request_id]))
            self.registry.complete(entry)
            self.admission.release()
        await reject(context, failure)

    async def Embed(self, request, context):
        return await self._task(request, context, parse_embed, self.backend.embed,
                                embed_response, "embed")

    async def Classify(self, request, context):
        return await self._task(request, context, parse_classify,
                                self.backend.classify, classify_response, "classify")

    async def Score(self, request, context):
        return await self._task(request, context, parse_score, self.backend.score,
                                score_response, "score")

    # ------------------------------------------------------------------ discovery

    @_unary
    async def GetEngineInfo(self, request, context):
        return engine_messages.engine_info(
            self.identity, self.instance_id, self.catalog.supported_models,
            self.backend.kv_connector(), schema.SCHEMA_REVISION, schema.MINIMUM_CLIENT_REVISION,
            schema.SCHEMA_RELEASE)

    @_unary
    async def GetModelInfo(self, request: model_pb2.GetModelInfoRequest, context):
        card = self.catalog.resolve(request.model, required=True)
        return model_messages.model_info(card, self.identity.role)

    async def load_snapshot(self, include_per_rank: bool) -> LoadSnapshot:
        """The engine's load, always timestamped, with per-rank rows only when asked for."""
        self._require(Feature.LOAD, "GetLoad")
        snapshot = await self.backend.load(include_per_rank)
        if snapshot.timestamp_unix_nanos is None:
            snapshot = dataclasses.replace(snapshot, timestamp_unix_nanos=time.time_ns())
        if not include_per_rank and snapshot.ranks:
            snapshot = dataclasses.replace(snapshot, ranks=())
        # what the v0.1.0 reading accepted without applying, and the watchdogs' findings, once there are
        # any: the contract's place for them is the attributes map
        wd, extra = self.watchdog, self.leniency.attributes()
        if wd.stalled_streams:
            extra["openengine.stalled_streams_ended"] = wd.stalled_streams
        if wd.hung or wd.dead_reason:
            extra["openengine.engine_hung"] = True
        return dataclasses.replace(snapshot, attributes={**snapshot.attributes, **extra}) if extra else snapshot

    @_unary
    async def GetLoad(self, request: observability_pb2.GetLoadRequest, context):
        return observability_messages.load_info(await self.load_snapshot(request.include_per_rank), self.instance_id)

    # ------------------------------------------------------------------ health, abort, drain

    @_unary
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

    @_unary
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

    # ------------------------------------------------------------------ LoRA

    def _require_lora(self) -> None:
        if not any(card.supports_lora for card in self.catalog.cards):
            raise RequestRejected(grpc.StatusCode.FAILED_PRECONDITION,
                                  "LoRA is not enabled on this engine", ErrorCode.UNSUPPORTED_FEATURE)

    @_unary
    async def LoadLora(self, request: lora_pb2.LoadLoraRequest, context):
        self._require_lora()
        if refusal := lora_load_refusal(self.options.lora_root, context.peer()):
            raise refusal
        a = request.adapter
        if not request.HasField("adapter"):
            raise invalid("adapter: required")
        if a.lora_id <= 0:
            raise invalid("adapter.lora_id: must be positive")
        if not a.lora_name:
            raise invalid("adapter.lora_name: must be non-empty")
        if not os.path.isabs(a.source_path):
            raise invalid("adapter.source_path: must be an absolute path")
        # one directory has one identity however it is spelled (trailing slash, symlink, ..)
        source = os.path.realpath(a.source_path)
        root = self.options.lora_root and os.path.realpath(self.options.lora_root)
        # outside the root, missing, or not a directory: one answer, so it tells nothing about the disk
        if (root and os.path.commonpath((root, source)) != root) or not os.path.isdir(source):
            raise invalid(f"adapter.source_path: {a.source_path!r} is not an adapter directory "
                          + ("under this server's LoRA root (--lora-root)" if root else "visible to the engine"))
        info = LoraAdapterInfo(a.lora_id, a.lora_name, source)
        async with self._lora_lock:
            for other in self._loras.values():
                if other == info:
                    return lora_pb2.LoadLoraResponse(adapter=_lora_message(other), already_loaded=True)
                clash = [name for name, mine, theirs in (
                    ("lora_id", info.lora_id, other.lora_id),
                    ("lora_name", info.lora_name, other.lora_name),
                    ("source_path", info.source_path, other.source_path)) if mine == theirs]
                if clash:
                    raise rejected(
                        ErrorCode.DUPLICATE_REQUEST,  # ALREADY_EXISTS, with the trailer code that maps to it
                        f"adapter: {', '.join(clash)} already used by loaded adapter "
                        f"{other.lora_name!r} (id {other.lora_id}, path {other.source_path!r})")
            await self.backend.load_lora(info)
            self._loras[info.lora_name] = info
        return lora_pb2.LoadLoraResponse(adapter=_lora_message(info), already_loaded=False)

    @_unary
    async def UnloadLora(self, request: lora_pb2.UnloadLoraRequest, context):
        self._require_lora()
        if not request.lora_name:
            raise invalid("lora_name: must be non-empty")
        async with self._lora_lock:
            info = self._loras.get(request.lora_name)
            if info is None:
                raise not_found(f"lora_name: no loaded adapter {request.lora_name!r}",
                                ErrorCode.MODEL_NOT_FOUND)
            await self.backend.unload_lora(info)
            del self._loras[info.lora_name]
        return lora_pb2.UnloadLoraResponse(adapter=_lora_message(info))

    @_unary
    async def ListLoras(self, request, context):
        self._require_lora()
        return lora_pb2.ListLorasResponse(adapters=[
            _lora_message(a) for a in sorted(self._loras.values(), key=lambda a: a.lora_id)])

    # ------------------------------------------------------------------ KV and runtime events

    @_unary
    async def GetKvConnectorInfo(self, request, context):
        return kv_messages.kv_connector_info(self.backend.kv_connector())

    @_unary
    async def GetKvEventSources(self, request: kv_pb2.GetKvEventSourcesRequest, context):
        return self.kv_event_sources(request)

    def kv_event_sources(self, request: kv_pb2.GetKvEventSourcesRequest,
                         native: bool = False) -> kv_pb2.GetKvEventSourcesResponse:
        """The engine's own publishers; with ``native`` (v0.1.0) our ``SubscribeKvEvents`` itself instead,
        one ``grpc``/``protobuf`` source per DP rank it serves ("transport: grpc, zmq"; "Clients should
        prefer SubscribeKvEvents when available"), so a client that discovers sources finds it. One source
        per rank: Dynamo's reader refuses a rank advertised twice (ai-dynamo/dynamo
        lib/sidecar/openengine/src/kv.rs @0cc34d99 ``discover_sources``), so an engine publisher is listed
        there only for a rank the native stream does not serve; revision 1 lists the publishers."""
        native = native and Feature.KV_EVENTS in self.backend.features and self.grpc_port is not None
        if not native:
            self._require(Feature.KV_EVENT_SOURCES, "GetKvEventSources")
        ranks = list(request.data_parallel_ranks)
        resp = kv_pb2.GetKvEventSourcesResponse()
        served: set[int] = set()
        if native:
            for rank in range(self.identity.parallelism.data_parallel_size or 1):
                if not ranks or rank in ranks:
                    served.add(rank)
                    resp.sources.add(transport="grpc", topic=NATIVE_KV_EVENTS_TOPIC, data_parallel_rank=rank,
                                     encoding="protobuf", endpoint_addr=kv_pb2.KvEndpoint(
                                         host=self.options.advertise_host, port=self.grpc_port, protocol="grpc"))
        if Feature.KV_EVENT_SOURCES not in self.backend.features:
            return resp
        for src in self.backend.kv_event_sources(ranks):
            if ranks and src.data_parallel_rank is not None and src.data_parallel_rank not in ranks:
                continue
            if served and (src.data_parallel_rank is None or src.data_parallel_rank in served):
                continue  # the native stream serves this rank (a rank-less publisher: every rank)
            msg = resp.sources.add()
            msg.CopyFrom(kv_messages.kv_event_source(src))
            if msg.endpoint_addr.host in WILDCARD_HOSTS:
                msg.endpoint_addr.host = self.options.advertise_host
            msg.replay_endpoint = routable_url(msg.replay_endpoint, self.options.advertise_host)
        return resp

    async def _event_stream(self, request, context, feature: Feature, what: str,
                            open_stream: Callable[[], AsyncIterator], wrap: Callable,
                            response_type) -> AsyncIterator:
        try:
            self._require(feature, what)
            self._check_accepting()
            limit = self.options.max_subscriptions
            if limit is not None and self.subscriptions >= limit:
                raise rejected(
                    ErrorCode.OVERLOADED,
                    f"subscriptions: {self.subscriptions} open event subscriptions reach the limit of {limit}; "
                    "retry later", retry_after_ms=self.options.retry_after_ms)
            events = open_stream()
        except Exception as exc:
            if not isinstance(exc, RequestRejected | EngineFailure):
                log.exception("%s could not start", what)
            await reject(context, refusal(exc, f"{what} could not start"))
            return
        self.subscriptions += 1
        held = [True]  # the subscription slot, given back once (here or by the stall watchdog)

        def release() -> None:
            if held[0]:
                held[0] = False
                self.subscriptions -= 1

        def on_stall() -> None:  # the client stopped reading: free the slot, end the RPC
            release()
            if watch.task is not None:
                watch.task.cancel()

        watch = self.watchdog.watch(on_stall)
        now = time.monotonic
        try:
            async for item in events:
                watch.pending_since = now()
                yield wrap(item)
                watch.pending_since = None
        except EngineFailure as failure:
            watch.pending_since = now()
            yield response_type(error=engine_error(failure))
        except asyncio.CancelledError:
            if not watch.claims(asyncio.current_task()):
                raise
            watch.pending_since = now()  # a hung or dead engine: one terminal retryable error
            yield response_type(error=engine_error(watch.failure))
        except Exception as exc:
            log.exception("%s stream failed", what)
            yield response_type(error=engine_error(
                EngineFailure(ErrorCode.INTERNAL, f"{what} stream failed: {exc}")))
        finally:
            self.watchdog.streams.discard(watch)
            release()
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    async def SubscribeKvEvents(self, request: kv_pb2.SubscribeKvEventsRequest, context):
        stream = self._event_stream(
            request, context, Feature.KV_EVENTS, "SubscribeKvEvents",
            lambda: self.backend.kv_events(list(request.data_parallel_ranks),
                                           request.include_snapshot, request.start_sequence_number),
            lambda batch: kv_pb2.SubscribeKvEventsResponse(batch=kv_messages.kv_event_batch(batch)),
            kv_pb2.SubscribeKvEventsResponse)
        async for response in stream:
            yield response

    async def SubscribeRuntimeEvents(self, request: observability_pb2.SubscribeRuntimeEventsRequest,
                                     context):
        def open_stream():
            types = []
            for i, t in enumerate(request.types):
                if t == 0 or t not in RuntimeEventType._value2member_map_:
                    raise invalid(f"types[{i}]: {t} is not a runtime event type")
                types.append(RuntimeEventType(t))
            return self.backend.runtime_events(types)

        stream = self._event_stream(
            request, context, Feature.RUNTIME_EVENTS, "SubscribeRuntimeEvents", open_stream,
            lambda ev: observability_pb2.SubscribeRuntimeEventsResponse(
                runtime_event=observability_messages.runtime_event(ev)),
            observability_pb2.SubscribeRuntimeEventsResponse)
        async for response in stream:
            yield response

    # ------------------------------------------------------------------ shutdown

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


