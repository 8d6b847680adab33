"""EngineBackend on vLLM's in-process ``AsyncLLM`` (DELTA outputs).

Acceptance is ``AsyncLLM.add_request``: vLLM's own input processing (tokenization, length and
logprob checks, grammar compilation) runs there, so everything vLLM can refuse is refused
before acceptance as INVALID_ARGUMENT. The output collector is then drained directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Sequence
from functools import cached_property

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.guided_kwargs import guide_kwargs
from openengine_adapters.engine_kit.sessions import SessionTable
from openengine_adapters.errors import EngineFailure, RequestRejected, engine_refused, invalid, not_found
from openengine_adapters.kv_events.publishers import ZmqKvEvents
from openengine_adapters.types import (
    EngineRole,
    ErrorCode,
    HealthState,
)
from openengine_adapters.vllm import disagg, output_mapping, request_mapping
from openengine_adapters.vllm.card import VllmCard
from openengine_adapters.vllm.errors import client_error, engine_failure
from openengine_adapters.vllm.media import load_images, media_connector
from openengine_adapters.vllm.stats import StatsCollector
from openengine_adapters.vllm.tasks import VllmTasks

log = logging.getLogger(__name__)



async def _next_output(collector):
    """The request's next RequestOutput (merged deltas if several are waiting); an engine error
    becomes an EngineFailure."""
    try:
        return collector.get_nowait() or await collector.get()
    except (asyncio.CancelledError, EngineFailure):
        raise
    except Exception as exc:
        raise engine_failure(exc) from None


def decode_leg_options_dropped(params: be.GenerateParams) -> be.GenerateParams:
    """A prefill's request without the options only its decode leg applies (v0.1.0 lets a prefill carry
    them, as Dynamo's sidecars send them). vLLM's decode engine recomputes the last prompt token from
    the pulled KV and samples the first output token itself, under the decode request's own output
    logprobs, guided decoding, min_tokens and stops; the prefill's sampled token is dropped
    (``_prefill_stream``), so here they would only cost a grammar compile and a logprob pass."""
    st = params.stopping
    return dataclasses.replace(
        params, guided=None,
        logprobs=dataclasses.replace(params.logprobs, output=False, output_candidates=None),
        stopping=dataclasses.replace(st, min_tokens=None, stop_texts=(), stop_token_ids=(),
                                     include_stop_in_output=None))


class VllmBackend(VllmCard, VllmTasks, be.EngineBackend):
    """Serve one ``AsyncLLM``. Build it with ``await VllmBackend.create(engine, ...)``."""

    request_extra = request_mapping.REQUEST_EXTRA

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

    def _sampling_params(self, params: be.GenerateParams, kv_transfer_params: dict | None = None):
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        if self.role == EngineRole.PREFILL:  # max_tokens is 1 (validation): the decode side recomputes it
            kv_transfer_params = self.connector.prefill_transfer_params()
        kw = request_mapping.sampling_kwargs(params)
        if kv_transfer_params is not None:
            kw["extra_args"] = {**kw.get("extra_args", {}), "kv_transfer_params": kv_transfer_params}
        if params.guided is not None:
            kw["structured_outputs"] = StructuredOutputsParams(**guide_kwargs(params.guided))
        from vllm.exceptions import VLLMClientError

        try:
            return SamplingParams(output_kind=RequestOutputKind.DELTA, **kw)
        except (VLLMClientError, ValueError, TypeError) as exc:
            raise client_error(exc) from None

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
        if self.role == EngineRole.PREFILL:
            params = decode_leg_options_dropped(params)
        handoff = None
        if params.kv_session is not None:  # a DECODE engine (the service checked the role)
            handoff = self.connector.decode_handoff(params.kv_session)
        sp = self._sampling_params(params, handoff.kv_transfer_params if handoff else None)
        images = await load_images(params.media, self._media_connector) if params.media else None
        prompt = request_mapping.prompt_input(params, {"image": images} if images else None)
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
            raise client_error(exc) from None
        handoff.check_prompt(rendered["prompt_token_ids"])
        return rendered

    async def _add_request(self, params: be.GenerateParams, prompt, sp):
        try:
            return await self.engine.add_request(
                params.request_id, prompt, sp,
                lora_request=self._lora(params.lora_name),
                priority=request_mapping.engine_priority(params.priority),
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
                raise client_error(exc) from None
            raise engine_refused(f"vLLM refused the request: {exc}") from None

    async def _stream(self, params: be.GenerateParams, collector, handoff: disagg.Handoff | None = None):
        if self.role == EngineRole.PREFILL:
            async for chunk in self._prefill_stream(params, collector):
                yield chunk
            return
        translator = output_mapping.VllmOutputMapper(params, self.eos_token_id)
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
        translator = output_mapping.VllmOutputMapper(params, self.eos_token_id)
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
