"""EngineBackend on SGLang's ``Engine`` and its in-process ``TokenizerManager`` (0.5.x).

Each OpenEngine request becomes ``num_sequences`` SGLang requests (one ``GenerateReqInput`` per
output, ``n`` = 1 each) with rids that cannot prefix one another (SGLang aborts by rid prefix, and
its own ``n > 1`` fans out to sub-rids that aborting the parent does not reach). They are driven
through ``TokenizerManager.generate_request`` on the loop the tokenizer manager is bound to.

Acceptance: SGLang tokenizes and validates inside the first step of ``generate_request``
(``ValueError`` for a prompt beyond the context, a bad sampling value, an unknown LoRA...). So
``generate`` runs every sub-request up to its first output before returning: what SGLang refuses is
refused before acceptance as INVALID_ARGUMENT, and nothing is left running when it is.

SGLang streams cumulative chunks; ``output_mapping.SglangOutputMapper`` turns them into deltas with
per-output offsets, slicing each chunk as it arrives (before the next await).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.sessions import SessionTable, check_seal
from openengine_adapters.errors import (
    EngineFailure,
    engine_refused,
    invalid,
    rejected,
)
from openengine_adapters.kv_events.publishers import ZmqKvEvents
from openengine_adapters.sglang import disagg, load_mapping, output_mapping, pooling, request_mapping
from openengine_adapters.sglang.card import SglangCard, server_arg
from openengine_adapters.sglang.disagg import SglangDisagg
from openengine_adapters.sglang.lifecycle import SglangLifecycle
from openengine_adapters.sglang.load_reading import SNAPSHOT_TIMEOUT_S, LoadReads
from openengine_adapters.sglang.lora import SglangLora
from openengine_adapters.sglang.tasks import SglangTasks
from openengine_adapters.types import (
    EngineRole,
    ErrorCode,
)

log = logging.getLogger(__name__)

ROLES = {"null": EngineRole.AGGREGATED, "prefill": EngineRole.PREFILL, "decode": EngineRole.DECODE}


@dataclass(frozen=True)
class SglangOptions:
    """Adapter settings that SGLang's ``ServerArgs`` does not carry itself."""

    served_model_names: tuple[str, ...] = ()
    max_top_n: int = 20                   # top_logprobs_num cap (prompt and output)
    max_num_sequences: int = 16           # n cap (each output is its own SGLang request)
    max_open_sessions: int = 4096         # handed-off prefill sessions remembered for Abort(kv_session)
    advertise_host: str | None = None     # host put in KV sessions / event sources (else auto)
    runtime_event_poll_s: float = 0.05    # get_loads poll period of SubscribeRuntimeEvents (0 = off)
    advertise_kv_events: bool = True      # False: a private KV-event publisher, bridged but not advertised


class SglangBackend(SglangCard, SglangLora, SglangTasks, SglangLifecycle, SglangDisagg, be.EngineBackend):
    """Serve one ``sglang.srt.entrypoints.engine.Engine`` (created by the caller)."""

    request_extra = request_mapping.REQUEST_EXTRA

    def __init__(self, tokenizer_manager, server_args, scheduler_info: dict | None = None,
                 options: SglangOptions = SglangOptions(), *, version: str = "", engine=None,
                 owns_engine: bool = False) -> None:
        """``tokenizer_manager``/``server_args``/``scheduler_info``: an ``Engine``'s (see
        ``from_engine``) or those of ``sglang serve`` (the plugin)."""
        self.engine = engine
        self.options = options
        self.version = version
        self.owns_engine = owns_engine
        self.tm = tokenizer_manager
        self.load_reads = LoadReads(tokenizer_manager)
        sa = self.server_args = server_args
        self.role = ROLES.get(str(server_arg(sa, "disaggregation_mode", "null")), EngineRole.AGGREGATED)
        self.transfer_backend = str(server_arg(sa, "disaggregation_transfer_backend", "")) if self.role != \
            EngineRole.AGGREGATED else ""
        self.bootstrap_port = int(server_arg(sa, "disaggregation_bootstrap_port", 8998))
        self.page_size = int(server_arg(sa, "page_size", 1))
        self.context_len = int(self.tm.context_len)
        self.is_generation = bool(getattr(self.tm, "is_generation", True))
        self.lora_on = bool(server_arg(sa, "enable_lora", False))
        self.priority_on = bool(server_arg(sa, "enable_priority_scheduling", False))
        self.low_first = bool(server_arg(sa, "schedule_low_priority_values_first", False))
        self.deterministic = bool(server_arg(sa, "enable_deterministic_inference", False))
        self.radix = not bool(server_arg(sa, "disable_radix_cache", False))
        self.grammar_backend = str(server_arg(sa, "grammar_backend", "none"))
        self.pooling = pooling.describe(getattr(self.tm, "model_config", None), self.is_generation)
        if self.pooling.kind is not None and self.radix and self.pooling.architecture in pooling.ENCODER_ONLY:
            log.warning("%s is an encoder-only model served with SGLang's radix cache on: SGLang would reuse "
                        "the KV of a shared prefix (wrong for bidirectional attention, and a crash with "
                        "token type ids); its tasks are not offered until it runs with --disable-radix-cache",
                        self.pooling.architecture)
            self.pooling = pooling.PoolingModel(None, self.pooling.architecture)
        self.dp_size = int(server_arg(sa, "dp_size", 1))
        tokenizer = getattr(self.tm, "tokenizer", None)
        self.tokenizer = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        info = dict(scheduler_info or {})
        self.max_total_tokens = info.get("max_total_num_tokens")
        self.max_running = info.get("max_running_requests") or server_arg(sa, "max_running_requests")
        self._kv_cfg = request_mapping.kv_events_config(server_arg(sa, "kv_events_config"))
        self.kv_publishers = ZmqKvEvents(self._kv_event_publishers(), options.advertise_kv_events)
        self._live: dict[str, list[str]] = {}
        self._dead_reason: str | None = None  # a child process died (the sidecar's SIGQUIT handler)
        self.sessions = SessionTable(options.max_open_sessions)  # prefill: session -> rids; decode: rooms used
        self._loras: dict[str, be.LoraAdapterInfo] = {}
        self._host = options.advertise_host
        self._card = self._build_card()
        self._stats = None
        if self.options.runtime_event_poll_s > 0:
            from openengine_adapters.sglang.stats import LoadPoller

            self._stats = LoadPoller(self.load_reads, self.options.runtime_event_poll_s, self.page_size)
        self.features = card.features(self._card, generate=self.is_generation, runtime_events=self._stats is not None,
                                      kv_events=self.kv_publishers.streams,
                                      kv_event_sources=self.kv_publishers.sources)

    @classmethod
    def from_engine(cls, engine, options: SglangOptions = SglangOptions(), **kwargs) -> SglangBackend:
        result = getattr(engine, "_scheduler_init_result", None)
        infos = getattr(result, "scheduler_infos", None) or [{}]
        return cls(engine.tokenizer_manager, engine.server_args, infos[0], options, engine=engine, **kwargs)

    # ------------------------------------------------------------------ discovery

    def identity(self) -> be.EngineIdentity:
        sa = self.server_args
        return be.EngineIdentity(
            engine_name="sglang", engine_version=self.version, role=self.role,
            parallelism=be.Parallelism(tensor_parallel_size=int(server_arg(sa, "tp_size", 1)),
                                       pipeline_parallel_size=int(server_arg(sa, "pp_size", 1)),
                                       data_parallel_size=self.dp_size,
                                       decode_context_parallel_size=int(server_arg(sa, "dcp_size", 1) or 1)),
            # adapters resident on the device at once: SGLang's LoRA memory pool has one slot per batch entry
            max_loras=int(server_arg(sa, "max_loras_per_batch"))
            if self.lora_on and server_arg(sa, "max_loras_per_batch") else None,
            extra={k: str(v) for k, v in (("device", server_arg(sa, "device")),
                                          ("attention_backend", server_arg(sa, "attention_backend")),
                                          ("schedule_policy", server_arg(sa, "schedule_policy"))) if v},
        )

    def models(self) -> list[be.ModelCard]:
        return [self._card]

    @property
    def host(self) -> str:
        if self._host is None:
            from openengine_adapters.server_config import resolve_advertise_host

            self._host = resolve_advertise_host("0.0.0.0", None)
        return self._host

    # ------------------------------------------------------------------ KV events

    def _kv_event_publishers(self) -> list:
        from openengine_adapters.kv_events.sources import PublisherConfig, offset_endpoint, publisher_binds

        cfg = self._kv_cfg
        if cfg is None:
            return []
        endpoint = cfg["endpoint"]
        bind = cfg.get("bind")
        if bind is not None and bool(bind) != publisher_binds(endpoint):
            raise ValueError(f"kv_events_config: 'bind': {bind} with endpoint {endpoint!r} is not supported by the "
                             "OpenEngine KV-event bridge (use a wildcard endpoint to bind, a host to connect)")
        replay = cfg.get("replay_endpoint")
        return [PublisherConfig(rank, offset_endpoint(endpoint, rank), offset_endpoint(replay, rank),
                                cfg.get("topic") or "", cfg.get("buffer_steps"), cfg.get("hwm"),
                                cfg.get("max_queue_size"))
                for rank in range(self.dp_size)]

    def kv_event_sources(self, ranks: Sequence[int]) -> list[be.KvEventSourceInfo]:
        return self.kv_publishers.source_info(self.host)

    def kv_events(self, ranks: Sequence[int], include_snapshot: bool, start_sequence_number: int):
        return self.kv_publishers.subscribe(ranks, include_snapshot, start_sequence_number)

    def runtime_events(self, types):
        if self._stats is None:
            raise EngineFailure(ErrorCode.INTERNAL, "runtime events are off (runtime_event_poll_s = 0)")
        wanted = set(types)
        return self._stats.events.subscribe(lambda e: not wanted or e.type in wanted).__aiter__()

    # ------------------------------------------------------------------ load

    async def load(self, per_rank: bool) -> be.LoadSnapshot:
        try:
            loads = await self.load_reads.snapshots()
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang get_loads failed: {exc}") from None
        in_flight = sum(len(rids) for rids in self._live.values())  # engine requests (n per OpenEngine one)
        if loads is None:  # a stopped scheduler holds the snapshot's lock: our own counts only
            snap = be.LoadSnapshot(attributes={"engine_load": "unavailable: SGLang's load snapshot stayed "
                                                              f"locked for {SNAPSHOT_TIMEOUT_S:g} s"})
        else:
            snap = load_mapping.with_in_flight(load_mapping.load_snapshot(loads, self.page_size, per_rank), in_flight)
        attrs = dict(snap.attributes)
        attrs["in_flight_requests"] = len(self._live)
        return be.LoadSnapshot(**{**snap.__dict__, "attributes": attrs, "active_kv_sessions": self.open_kv_sessions()})

    # ------------------------------------------------------------------ generation

    # SGLang's decode scheduler takes every request as a KV transfer to wait for (DecodePreallocQueue);
    # only its fake bootstrap host skips the transfer, and then it decodes from KV nobody computed
    local_decode_refusal = ("SGLang's decode mode serves only requests whose KV a prefill server sends "
                            "(--disaggregation-mode decode has no local prefill)")

    async def validate_generate(self, params: be.GenerateParams) -> None:
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            kw = disagg.decode_session(params.kv_session.attributes)
            check_seal(params.kv_session.attributes, params.prompt, params.token_ids)
            if self.transfer_backend == "fake" and kw["bootstrap_host"] != disagg.FAKE_BOOTSTRAP_HOST:
                # SGLang 0.5.23's decode scheduler crashes resolving a real bootstrap address on
                # the fake backend (FakeKVManager has no prefill_info_table)
                raise invalid(f"kv.session.attributes_struct.bootstrap_host: the fake transfer backend takes only "
                              f"SGLang's fake bootstrap host {disagg.FAKE_BOOTSTRAP_HOST}")

    async def generate(self, params: be.GenerateParams):
        from sglang.srt.managers.io_struct import GenerateReqInput

        n = params.sampling.num_sequences
        rids = request_mapping.engine_rids(params.request_id, n)
        rendezvous, session = self._rendezvous(params)
        used = disagg.session_key(rendezvous) if self.role == EngineRole.DECODE and rendezvous else None
        if used is not None:
            self.sessions.consume(used)  # a second decode would pull KV the prefill side released
        try:
            objs = [GenerateReqInput(**request_mapping.request_kwargs(params, rid, i, disagg=rendezvous,
                                                                   low_priority_first=self.low_first))
                    for i, rid in enumerate(rids)]
        except (ValueError, TypeError) as exc:
            if used is not None:
                self.sessions.unconsume(used)
            raise invalid(f"request: rejected by SGLang: {exc}") from None
        gens = [self.tm.generate_request(obj, None) for obj in objs]
        self._live[params.request_id] = rids
        firsts = [asyncio.ensure_future(g.__anext__()) for g in gens]
        try:
            results = await asyncio.gather(*firsts, return_exceptions=True)
        except BaseException:  # cancelled while SGLang was taking the request
            for f in firsts:
                f.cancel()
            await self._close(params.request_id, rids, gens)
            raise
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self._close(params.request_id, rids, gens)
            if used is not None:
                self.sessions.unconsume(used)
            if isinstance(failure, StopAsyncIteration):
                raise rejected(ErrorCode.INTERNAL, "SGLang ended the request without output")
            if isinstance(failure, ValueError | TypeError):
                raise invalid(f"request: rejected by SGLang: {failure}")
            raise engine_refused(f"SGLang refused the request: {failure}")
        return self._stream(params, rids, gens, results, session)

    async def _stream(self, params: be.GenerateParams, rids: list[str], gens: list, firsts: list, session):
        decode = self._decode if self.tokenizer is not None else None
        mappers = [output_mapping.SglangOutputMapper(params, i, self.eos_token_id, decode) for i in range(len(rids))]
        reasoning = [0] * len(rids)
        first = True
        queue: asyncio.Queue | None = None
        pumps: list[asyncio.Task] = []

        def convert(i: int, out: dict, chunk: be.GenerationChunk) -> None:
            """Slice one cumulative chunk of output i into ``chunk`` (synchronously: SGLang may
            mutate the chunk's lists once we await)."""
            nonlocal first
            meta = out["meta_info"]
            if first:
                first = False
                chunk.prompt_tokens = meta.get("prompt_tokens")
                if params.logprobs.prompt:
                    chunk.prompt = output_mapping.prompt_tokens(params, meta)
            if i == 0 and meta.get("cached_tokens") is not None:
                chunk.cached_prompt_tokens = meta["cached_tokens"]
            if meta.get("reasoning_tokens") is not None:
                reasoning[i] = meta["reasoning_tokens"]
                chunk.reasoning_tokens = sum(reasoning)
            delta = mappers[i].delta(out)
            if delta is not None:
                chunk.outputs.append(delta)

        def ended() -> bool:
            """All outputs done; raises for an SGLang failure, returns on a plain abort (the
            service reports CANCELLED for an Abort / its error otherwise)."""
            for t in mappers:
                if t.aborted is not None:
                    failure = output_mapping.abort_failure(t.aborted)
                    if failure is not None:
                        raise failure
            return all(t.done for t in mappers)

        finished = False
        try:
            chunk = be.GenerationChunk()
            for i, out in enumerate(firsts):
                convert(i, out, chunk)
            finished = ended()
            if any(t.aborted is not None for t in mappers):
                return
            if finished and self.role == EngineRole.PREFILL:
                chunk.prefill_ready = self._handoff(params, session, rids)
            yield chunk
            if finished:
                return
            if len(gens) == 1:
                async for out in gens[0]:
                    chunk = be.GenerationChunk()
                    convert(0, out, chunk)
                    finished = ended()
                    if mappers[0].aborted is not None:
                        return
                    if finished and self.role == EngineRole.PREFILL:
                        chunk.prefill_ready = self._handoff(params, session, rids)
                    yield chunk
                    if finished:
                        return
            else:
                queue = asyncio.Queue()

                async def pump(i: int, gen) -> None:
                    try:
                        async for out in gen:
                            c = be.GenerationChunk()
                            convert(i, out, c)
                            queue.put_nowait(c)
                    except BaseException as exc:
                        queue.put_nowait(exc)
                        raise
                    finally:
                        queue.put_nowait(None)

                pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens) if not mappers[i].done]
                open_pumps = len(pumps)
                while open_pumps:
                    items = [await queue.get()]
                    while not queue.empty():
                        items.append(queue.get_nowait())
                    chunk = be.GenerationChunk()
                    for item in items:
                        if item is None:
                            open_pumps -= 1
                        elif isinstance(item, BaseException):
                            if isinstance(item, asyncio.CancelledError):
                                continue
                            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang error: {type(item).__name__}: {item}")
                        else:
                            chunk.outputs.extend(item.outputs)
                            for name in ("prompt_tokens", "cached_prompt_tokens", "reasoning_tokens", "prompt"):
                                if getattr(item, name) is not None:
                                    setattr(chunk, name, getattr(item, name))
                    finished = ended()
                    if any(t.aborted is not None for t in mappers):
                        return
                    if chunk.outputs or chunk.prompt is not None:
                        yield chunk
                    if finished:
                        return
        except (asyncio.CancelledError, EngineFailure, GeneratorExit):
            raise
        except ValueError as exc:
            raise EngineFailure(ErrorCode.INVALID_ARGUMENT, f"SGLang refused the request: {exc}") from None
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang error: {type(exc).__name__}: {exc}") from None
        finally:
            for task in pumps:
                task.cancel()
            running = [rid for rid, t in zip(rids, mappers, strict=True) if not t.engine_done]
            await self._close(params.request_id, rids, gens, abort=running, pumps=pumps)

    async def _close(self, request_id: str, rids: list[str], gens: list, abort: Sequence[str] | None = None,
                     pumps: Sequence[asyncio.Task] = ()) -> None:
        """Abort the SGLang requests still running (``abort``; default all), end the pumps, close
        the generators and forget the request."""
        for rid in rids if abort is None else abort:
            self._abort_rid(rid)
        if pumps:
            await asyncio.gather(*pumps, return_exceptions=True)
        for g in gens:
            try:
                await g.aclose()
            except (RuntimeError, Exception):  # still running in a pump being cancelled: it ends itself
                pass
        if self._live.get(request_id) is rids:
            del self._live[request_id]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _abort_rid(self, rid: str) -> None:
        try:
            self.tm.abort_request(rid=rid)
        except Exception:  # the engine is gone: nothing left to stop
            log.debug("SGLang abort of %s failed", rid, exc_info=True)

    async def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            for engine_rid in self._live.get(rid, ()):
                self._abort_rid(engine_rid)
