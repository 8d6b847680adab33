"""EngineBackend on SGLang's ``Engine`` and its in-process ``TokenizerManager`` (0.5.x).

Each OpenEngine request becomes ``num_sequences`` SGLang requests (one ``GenerateReqInput`` per
output, ``n`` = 1 each) with rids that cannot prefix one another (SGLang aborts by rid prefix, and
its own ``n > 1`` fans out to sub-rids that aborting the parent does not reach). They are driven
through ``TokenizerManager.generate_request`` on the loop the tokenizer manager is bound to.

Acceptance: SGLang tokenizes and validates inside the first step of ``generate_request``
(``ValueError`` for a prompt beyond the context, a bad sampling value, an unknown LoRA...). So
``generate`` runs every sub-request up to its first output before returning: what SGLang refuses is
refused before acceptance as INVALID_ARGUMENT, and nothing is left running when it is.

SGLang streams cumulative chunks; ``translate.OutputTranslator`` turns them into deltas with
per-output offsets, slicing each chunk as it arrives (before the next await).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.kv_publishers import ZmqKvEvents
from openengine_adapters.engine_kit.sessions import SessionTable, check_seal, seal
from openengine_adapters.errors import (
    EngineFailure,
    RequestRejected,
    engine_refused,
    invalid,
    not_found,
    precondition,
    rejected,
    unsupported,
)
from openengine_adapters.label_scores import label_score_result
from openengine_adapters.sglang import pooling, translate
from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    ErrorCode,
    Granularity,
    HealthState,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)

log = logging.getLogger(__name__)

ROLES = {"null": EngineRole.AGGREGATED, "prefill": EngineRole.PREFILL, "decode": EngineRole.DECODE}
BOOTSTRAP_PROTOCOL = "sglang-bootstrap"


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


def _arg(server_args: Any, name: str, default: Any = None) -> Any:
    value = getattr(server_args, name, default)
    return default if value is None else value


class SglangBackend(be.EngineBackend):
    """Serve one ``sglang.srt.entrypoints.engine.Engine`` (created by the caller)."""

    request_extra = translate.REQUEST_EXTRA

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
        sa = self.server_args = server_args
        self.role = ROLES.get(str(_arg(sa, "disaggregation_mode", "null")), EngineRole.AGGREGATED)
        self.transfer_backend = str(_arg(sa, "disaggregation_transfer_backend", "")) if self.role != \
            EngineRole.AGGREGATED else ""
        self.bootstrap_port = int(_arg(sa, "disaggregation_bootstrap_port", 8998))
        self.page_size = int(_arg(sa, "page_size", 1))
        self.context_len = int(self.tm.context_len)
        self.is_generation = bool(getattr(self.tm, "is_generation", True))
        self.lora_on = bool(_arg(sa, "enable_lora", False))
        self.priority_on = bool(_arg(sa, "enable_priority_scheduling", False))
        self.low_first = bool(_arg(sa, "schedule_low_priority_values_first", False))
        self.deterministic = bool(_arg(sa, "enable_deterministic_inference", False))
        self.radix = not bool(_arg(sa, "disable_radix_cache", False))
        self.grammar_backend = str(_arg(sa, "grammar_backend", "none"))
        self.pooling = pooling.describe(getattr(self.tm, "model_config", None), self.is_generation)
        if self.pooling.kind is not None and self.radix and self.pooling.architecture in pooling.ENCODER_ONLY:
            log.warning("%s is an encoder-only model served with SGLang's radix cache on: SGLang would reuse "
                        "the KV of a shared prefix (wrong for bidirectional attention, and a crash with "
                        "token type ids); its tasks are not offered until it runs with --disable-radix-cache",
                        self.pooling.architecture)
            self.pooling = pooling.PoolingModel(None, self.pooling.architecture)
        self.dp_size = int(_arg(sa, "dp_size", 1))
        tokenizer = getattr(self.tm, "tokenizer", None)
        self.tokenizer = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        info = dict(scheduler_info or {})
        self.max_total_tokens = info.get("max_total_num_tokens")
        self.max_running = info.get("max_running_requests") or _arg(sa, "max_running_requests")
        self._kv_cfg = translate.kv_events_config(_arg(sa, "kv_events_config"))
        self.kv_publishers = ZmqKvEvents(self._kv_event_publishers(), options.advertise_kv_events)
        self._live: dict[str, list[str]] = {}
        self.sessions = SessionTable(options.max_open_sessions)  # prefill: session -> rids; decode: rooms used
        self._loras: dict[str, be.LoraAdapterInfo] = {}
        self._host = options.advertise_host
        self._card = self._build_card()
        self._stats = None
        if self.options.runtime_event_poll_s > 0:
            from openengine_adapters.sglang.stats import LoadPoller

            self._stats = LoadPoller(self.tm, self.options.runtime_event_poll_s, self.page_size)
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
            parallelism=be.Parallelism(tensor_parallel_size=int(_arg(sa, "tp_size", 1)),
                                       pipeline_parallel_size=int(_arg(sa, "pp_size", 1)),
                                       data_parallel_size=self.dp_size,
                                       decode_context_parallel_size=int(_arg(sa, "dcp_size", 1) or 1)),
            # adapters resident on the device at once: SGLang's LoRA memory pool has one slot per batch entry
            max_loras=int(_arg(sa, "max_loras_per_batch")) if self.lora_on and _arg(sa, "max_loras_per_batch")
            else None,
            extra={k: str(v) for k, v in (("device", _arg(sa, "device")),
                                          ("attention_backend", _arg(sa, "attention_backend")),
                                          ("schedule_policy", _arg(sa, "schedule_policy"))) if v},
        )

    def models(self) -> list[be.ModelCard]:
        return [self._card]

    def kv_connector(self) -> be.KvConnector | None:
        if self.role == EngineRole.AGGREGATED:
            return None
        endpoints = (be.KvEndpoint(self.host, self.bootstrap_port, BOOTSTRAP_PROTOCOL),) \
            if self.role == EngineRole.PREFILL else ()
        return be.KvConnector(enabled=True, transfer_backend=self.transfer_backend, local_endpoints=endpoints,
                              supported_protocols=(BOOTSTRAP_PROTOCOL,),
                              supports_remote_prefill=self.role == EngineRole.DECODE,
                              supports_decode_pull=self.role == EngineRole.DECODE,
                              supports_abort_cleanup=True, supports_drain=True)

    @property
    def host(self) -> str:
        if self._host is None:
            from openengine_adapters.server import resolve_advertise_host

            self._host = resolve_advertise_host("0.0.0.0", None)
        return self._host

    def _build_card(self) -> be.ModelCard:
        sa = self.server_args
        names = self.options.served_model_names or tuple(
            n for n in (_arg(sa, "served_model_name"), _arg(sa, "model_path")) if n)[:1] or ("model",)
        gen = None
        if self.is_generation:
            top = self.options.max_top_n
            prefill = self.role == EngineRole.PREFILL
            gen = be.GenerationSupport(
                prompt_logprobs=be.LogprobSupport(True, (CandidateMode.TOP_N,), top),
                output_logprobs=be.LogprobSupport(True, (CandidateMode.TOP_N, CandidateMode.TOKEN_IDS), top),
                guided_decoding=card.guided_support(card.ALL_GUIDED if self.grammar_backend != "none" else None),
                max_num_sequences=1 if prefill else self.options.max_num_sequences,
                supports_priority=self.priority_on,
                supports_stop_in_output=True,
                supports_cache_salt=self.radix,
                supports_prefix_cache_bypass=False,  # SGLang has no per-request switch
            )
        tasks = None
        if self.is_generation and self.role == EngineRole.AGGREGATED:
            tasks = be.TaskSupport(score=card.label_score_support())
        elif self.role == EngineRole.AGGREGATED:
            tasks = self._pooling_tasks()
        model_path = str(_arg(sa, "model_path", names[0]))
        return be.ModelCard(
            model_id=model_path, served_model_name=names[0], served_model_aliases=tuple(names[1:]),
            max_context_length=self.context_len,
            max_output_tokens=self.context_len if self.is_generation else None,
            kv_block_size=self.page_size,
            total_kv_blocks=self.max_total_tokens // self.page_size if self.max_total_tokens else None,
            max_running_requests=self.max_running,
            max_batched_tokens=_arg(sa, "chunked_prefill_size") if (_arg(sa, "chunked_prefill_size") or 0) > 0
            else None,
            supports_text_input=self.tokenizer is not None, supports_token_ids_input=True,
            generation=gen, supports_lora=self.lora_on, supports_multimodal=False, tasks=tasks,
            extra={k: str(v) for k, v in (("dtype", _arg(sa, "dtype")), ("kv_cache_dtype", _arg(sa, "kv_cache_dtype")),
                                          ("quantization", _arg(sa, "quantization"))) if v},
        )

    def _pooling_tasks(self) -> be.TaskSupport | None:
        """What an ``--is-embedding`` model offers (see ``pooling``): sequence embeddings (SGLang has
        no token-level ones), sequence classification, native cross-encoder scoring (one label)."""
        m = self.pooling
        if m.kind == "embed":
            return be.TaskSupport(embed=be.EmbedSupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                encodings=(EmbeddingEncoding.DENSE,), dimension=m.hidden_size, supports_priority=False,
                supports_lora=False, supports_normalization=True, supports_dimension_override=m.matryoshka))
        if m.kind != "classify" or m.num_labels < 1:
            return None
        classify = be.ClassifySupport(
            supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
            semantics=m.classify_semantics(), max_output_values_per_item=m.num_labels, supports_priority=False,
            supports_lora=False)
        score = None
        if m.cross_encoder:  # SGLang's rerank: the pair tokenized together, with token type ids
            score = be.ScoreSupport(
                supported=True, input_types=(TaskInputType.TEXT,), granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.RELEVANCE,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False, supports_priority=False,
                supports_lora=False, higher_is_better=True, max_output_values_per_candidate=1)
        return be.TaskSupport(classify=classify, score=score)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.tm.auto_create_handle_loop()
        if self._stats is not None:
            self._stats.start()
        await self.kv_publishers.start()

    async def shutdown(self) -> None:
        if self._stats is not None:
            await self._stats.stop()
        await self.kv_publishers.stop()
        if self.owns_engine and self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    async def check_health(self) -> list[be.HealthCheckResult]:
        """SGLang's ``server_status``: an ``Engine`` leaves it at Starting once started (only the
        HTTP server's warmup sets Up), so Starting counts as up when we own an Engine and as
        STARTING under ``sglang serve``."""
        from sglang.srt.managers.tokenizer_manager import ServerStatus

        status = getattr(self.tm, "server_status", None)
        if getattr(self.tm, "gracefully_exit", False):
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, "SGLang is shutting down")]
        if status == ServerStatus.UnHealthy:
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, "SGLang reports itself unhealthy")]
        if status == ServerStatus.Starting and self.engine is None:
            return [be.HealthCheckResult("scheduler", HealthState.STARTING, "SGLang is warming up")]
        checks = [be.HealthCheckResult("scheduler", HealthState.READY, "SGLang scheduler is up"),
                  be.HealthCheckResult("model", HealthState.READY, self._card.names[0])]
        if getattr(self.tm, "is_pause", False):
            checks.append(be.HealthCheckResult("scheduler", HealthState.DEGRADED, "SGLang generation is paused"))
        return checks

    async def probe(self, model: str, role: EngineRole) -> None:
        """A 1-token inference; PD roles use SGLang's fake bootstrap host (no peer, no transfer),
        as SGLang's own health check does."""
        if not self.is_generation:
            await self._encode([{"input_ids": [1]}], f"openengine-health-probe-{time.monotonic_ns()}")
            return
        if role == EngineRole.AGGREGATED or self.role == EngineRole.AGGREGATED:
            await super().probe(model, role)
            return
        from sglang.srt.managers.io_struct import GenerateReqInput

        rid = translate.engine_rids(f"openengine-health-probe-{time.monotonic_ns()}", 1)[0]
        obj = GenerateReqInput(rid=rid, input_ids=[1], stream=False,
                               sampling_params={"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True},
                               bootstrap_host=translate.FAKE_BOOTSTRAP_HOST, bootstrap_port=self.bootstrap_port,
                               bootstrap_room=translate.new_bootstrap_room())
        last = None
        try:
            async for out in self.tm.generate_request(obj, None):
                last = out
        finally:
            if last is None or last["meta_info"].get("finish_reason") is None:
                self.tm.abort_request(rid=rid)
        reason = (last or {}).get("meta_info", {}).get("finish_reason") or {}
        if reason.get("type") == "abort":
            raise RuntimeError(f"probe aborted: {reason.get('message')}")

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
            loads = await self.tm.get_loads(include=["core"])
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang get_loads failed: {exc}") from None
        snap = translate.load_snapshot(loads, self.page_size, per_rank)
        attrs = dict(snap.attributes)
        attrs["in_flight_requests"] = len(self._live)
        return be.LoadSnapshot(**{**snap.__dict__, "attributes": attrs, "active_kv_sessions": self.open_kv_sessions()})

    # ------------------------------------------------------------------ generation

    async def validate_generate(self, params: be.GenerateParams) -> None:
        if params.sampling.seed is not None and not self.deterministic:
            raise unsupported("sampling.seed: SGLang honours a per-request seed only with "
                              "--enable-deterministic-inference, which this engine runs without")
        g = params.guided
        if g is not None and g.backend and g.backend != self.grammar_backend:
            raise invalid(f"guided.backend: {g.backend!r} differs from SGLang's grammar backend "
                          f"{self.grammar_backend!r} (set per engine, not per request)")
        if len(params.stopping.stop_texts) > translate.MAX_STOP_STRINGS:
            raise invalid(f"stopping.conditions: at most {translate.MAX_STOP_STRINGS} stop strings")
        if params.priority is not None and self.low_first:
            raise invalid("priority: SGLang runs with --schedule-low-priority-values-first, the opposite of "
                          "OpenEngine's ordering")
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            kw = translate.decode_session(params.kv_session.attributes)
            check_seal(params.kv_session.attributes, params.prompt, params.token_ids)
            if self.transfer_backend == "fake" and kw["bootstrap_host"] != translate.FAKE_BOOTSTRAP_HOST:
                # SGLang 0.5.23's decode scheduler crashes resolving a real bootstrap address on
                # the fake backend (FakeKVManager has no prefill_info_table)
                raise invalid(f"kv.session.attributes_struct.bootstrap_host: the fake transfer backend takes only "
                              f"SGLang's fake bootstrap host {translate.FAKE_BOOTSTRAP_HOST}")
        if params.lora_name and params.lora_name not in self._loras:
            raise not_found(f"lora_name: adapter {params.lora_name!r} is not loaded", ErrorCode.MODEL_NOT_FOUND)

    def _disagg(self, params: be.GenerateParams) -> tuple[dict[str, Any] | None, be.KvSession | None]:
        if self.role == EngineRole.PREFILL:
            room = translate.new_bootstrap_room()
            rank = params.data_parallel_rank or 0
            session = be.KvSession(
                session_id=params.request_id, transfer_backend=self.transfer_backend,
                endpoints=(be.KvEndpoint(self.host, self.bootstrap_port, BOOTSTRAP_PROTOCOL),), dp_rank=rank,
                attributes={**translate.encode_session(self.host, self.bootstrap_port, room, rank),
                            **seal(params.prompt, params.token_ids)})
            return {"bootstrap_host": self.host, "bootstrap_port": self.bootstrap_port, "bootstrap_room": room}, session
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            return translate.decode_session(params.kv_session.attributes), None
        return None, None

    async def generate(self, params: be.GenerateParams):
        from sglang.srt.managers.io_struct import GenerateReqInput

        n = params.sampling.num_sequences
        rids = translate.engine_rids(params.request_id, n)
        disagg, session = self._disagg(params)
        used = translate.session_key(disagg) if self.role == EngineRole.DECODE and disagg else None
        if used is not None:
            self.sessions.consume(used)  # a second decode would pull KV the prefill side released
        try:
            prefill_len = 1 if self.role == EngineRole.PREFILL else None  # the prefill side samples one token
            objs = [GenerateReqInput(**translate.request_kwargs(params, rid, i, disagg=disagg,
                                                                max_new_tokens=prefill_len))
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
        translators = [translate.OutputTranslator(params, i, self.eos_token_id, decode) for i in range(len(rids))]
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
                    chunk.prompt = translate.prompt_tokens(params, meta)
            if i == 0 and meta.get("cached_tokens") is not None:
                chunk.cached_prompt_tokens = meta["cached_tokens"]
            if meta.get("reasoning_tokens") is not None:
                reasoning[i] = meta["reasoning_tokens"]
                chunk.reasoning_tokens = sum(reasoning)
            delta = translators[i].delta(out)
            if delta is not None:
                chunk.outputs.append(delta)

        def ended() -> bool:
            """All outputs done; raises for an SGLang failure, returns on a plain abort (the
            service reports CANCELLED for an Abort / its error otherwise)."""
            for t in translators:
                if t.aborted is not None:
                    failure = translate.abort_failure(t.aborted)
                    if failure is not None:
                        raise failure
            return all(t.done for t in translators)

        finished = False
        try:
            chunk = be.GenerationChunk()
            for i, out in enumerate(firsts):
                convert(i, out, chunk)
            finished = ended()
            if any(t.aborted is not None for t in translators):
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
                    if translators[0].aborted is not None:
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

                pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens) if not translators[i].done]
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
                    if any(t.aborted is not None for t in translators):
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
            running = [rid for rid, t in zip(rids, translators, strict=True) if not t.engine_done]
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

    def _handoff(self, params: be.GenerateParams, session: be.KvSession | None, rids: list[str]) -> be.KvSession:
        if session is None:
            raise EngineFailure(ErrorCode.INTERNAL, "prefill finished without a bootstrap session")
        self.sessions.hand_off(session.session_id, rids)
        return session

    async def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            for engine_rid in self._live.get(rid, ()):
                self._abort_rid(engine_rid)

    async def release_kv_session(self, session: be.KvSession) -> bool:
        """Prefill side: SGLang frees the request's KV once the decode side took it; aborting its
        rid stops a transfer still waiting for the decode peer."""
        held, rids = self.sessions.release(session.session_id)
        if not held:
            return False
        for rid in rids:
            self._abort_rid(rid)
        return True

    def open_kv_sessions(self) -> int | None:
        return self.sessions.held() if self.role == EngineRole.PREFILL else None

    # ------------------------------------------------------------------ LoRA

    async def load_lora(self, adapter: be.LoraAdapterInfo) -> None:
        from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput

        try:
            result = await self.tm.load_lora_adapter(
                LoadLoRAAdapterReqInput(lora_name=adapter.lora_name, lora_path=adapter.source_path), None)
        except (ValueError, TypeError, OSError) as exc:
            raise invalid(f"adapter.source_path: SGLang could not load the adapter: {exc}") from None
        if result is not None and getattr(result, "success", True) is False:
            raise invalid(f"adapter: SGLang refused to load the adapter: {getattr(result, 'error_message', '')}")
        self._loras[adapter.lora_name] = adapter

    async def unload_lora(self, adapter: be.LoraAdapterInfo) -> None:
        from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

        result = await self.tm.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=adapter.lora_name), None)
        if result is not None and getattr(result, "success", True) is False:
            raise precondition(f"lora_name: SGLang refused to unload: {getattr(result, 'error_message', '')}")
        self._loras.pop(adapter.lora_name, None)

    async def list_loras(self) -> list[be.LoraAdapterInfo]:
        return list(self._loras.values())

    # ------------------------------------------------------------------ embed / classify / rerank

    async def _encode(self, items: list[dict[str, Any]], request_id: str,
                      dimensions: int | None = None) -> list[dict]:
        """One SGLang ``EmbeddingReqInput`` per item (``text``, ``input_ids`` or a cross-encoder
        ``pair`` [query, document]), run concurrently (SGLang batches them), with rids that cannot
        prefix one another; Abort(request_id) reaches them and a cancelled call aborts them."""
        from sglang.srt.managers.io_struct import EmbeddingReqInput

        rids = translate.engine_rids(request_id, len(items))
        done: set[str] = set()

        async def one(rid: str, item: dict[str, Any]) -> dict:
            pair = "pair" in item  # SGLang takes a [query, document] pair only as a batch of pairs
            kw = {"text": [item["pair"]], "rid": [rid], "is_cross_encoder_request": True} if pair else \
                {**item, "rid": rid}
            out = await self.tm.generate_request(EmbeddingReqInput(dimensions=dimensions, **kw), None).__anext__()
            if pair:
                (out,) = out
            done.add(rid)
            reason = (out.get("meta_info") or {}).get("finish_reason") or {}
            if reason.get("type") == "abort":
                raise translate.abort_failure(reason) or EngineFailure(ErrorCode.CANCELLED, "aborted")
            return out

        self._live[request_id] = rids
        try:
            return list(await asyncio.gather(*(one(r, it) for r, it in zip(rids, items, strict=True))))
        except (RequestRejected, EngineFailure):
            raise
        except ValueError as exc:
            where = "options.dimensions" if dimensions is not None and "dimension" in str(exc).lower() else "inputs"
            raise invalid(f"{where}: rejected by SGLang: {exc}") from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang encode failed: {type(exc).__name__}: {exc}") from None
        finally:
            for rid in rids:
                if rid not in done:
                    self._abort_rid(rid)
            if self._live.get(request_id) is rids:
                del self._live[request_id]

    @staticmethod
    def _item(it: be.TaskItem) -> dict[str, Any]:
        return {"input_ids": list(it.token_ids)} if it.token_ids is not None else {"text": it.text}

    async def embed(self, p: be.EmbedParams) -> be.EmbedResult:
        """SGLang's pooler truncates to ``dimensions`` then L2-normalizes: ``normalize=True`` is
        re-applied here (exact unit norm), ``normalize=False`` cannot be honoured."""
        if p.normalize is False:
            raise invalid(f"options.normalize: false cannot be honoured: SGLang's {self.pooling.architecture} "
                          "pooler returns L2-normalized embeddings and the raw vector is not recoverable")
        outs = await self._encode([self._item(it) for it in p.inputs], p.context.request_id, p.dimensions)
        results, total = [], 0
        for out in outs:
            vec = pooling.values(out)
            if p.normalize:
                vec = pooling.l2_normalize(vec)
            total += int(out["meta_info"].get("prompt_tokens") or 0)
            results.append(be.Embedding(Granularity.SEQUENCE, be.DenseTensor((len(vec),), vec)))
        return be.EmbedResult(results, be.TaskUsageData(total))

    async def classify(self, p: be.ClassifyParams) -> be.ClassifyResult:
        """SGLang returns the head's raw logits; PROBABILITIES (the default) is softmax across the
        labels, or a sigmoid per label for one label / multi-label models."""
        m = self.pooling
        semantics = p.semantics or m.classify_semantics()[0]
        outs = await self._encode([self._item(it) for it in p.inputs], p.context.request_id)
        results, total = [], 0
        for out in outs:
            vals = pooling.values(out)
            if semantics == ValueSemantics.PROBABILITIES:
                vals = pooling.probabilities(vals, sigmoid=m.num_labels == 1 or m.multi_label)
            total += int(out["meta_info"].get("prompt_tokens") or 0)
            labels = m.labels if len(m.labels) == len(vals) else ()
            results.append(be.Classification(Granularity.SEQUENCE, semantics, be.DenseTensor((len(vals),), vals),
                                             labels))
        return be.ClassifyResult(results, be.TaskUsageData(total))

    async def _rerank(self, p: be.ScoreParams) -> be.ScoreResult:
        """Cross-encoder relevance: SGLang's rerank path (``is_cross_encoder_request``: query and
        document tokenized as one pair with token type ids), the head's logit per pair."""
        pairs = [{"pair": [g.query.text, c.text]} for g in p.groups for c in g.candidates]
        outs = await self._encode(pairs, p.context.request_id)
        groups, k, total = [], 0, 0
        for g in p.groups:
            row = []
            for _ in g.candidates:
                (value,) = pooling.values(outs[k])
                total += int(outs[k]["meta_info"].get("prompt_tokens") or 0)
                row.append(be.CandidateScore(be.DenseTensor((1,), [value])))
                k += 1
            groups.append(row)
        return be.ScoreResult(groups, Granularity.SEQUENCE, ValueSemantics.RELEVANCE, ScoreNormalization.NONE,
                              higher_is_better=True, usage=be.TaskUsageData(total))

    # ------------------------------------------------------------------ score

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        if not self.is_generation:
            return await self._rerank(p)  # the card offers only native scoring then
        return await self._label_score(p)

    async def _label_score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Label-token scoring with SGLang's ``async_score``: the next-token log-probabilities of
        the label tokens after query + candidate (SGLang's ``token_logprobs``), softmaxed across
        the labels on request by the shared ``label_score_result``."""
        labels = list(p.label_token_ids)  # non-empty: the card declares native_scoring=False
        per_pair: list[list[float]] = []
        total = 0
        for g in p.groups:
            if g.query.token_ids is not None:
                query: Any = list(g.query.token_ids)
                items: Any = [list(c.token_ids) if c.token_ids is not None else self._ids(c.text) for c in g.candidates]
            else:
                query = g.query.text
                items = [c.text if c.text is not None else self.tokenizer.decode(list(c.token_ids))
                         for c in g.candidates]
            try:
                result = await self.tm.score_request(query=query, items=items, label_token_ids=labels,
                                                     apply_softmax=False, return_token_logprobs=True, request=None)
            except ValueError as exc:
                raise invalid(f"groups: rejected by SGLang: {exc}") from None
            except Exception as exc:
                raise EngineFailure(ErrorCode.INTERNAL, f"SGLang score failed: {exc}") from None
            if result.token_logprobs is None or len(result.token_logprobs) != len(g.candidates):
                raise EngineFailure(ErrorCode.INTERNAL, f"SGLang returned no label logprobs for group {g.group_id!r}")
            per_pair.extend([float(x) for x in row] for row in result.token_logprobs)
            total += int(result.prompt_tokens or 0)
        return label_score_result(p, per_pair, total)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
