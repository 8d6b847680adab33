"""EngineBackend on vLLM's in-process ``AsyncLLM`` (DELTA outputs).

Acceptance is ``AsyncLLM.add_request``: vLLM's own input processing (tokenization, length and
logprob checks, grammar compilation) runs there, so everything vLLM can refuse is refused
before acceptance as INVALID_ARGUMENT. The output collector is then drained directly.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Sequence
from functools import cached_property

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.kv_publishers import ZmqKvEvents
from openengine_adapters.engine_kit.sessions import SessionTable
from openengine_adapters.errors import EngineFailure, RequestRejected, engine_refused, invalid, not_found, rejected
from openengine_adapters.guided import guide_kwargs
from openengine_adapters.label_scores import label_score_result
from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    ErrorCode,
    Granularity,
    HealthState,
    Modality,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)
from openengine_adapters.vllm import disagg, translate
from openengine_adapters.vllm.media import load_images, media_connector
from openengine_adapters.vllm.stats import StatsCollector

log = logging.getLogger(__name__)



def _client_error(exc: Exception) -> RequestRejected:
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    if isinstance(exc, QueueOverflowError | MaxQueuedTokensError):
        return rejected(ErrorCode.OVERLOADED, f"engine queue is full: {exc}", retry_after_ms=100)
    parameter = getattr(exc, "parameter", None)
    if parameter in ("image", "video", "audio", "multi_modal_data"):  # vLLM names media by modality
        parameter = "media"
    return invalid(f"{parameter or 'request'}: rejected by vLLM: {exc}")


def _engine_failure(exc: BaseException) -> EngineFailure:
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        return EngineFailure(ErrorCode.INTERNAL, "the vLLM engine died")
    return EngineFailure(ErrorCode.INTERNAL, f"vLLM error: {type(exc).__name__}: {exc}")


async def _next_output(collector):
    """The request's next RequestOutput (merged deltas if several are waiting); an engine error
    becomes an EngineFailure."""
    try:
        return collector.get_nowait() or await collector.get()
    except (asyncio.CancelledError, EngineFailure):
        raise
    except Exception as exc:
        raise _engine_failure(exc) from None


class VllmBackend(be.EngineBackend):
    """Serve one ``AsyncLLM``. Build it with ``await VllmBackend.create(engine, ...)``."""

    request_extra = translate.REQUEST_EXTRA

    def __init__(self, engine, supported_tasks: Sequence[str], *, role: EngineRole,
                 served_model_names: Sequence[str] = (), stats: StatsCollector | None = None,
                 version: str = "", owns_engine: bool = False, advertise_kv_events: bool = True) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        self.role = role
        self.stats = stats
        self.version = version
        self.config = engine.vllm_config
        self.model_config = engine.model_config
        self.supported_tasks = frozenset(supported_tasks)
        self.served_model_names = tuple(served_model_names) or self._default_names()
        self._loras: dict[str, object] = {}
        self._subrequests: dict[str, list[str]] = {}  # task request id -> its engine request ids
        self.connector = disagg.Connector.from_config(self.config.kv_transfer_config)
        if problem := disagg.role_problem(role, self.config.kv_transfer_config):
            raise ValueError(problem)
        self.sessions = SessionTable()
        tokenizer = engine.tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        self._card = self._build_card()
        self.kv_publishers = ZmqKvEvents(self._kv_event_publishers(), advertise_kv_events)
        self.features = card.features(self._card, generate="generate" in self.supported_tasks,
                                      runtime_events=stats is not None, kv_events=self.kv_publishers.streams,
                                      kv_event_sources=self.kv_publishers.sources)

    @classmethod
    async def create(cls, engine, **kwargs) -> VllmBackend:
        return cls(engine, await engine.get_supported_tasks(), **kwargs)

    def _default_names(self) -> tuple[str, ...]:
        names = self.model_config.served_model_name
        if isinstance(names, str):
            names = [names]
        return tuple(names or [self.model_config.model])

    # ------------------------------------------------------------------ discovery

    def identity(self) -> be.EngineIdentity:
        pc = self.config.parallel_config
        return be.EngineIdentity(
            engine_name="vllm",
            engine_version=self.version,
            role=self.role,
            parallelism=be.Parallelism(
                tensor_parallel_size=pc.tensor_parallel_size,
                pipeline_parallel_size=pc.pipeline_parallel_size,
                data_parallel_size=pc.data_parallel_size,
                data_parallel_rank=pc.data_parallel_rank,
                decode_context_parallel_size=pc.decode_context_parallel_size,
            ),
            max_loras=self.config.lora_config.max_loras if self.config.lora_config is not None else None,
            extra={"device": self.config.device_config.device_type,
                   "scheduler_policy": self.config.scheduler_config.policy,
                   "prefix_caching": bool(self.config.cache_config.enable_prefix_caching)},
        )

    def models(self) -> list[be.ModelCard]:
        return [self._card]

    def kv_connector(self) -> be.KvConnector | None:
        if self.connector is None:
            return None
        version = None
        if self.connector.name == "NixlConnector":
            from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NIXL_CONNECTOR_VERSION

            version = NIXL_CONNECTOR_VERSION
        return self.connector.info(self.role, version)

    @property
    def max_logprobs(self) -> int:
        return self.model_config.max_logprobs

    def _logprob_support(self, explicit_ids: bool) -> be.LogprobSupport:
        modes = [CandidateMode.TOP_N]
        if explicit_ids:
            modes.append(CandidateMode.TOKEN_IDS)
        if self.max_logprobs == -1:
            modes.append(CandidateMode.ALL)
        return be.LogprobSupport(True, tuple(modes), self.max_logprobs if self.max_logprobs > 0 else None)

    def _build_card(self) -> be.ModelCard:
        mc, sc, cc = self.model_config, self.config.scheduler_config, self.config.cache_config
        generates = "generate" in self.supported_tasks
        gen = None
        if generates:
            prefix = bool(cc.enable_prefix_caching)
            gen = be.GenerationSupport(
                prompt_logprobs=self._logprob_support(explicit_ids=False),
                output_logprobs=self._logprob_support(explicit_ids=True),
                guided_decoding=card.guided_support(card.ALL_GUIDED),
                max_num_sequences=sc.max_num_seqs,
                supports_priority=sc.policy == "priority",
                supports_stop_in_output=True,
                supports_cache_salt=prefix,
                supports_prefix_cache_bypass=prefix,
            )
        return be.ModelCard(
            model_id=mc.model,
            served_model_name=self.served_model_names[0],
            served_model_aliases=self.served_model_names[1:],
            max_context_length=mc.max_model_len,
            max_output_tokens=mc.max_model_len if generates else None,
            kv_block_size=cc.block_size,
            total_kv_blocks=cc.num_gpu_blocks or None,
            max_running_requests=sc.max_num_seqs,
            max_batched_tokens=sc.max_num_batched_tokens,
            tokenizer_modes=(mc.tokenizer_mode,),
            supports_text_input=not mc.skip_tokenizer_init,
            supports_token_ids_input=True,
            generation=gen,
            supports_lora=self.config.lora_config is not None,
            supports_multimodal=bool(mc.is_multimodal_model),
            tasks=self._task_support() if self.role == EngineRole.AGGREGATED else None,
            extra={"dtype": str(mc.dtype).removeprefix("torch."), "kv_cache_dtype": str(cc.cache_dtype),
                   "max_logprobs": mc.max_logprobs, **({"quantization": mc.quantization} if mc.quantization else {})},
        )

    def _task_support(self) -> be.TaskSupport | None:
        tasks = self.supported_tasks
        lora = self.config.lora_config is not None
        priority = self.config.scheduler_config.policy == "priority"
        embed = classify = score = None
        if "embed" in tasks or "token_embed" in tasks:
            grans = tuple(g for g, t in ((Granularity.SEQUENCE, "embed"), (Granularity.TOKEN, "token_embed"))
                          if t in tasks)
            dim = getattr(self.model_config.hf_config, "hidden_size", None)
            embed = be.EmbedSupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=grans,
                encodings=(EmbeddingEncoding.DENSE,), dimension=dim,
                supports_priority=priority, supports_lora=lora, supports_normalization=True,
                supports_dimension_override=bool(self.model_config.is_matryoshka),
            )
        if "classify" in tasks:
            classify = be.ClassifySupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.PROBABILITIES, ValueSemantics.LOGITS),
                supports_priority=priority, supports_lora=lora,
            )
        if self._num_labels() == 1 and "classify" in tasks:
            score = be.ScoreSupport(  # cross-encoder: one relevance logit per (query, document)
                supported=True, input_types=(TaskInputType.TEXT,), granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.RELEVANCE,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False,
                supports_priority=priority, supports_lora=lora, higher_is_better=True,
            )
        elif "embed" in tasks:
            score = be.ScoreSupport(  # bi-encoder: cosine similarity of the two embeddings
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.SIMILARITY,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False,
                supports_priority=priority, supports_lora=lora, higher_is_better=True,
            )
        elif "generate" in tasks:
            score = card.label_score_support(priority=priority, lora=lora,
                                             max_label_token_ids=translate.MAX_LOGPROB_TOKEN_IDS)
        if embed is classify is score is None:
            return None
        return be.TaskSupport(embed=embed, classify=classify, score=score)

    def _num_labels(self) -> int | None:
        return getattr(self.model_config.hf_config, "num_labels", None)

    async def start(self) -> None:
        await self.kv_publishers.start()

    async def shutdown(self) -> None:
        await self.kv_publishers.stop()
        if self.owns_engine:
            self.engine.shutdown()

    # ------------------------------------------------------------------ KV events

    def _kv_event_publishers(self) -> list:
        """The engine's ZMQ KV-event publishers (one per DP rank), empty unless enabled with zmq."""
        from openengine_adapters.kv_events.sources import PublisherConfig, offset_endpoint

        cfg = getattr(self.config, "kv_events_config", None)
        if cfg is None or not cfg.enable_kv_cache_events or cfg.publisher != "zmq":
            return []
        resolved = getattr(self.engine, "get_kv_event_sources", lambda: {})() or {}
        if not resolved:  # an engine that does not report its resolved publishers
            rank = self.config.parallel_config.data_parallel_rank
            return [PublisherConfig(rank, offset_endpoint(cfg.endpoint, rank),
                                    offset_endpoint(cfg.replay_endpoint, rank), cfg.topic or "",
                                    cfg.buffer_steps, cfg.hwm, cfg.max_queue_size)]
        return [PublisherConfig.from_config(rank, c) for rank, c in sorted(resolved.items())]

    def kv_event_sources(self, ranks: Sequence[int]) -> list[be.KvEventSourceInfo]:
        from vllm.utils.network_utils import get_ip

        return self.kv_publishers.source_info(get_ip())

    def kv_events(self, ranks: Sequence[int], include_snapshot: bool, start_sequence_number: int):
        return self.kv_publishers.subscribe(ranks, include_snapshot, start_sequence_number)

    # ------------------------------------------------------------------ health and load

    async def check_health(self) -> list[be.HealthCheckResult]:
        try:
            await self.engine.check_health()
        except Exception as exc:
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, f"vLLM engine unhealthy: {exc}")]
        return [be.HealthCheckResult("scheduler", HealthState.READY, "vLLM engine core is running"),
                be.HealthCheckResult("model", HealthState.READY, self._card.names[0])]

    def dead(self) -> str | None:
        return "the vLLM engine core died" if self.engine.errored else None

    async def load(self, per_rank: bool) -> be.LoadSnapshot:
        total = self.config.cache_config.num_gpu_blocks
        unfinished = self.engine.get_num_unfinished_requests()
        ranks = dict(self.stats.ranks) if self.stats is not None else {}

        def rank_load(idx: int, r) -> be.RankLoad:
            idle = unfinished == 0
            return be.RankLoad(
                data_parallel_rank=idx,
                running_requests=0 if idle else r.running,
                queued_requests=0 if idle else r.waiting,
                used_kv_blocks=round(r.kv_cache_usage * total) if total else None,
                total_kv_blocks=total,
                prefill_batch_size=r.prefill_batch,
                decode_batch_size=r.decode_batch,
            )

        per = [rank_load(i, r) for i, r in sorted(ranks.items())]
        running = sum(r.running_requests for r in per) if per else None
        queued = sum(r.queued_requests for r in per) if per else None
        if unfinished == 0:
            running, queued = 0, 0
        used = sum(r.used_kv_blocks for r in per) if per and total else None
        return be.LoadSnapshot(
            running_requests=running,
            queued_requests=queued,
            used_kv_blocks=used,
            total_kv_blocks=total,
            waiting_tokens=self.engine.get_num_queued_tokens(),
            active_kv_sessions=self.open_kv_sessions(),
            ranks=tuple(per) if per_rank else (),
            attributes={"unfinished_requests": str(unfinished)},
        )

    def runtime_events(self, types):
        wanted = frozenset(types)
        return self.stats.events.subscribe(lambda e: not wanted or e.type in wanted).__aiter__()

    # ------------------------------------------------------------------ generation

    async def validate_generate(self, params: be.GenerateParams) -> None:
        g = params.guided
        if g is not None and g.backend:
            engine_backend = self.config.structured_outputs_config.backend
            if g.backend != engine_backend:
                raise invalid(f"guided.backend: {g.backend!r} differs from the engine's structured-output "
                              f"backend {engine_backend!r} (set per engine, not per request)")
        for i, m in enumerate(params.media):
            if m.modality != Modality.IMAGE:
                raise invalid(f"media[{i}].modality: only images are supported by the vLLM adapter")
        if params.logprobs.output_candidates is not None:
            sel = params.logprobs.output_candidates
            if sel.mode == CandidateMode.TOKEN_IDS and len(sel.token_ids) > translate.MAX_LOGPROB_TOKEN_IDS:
                raise invalid(f"response.output_candidates.token_ids: at most "
                              f"{translate.MAX_LOGPROB_TOKEN_IDS} ids")

    def _sampling_params(self, params: be.GenerateParams, kv_transfer_params: dict | None = None):
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        kw = translate.sampling_kwargs(params)
        if self.role == EngineRole.PREFILL:
            kw["max_tokens"] = 1  # the prefill's one sampled token is recomputed by the decode side
            kv_transfer_params = self.connector.prefill_transfer_params()
        if kv_transfer_params is not None:
            kw["extra_args"] = {**kw.get("extra_args", {}), "kv_transfer_params": kv_transfer_params}
        if params.guided is not None:
            kw["structured_outputs"] = StructuredOutputsParams(**guide_kwargs(params.guided))
        from vllm.exceptions import VLLMClientError

        try:
            return SamplingParams(output_kind=RequestOutputKind.DELTA, **kw)
        except (VLLMClientError, ValueError, TypeError) as exc:
            raise _client_error(exc) from None

    @cached_property
    def _media_connector(self):
        """vLLM's media loading with this engine's media settings (built on the first media)."""
        return media_connector(self.config.model_config)

    def _lora(self, name: str):
        """The LoRARequest for a name; one unloaded meanwhile is refused, never the base model."""
        if not name:
            return None
        request = self._loras.get(name)
        if request is None:
            raise not_found(f"lora_name: adapter {name!r} is not loaded", ErrorCode.MODEL_NOT_FOUND)
        return request

    async def generate(self, params: be.GenerateParams):
        handoff = None
        if params.kv_session is not None:  # a DECODE engine (the service checked the role)
            handoff = self.connector.decode_handoff(params.kv_session)
        sp = self._sampling_params(params, handoff.kv_transfer_params if handoff else None)
        images = await load_images(params.media, self._media_connector) if params.media else None
        prompt = translate.prompt_input(params, {"image": images} if images else None)
        if handoff is not None:
            prompt = await self._render_decode_prompt(prompt, handoff)
            if handoff.key is not None:
                self.sessions.consume(handoff.key)
        try:
            collector = await self._add_request(params, prompt, sp)
        except BaseException:
            if handoff is not None and handoff.key is not None:
                self.sessions.unconsume(handoff.key)
            raise
        if handoff is not None:
            self._transfer_event("decode_started", params)
        return self._stream(params, collector, handoff)

    async def _render_decode_prompt(self, prompt: dict, handoff: disagg.Handoff) -> dict:
        """Tokenize as vLLM will, so the prompt can be checked against the session first."""
        if "prompt_token_ids" in prompt and "multi_modal_data" not in prompt:
            handoff.check_prompt(prompt["prompt_token_ids"])
            return prompt
        try:
            (rendered,) = await self.engine.renderer.render_cmpl_async([prompt])
        except Exception as exc:
            raise _client_error(exc) from None
        handoff.check_prompt(rendered["prompt_token_ids"])
        return rendered

    async def _add_request(self, params: be.GenerateParams, prompt, sp):
        try:
            return await self.engine.add_request(
                params.request_id, prompt, sp,
                lora_request=self._lora(params.lora_name),
                priority=translate.engine_priority(params.priority),
                data_parallel_rank=params.data_parallel_rank,
                trace_headers=params.trace_headers or None,
            )
        except RequestRejected:
            raise
        except asyncio.CancelledError:
            # vLLM may already hold the request: without this it would run on, unseen
            await asyncio.shield(self.engine.abort(params.request_id))
            raise
        except Exception as exc:
            from vllm.exceptions import VLLMClientError

            if isinstance(exc, VLLMClientError | ValueError | TypeError):
                raise _client_error(exc) from None
            raise engine_refused(f"vLLM refused the request: {exc}") from None

    async def _stream(self, params: be.GenerateParams, collector, handoff: disagg.Handoff | None = None):
        if self.role == EngineRole.PREFILL:
            async for chunk in self._prefill_stream(params, collector):
                yield chunk
            return
        translator = translate.OutputTranslator(params, self.eos_token_id)
        if handoff is not None:
            translator.error_code = ErrorCode.KV_TRANSFER_FAILED
            self.sessions.decoding += 1
        finished = False
        try:
            while not finished:
                out = await _next_output(collector)
                finished = out.finished
                if finished and any(c.finish_reason == "abort" for c in out.outputs):
                    # an abort (ours or vLLM's own) ends the stream without a finish: the service
                    # reports CANCELLED for an Abort, its error for a drain, a failure otherwise
                    return
                if handoff is not None and translator.first:
                    failed = finished and any(c.finish_reason == "error" for c in out.outputs)
                    self._transfer_event("decode_failed" if failed else "decode_loaded", params)
                yield translator.chunk(out)
        finally:
            collector.close()
            if handoff is not None:
                self.sessions.decoding -= 1
            if not finished:
                await self.engine.abort(params.request_id)

    async def _prefill_stream(self, params: be.GenerateParams, collector):
        """A prefill ends with one chunk carrying the KV session (its sampled token is dropped;
        prompt tokens and logprobs still go out when asked for)."""
        translator = translate.OutputTranslator(params, self.eos_token_id)
        finished = False
        prompt_ids = None
        try:
            while not finished:
                out = await _next_output(collector)
                finished = out.finished
                prompt_ids = prompt_ids or out.prompt_token_ids
                if finished and any(c.finish_reason == "abort" for c in out.outputs):
                    return
                chunk = translator.chunk(out)  # raises for an engine error finish
                chunk.outputs = []
                if finished:
                    try:
                        session = self.connector.session(params.request_id, out.kv_transfer_params,
                                                         prompt_ids or (), params.data_parallel_rank or 0)
                    except ValueError as exc:
                        raise EngineFailure(ErrorCode.KV_TRANSFER_FAILED, str(exc)) from None
                    self.sessions.hand_off(session.session_id, lease_s=self.connector.lease_s)
                    self._transfer_event("prefill_ready", params, session)
                    chunk.prefill_ready = session
                if finished or chunk.prompt is not None:
                    yield chunk
        finally:
            collector.close()
            if not finished:
                await self.engine.abort(params.request_id)

    def _transfer_event(self, phase: str, params: be.GenerateParams, session: be.KvSession | None = None):
        if self.stats is None:
            return
        attrs = {"phase": phase, "request_id": params.request_id,
                 "transfer_backend": self.connector.transfer_backend}
        session = session or params.kv_session
        if session is not None:
            attrs["kv_session_id"] = session.session_id
        self.stats.emit_transfer(attrs)

    async def release_kv_session(self, session: be.KvSession) -> bool:
        """Forget a handed-off session. vLLM offers no call that frees a finished request's
        blocks: they return to the pool when the decode side has pulled them or the lease
        (kv_lease_duration) runs out."""
        return self.sessions.forget(session.session_id)

    def open_kv_sessions(self) -> int | None:
        if self.role == EngineRole.PREFILL:
            return self.sessions.held()
        if self.role == EngineRole.DECODE:
            return self.sessions.decoding
        return None

    async def abort(self, request_ids: Sequence[str]) -> None:
        ids = list(request_ids)
        for rid in request_ids:
            ids.extend(self._subrequests.get(rid, ()))
        await self.engine.abort(ids)

    async def probe(self, model: str, role: EngineRole) -> None:
        if "generate" not in self.supported_tasks:
            item = be.TaskItem("probe", token_ids=(1,))
            task = "embed" if "embed" in self.supported_tasks else "classify"
            await self._pool([item], task, "openengine-health-probe")
            return
        if role == EngineRole.AGGREGATED:
            await super().probe(model, role)
            return
        # PREFILL/DECODE: one local token, no handoff (a probe session would pin KV blocks
        # for a whole lease); a vLLM engine with a KV connector serves plain requests too
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
        produced = 0
        async for out in self.engine.generate({"prompt_token_ids": [1]}, sp,
                                              f"openengine-health-probe-{uuid.uuid4().hex}"):
            produced += sum(len(c.token_ids) for c in out.outputs)
        if not produced:
            raise RuntimeError("probe produced no token")

    # ------------------------------------------------------------------ LoRA

    async def load_lora(self, adapter: be.LoraAdapterInfo) -> None:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(adapter.lora_name, adapter.lora_id, adapter.source_path)
        try:
            ok = await self.engine.add_lora(request)
        except Exception as exc:
            raise invalid(f"adapter.source_path: vLLM could not load the adapter: {exc}") from None
        if not ok:
            raise invalid("adapter: vLLM refused to load the adapter")
        self._loras[adapter.lora_name] = request

    async def unload_lora(self, adapter: be.LoraAdapterInfo) -> None:
        await self.engine.remove_lora(adapter.lora_id)
        self._loras.pop(adapter.lora_name, None)

    async def list_loras(self) -> list[be.LoraAdapterInfo]:
        return [be.LoraAdapterInfo(r.lora_int_id, r.lora_name, r.lora_path) for r in self._loras.values()]

    # ------------------------------------------------------------------ tasks

    def _task_prompt(self, item: be.TaskItem) -> dict:
        if item.token_ids is not None:
            return {"prompt_token_ids": list(item.token_ids)}
        return {"prompt": item.text}

    async def _pool(self, items: Sequence[be.TaskItem | dict], task: str, request_id: str, ctx=None,
                    **pooling):
        """Run one pooling request per item concurrently; outputs in item order."""
        from vllm.pooling_params import PoolingParams

        lora = self._lora(ctx.lora_name) if ctx is not None else None
        priority = translate.engine_priority(ctx.priority if ctx is not None else None)
        jobs = []
        for engine_id, item in zip(self._sub_ids(request_id, len(items)), items, strict=True):
            prompt = dict(item) if isinstance(item, dict) else self._task_prompt(item)
            params = PoolingParams(task=task, **pooling)
            if "token_type_ids" in prompt:  # cross-encoder pairs, passed as vLLM's scorer does
                from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids

                params.extra_kwargs = {"compressed_token_type_ids":
                                       compress_token_type_ids(prompt.pop("token_type_ids"))}
            jobs.append(_final(self.engine.encode(prompt, params, engine_id, lora_request=lora,
                                                  priority=priority)))
        try:
            return await asyncio.gather(*jobs)
        finally:
            self._subrequests.pop(request_id, None)

    def _sub_ids(self, request_id: str, count: int) -> list[str]:
        """Engine ids for the items of one task request. vLLM aborts every request sharing an
        external id, so they carry a random part no client id can collide with."""
        salt = uuid.uuid4().hex[:12]
        ids = [f"{request_id}/oe-{salt}-{i}" for i in range(count)]
        self._subrequests[request_id] = ids
        return ids

    async def embed(self, p: be.EmbedParams) -> be.EmbedResult:
        token = p.granularity == Granularity.TOKEN
        kw = {}
        if p.normalize is not None:
            kw["use_activation"] = p.normalize
        if p.dimensions is not None:
            kw["dimensions"] = p.dimensions
        outs = await self._pool(p.inputs, "token_embed" if token else "embed", p.context.request_id,
                                p.context, **kw)
        results, total = [], 0
        for out in outs:
            data = out.outputs.data
            ids = list(out.prompt_token_ids)
            total += len(ids)
            if token:
                rows = data.tolist()
                results.append(be.Embedding(Granularity.TOKEN, be.DenseTensor((len(rows), len(rows[0])),
                                                                                [x for r in rows for x in r]), ids))
            else:
                values = data.tolist()
                results.append(be.Embedding(Granularity.SEQUENCE, be.DenseTensor((len(values),), values)))
        return be.EmbedResult(results, be.TaskUsageData(total, sum(o.num_cached_tokens or 0 for o in outs)))

    def _labels(self) -> list[str]:
        id2label = getattr(self.model_config.hf_config, "id2label", None) or {}
        return [str(id2label[i]) for i in sorted(id2label)] if id2label else []

    async def classify(self, p: be.ClassifyParams) -> be.ClassifyResult:
        logits = p.semantics == ValueSemantics.LOGITS
        outs = await self._pool(p.inputs, "classify", p.context.request_id, p.context,
                                use_activation=not logits)
        labels = self._labels()
        results, total = [], 0
        for out in outs:
            values = out.outputs.data.tolist()
            total += len(out.prompt_token_ids)
            sem = ValueSemantics.LOGITS if logits else ValueSemantics.PROBABILITIES
            results.append(be.Classification(Granularity.SEQUENCE, sem, be.DenseTensor((len(values),), values),
                                             labels if len(labels) == len(values) else ()))
        return be.ClassifyResult(results, be.TaskUsageData(total))

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        if p.label_token_ids:
            return await self._label_token_score(p)
        if self._num_labels() == 1 and "classify" in self.supported_tasks:
            return await self._cross_encoder_score(p)
        return await self._cosine_score(p)

    async def _cross_encoder_score(self, p: be.ScoreParams) -> be.ScoreResult:
        tokenizer = self.engine.tokenizer
        prompts = []
        for g in p.groups:
            for c in g.candidates:
                enc = tokenizer(text=g.query.text, text_pair=c.text)
                prompt = {"prompt_token_ids": enc["input_ids"]}
                if "token_type_ids" in enc:
                    prompt["token_type_ids"] = enc["token_type_ids"]
                prompts.append(prompt)
        outs = await self._pool(prompts, "classify", p.context.request_id, p.context, use_activation=False)
        groups, k, total = [], 0, 0
        for g in p.groups:
            row = []
            for _ in g.candidates:
                value = float(outs[k].outputs.data.reshape(-1)[0])
                total += len(outs[k].prompt_token_ids)
                row.append(be.CandidateScore(be.DenseTensor((1,), [value])))
                k += 1
            groups.append(row)
        return be.ScoreResult(groups, Granularity.SEQUENCE, ValueSemantics.RELEVANCE, ScoreNormalization.NONE,
                              higher_is_better=True, usage=be.TaskUsageData(total))

    async def _cosine_score(self, p: be.ScoreParams) -> be.ScoreResult:
        items = [it for g in p.groups for it in (g.query, *g.candidates)]
        outs = await self._pool(items, "embed", p.context.request_id, p.context)
        vectors = [o.outputs.data.tolist() for o in outs]
        groups, k = [], 0
        for g in p.groups:
            q = vectors[k]
            k += 1
            row = []
            for _ in g.candidates:
                row.append(be.CandidateScore(be.DenseTensor((1,), [_cosine(q, vectors[k])])))
                k += 1
            groups.append(row)
        total = sum(len(o.prompt_token_ids) for o in outs)
        return be.ScoreResult(groups, Granularity.SEQUENCE, ValueSemantics.SIMILARITY, ScoreNormalization.NONE,
                              higher_is_better=True, usage=be.TaskUsageData(total))

    async def _label_token_score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Causal-LM label-token scoring: the next-token log-probabilities of the label tokens
        after query + candidate, from one 1-token generation per pair."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        labels = list(p.label_token_ids)
        tokenizer = self.engine.tokenizer

        def ids(item: be.TaskItem) -> list[int]:
            if item.token_ids is not None:
                return list(item.token_ids)
            return tokenizer.encode(item.text, add_special_tokens=False)

        lora = self._lora(p.context.lora_name)
        priority = translate.engine_priority(p.context.priority)

        async def one(rid: str, prompt_ids: list[int]) -> tuple[list[float], int]:
            sp = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=labels,
                                output_kind=RequestOutputKind.FINAL_ONLY)
            final = await _final(self.engine.generate({"prompt_token_ids": prompt_ids}, sp, rid,
                                                      lora_request=lora, priority=priority))
            position = final.outputs[0].logprobs[0]
            return [position[t].logprob for t in labels], len(prompt_ids)

        prompts, shape = [], []
        for g in p.groups:
            head = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and g.query.text is not None
                    else []) + ids(g.query)
            shape.append(len(g.candidates))
            prompts.extend(head + ids(c) for c in g.candidates)
        engine_ids = self._sub_ids(p.context.request_id, len(prompts))
        try:
            results = await asyncio.gather(*(one(rid, prompt) for rid, prompt in zip(engine_ids, prompts,
                                                                                      strict=True)))
        finally:
            self._subrequests.pop(p.context.request_id, None)
        return label_score_result(p, [values for values, _ in results], sum(used for _, used in results))


async def _final(outputs):
    """The last output of a one-shot vLLM stream (encode, or a FINAL_ONLY generate), with vLLM's
    request errors as INVALID_ARGUMENT and anything else as an engine failure."""
    from vllm.exceptions import VLLMClientError

    last = None
    try:
        async for out in outputs:
            last = out
    except asyncio.CancelledError:
        raise
    except (VLLMClientError, ValueError) as exc:
        raise _client_error(exc) from None
    except Exception as exc:
        raise _engine_failure(exc) from None
    return last


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
