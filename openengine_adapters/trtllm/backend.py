"""EngineBackend on TensorRT-LLM's ``LLM.generate_async(..., streaming=True)`` (1.2.x).

Acceptance is ``generate_async``: it returns a ``RequestOutput`` at once (TensorRT-LLM's own
input checks raise there, and are refused before acceptance as INVALID_ARGUMENT); the stream is
then its async iteration, converted from cumulative outputs to deltas by
``output_mapping.TrtllmOutputMapper``.

TensorRT-LLM has no abort-all, no request-id lookup and no runtime LoRA API, so this backend
keeps its own maps: request id -> ``RequestOutput`` (Abort by id / all / KV session all end in
``RequestOutput.abort()``), handed-off prefill sessions -> their ``RequestOutput``, and a lazy
LoRA registry (see ``load_lora``). Engine stats and KV-cache events are single-consumer queues:
one poller per queue (``start``) is their only reader.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.guided_kwargs import guide_kwargs
from openengine_adapters.engine_kit.sessions import SessionTable, check_seal, seal
from openengine_adapters.errors import EngineFailure, engine_refused, invalid, not_found
from openengine_adapters.trtllm import disagg, output_mapping, request_mapping
from openengine_adapters.trtllm.card import TrtllmCard, llm_arg, model_max_positions
from openengine_adapters.trtllm.handles import abort_handle, is_request_error, iterate
from openengine_adapters.trtllm.kv_event_mapping import KvEventTranslator
from openengine_adapters.trtllm.lora import LazyLoraRegistry
from openengine_adapters.trtllm.polling import EngineQueuePolling
from openengine_adapters.trtllm.stats import StatsCollector
from openengine_adapters.trtllm.tasks import TrtllmTasks
from openengine_adapters.types import (
    EngineRole,
    ErrorCode,
    HealthState,
)
from openengine_adapters.validation.generate import check_room

log = logging.getLogger(__name__)

# sampling field -> its no-op values: what TensorRT-LLM 1.2's TorchSampler accepts and ignores
# (the card's ignored_options: refused, or dropped under --ignored-options ignore, in validation)
IGNORED_BY_TORCH_SAMPLER = (("repetition_penalty", (1.0,)), ("presence_penalty", (0.0,)),
                            ("frequency_penalty", (0.0,)), ("min_p", (0.0,)), ("seed", ()))


@dataclass(frozen=True)
class TrtllmOptions:
    """Adapter settings that TensorRT-LLM's ``LLM`` does not carry itself."""

    served_model_names: tuple[str, ...] = ()
    role: EngineRole = EngineRole.AGGREGATED
    max_top_n: int = 20                    # top-k logprobs cap (prompt and output)
    max_num_sequences: int | None = None   # n cap; default: the engine's max_batch_size
    max_context_length: int | None = None  # default: LLM args max_seq_len
    poll_timeout_s: float = 0.5            # timeout handed to get_stats_async / get_kv_cache_events_async
    poll_interval_s: float = 0.05          # pause between two polls of an empty queue
    kv_replay_size: int = 4096             # KV batches kept for start_sequence_number replay
    max_open_sessions: int = 4096          # handed-off prefill sessions remembered for Abort(kv_session)


class TrtllmBackend(TrtllmCard, EngineQueuePolling, LazyLoraRegistry, TrtllmTasks, be.EngineBackend):
    """Serve one ``tensorrt_llm.LLM``."""

    def __init__(self, llm, options: TrtllmOptions = TrtllmOptions(), *, version: str = "",
                 owns_engine: bool = False) -> None:
        self.llm = llm
        self.options = options
        self.role = options.role
        self.version = version
        self.owns_engine = owns_engine
        args = getattr(llm, "args", None)
        self.args = args
        self.tokenizer = getattr(llm, "tokenizer", None)
        self.eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        self.max_context = options.max_context_length or llm_arg(args, "max_seq_len") or model_max_positions(llm)
        self.max_batch_size = llm_arg(args, "max_batch_size")
        kv = llm_arg(args, "kv_cache_config")
        self.block_reuse = bool(llm_arg(kv, "enable_block_reuse", default=True))
        self.kv_events_on = int(llm_arg(kv, "event_buffer_max_size", default=0)) > 0
        self.stats_on = bool(llm_arg(args, "enable_iter_perf_stats", default=False))
        self.lora_on = llm_arg(args, "lora_config") is not None
        self.guided_backend = llm_arg(args, "guided_decoding_backend") or ""
        sampler = llm_arg(args, "sampler_type", default="auto")
        self.sampler = str(getattr(sampler, "value", sampler))
        # TorchSampler (sampler_type auto or TorchSampler) ignores these in TensorRT-LLM 1.2; the C++
        # decoder behind TRTLLMSampler applies them
        self.ignored_sampling = () if self.sampler == "TRTLLMSampler" else tuple(
            be.IgnoredOption(name, f"TensorRT-LLM's TorchSampler (sampler_type {self.sampler}) ignores it; serve "
                                   "with sampler_type: TRTLLMSampler to use it", neutral)
            for name, neutral in IGNORED_BY_TORCH_SAMPLER)
        self.attention_dp = bool(llm_arg(args, "enable_attention_dp", default=False))
        self.tp = llm_arg(args, "tensor_parallel_size", default=1)
        self.pp = llm_arg(args, "pipeline_parallel_size", default=1)
        self.transfer_backend = str(llm_arg(args, "cache_transceiver_config", "backend", default="") or "")
        if self.role != EngineRole.AGGREGATED and not self.transfer_backend:
            raise ValueError(f"role {self.role.name} needs cache_transceiver_config (KV transfer backend)")
        if self.role == EngineRole.PREFILL and not llm_arg(args, "disable_overlap_scheduler", default=False):
            # the PyTorch worker refuses every context-only request while the overlap scheduler runs
            # (executor/base_worker.py _enqueue_request): fail at start, not on each request
            raise ValueError("role PREFILL needs disable_overlap_scheduler: true (TensorRT-LLM refuses "
                             "context-only requests with the overlap scheduler on)")
        params = inspect.signature(llm.generate_async).parameters
        self._accepts = frozenset(params)
        self.stats = StatsCollector()
        self.kv = KvEventTranslator(range(self.tp if self.attention_dp else 1), options.kv_replay_size)
        self._live: dict[str, Any] = {}
        self.sessions = SessionTable(options.max_open_sessions)  # prefill: handed off; decode: handoffs used
        self._loras: dict[str, Any] = {}
        self._lora_info: dict[str, be.LoraAdapterInfo] = {}
        self._lora_in_use: Counter[str] = Counter()
        self._lora_ids_used: dict[int, str] = {}
        self._pollers: list[asyncio.Task] = []
        self._poll_error: str | None = None
        self._disagg_field_names: frozenset[str] | None = None
        self._submitted = False  # no request yet: the engine's KV-event queue does not exist
        self._card = self._build_card()
        # KV events come from the engine's own queue (KvEventTranslator), with no publisher to name
        self.features = card.features(self._card, generate=True, runtime_events=self.stats_on,
                                      kv_events=self.kv_events_on)

    # ------------------------------------------------------------------ discovery

    def identity(self) -> be.EngineIdentity:
        lora = llm_arg(self.llm.args, "lora_config")
        max_loras = llm_arg(lora, "max_loras") if lora is not None else None
        return be.EngineIdentity(
            engine_name="tensorrt_llm", engine_version=self.version, role=self.role,
            parallelism=be.Parallelism(tensor_parallel_size=self.tp, pipeline_parallel_size=self.pp,
                                       data_parallel_size=self.tp if self.attention_dp else 1),
            max_loras=int(max_loras) if max_loras else None,  # LoraConfig.max_loras: adapters on the GPU
            extra={k: str(v) for k, v in (("backend", llm_arg(self.llm.args, "backend")),
                                          ("guided_decoding_backend", self.guided_backend)) if v},
        )

    def models(self) -> list[be.ModelCard]:
        return [self._card]

    def kv_connector(self) -> be.KvConnector | None:
        if not self.transfer_backend:
            return None
        return be.KvConnector(enabled=True, transfer_backend=self.transfer_backend,
                              supported_protocols=(self.transfer_backend.lower(),),
                              supports_remote_prefill=self.role == EngineRole.DECODE,
                              # a finished context-only request is gone from the worker: aborting it
                              # frees nothing (executor/base_worker.py abort_request)
                              supports_abort_cleanup=False, supports_drain=True)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.stats_on:
            self._pollers.append(asyncio.ensure_future(self._poll(self.llm.get_stats_async, self._on_stats)))
        if self.kv_events_on:
            self._pollers.append(asyncio.ensure_future(
                self._poll(self.llm.get_kv_cache_events_async, self._on_kv_events)))

    async def shutdown(self) -> None:
        for task in self._pollers:
            task.cancel()
        await asyncio.gather(*self._pollers, return_exceptions=True)
        self._pollers.clear()
        await self.kv.bridge.stop()  # ends KV subscriptions with a retryable DRAINING error
        if self.owns_engine:
            await asyncio.to_thread(self.llm.shutdown)

    async def check_health(self) -> list[be.HealthCheckResult]:
        executor = getattr(self.llm, "_executor", False)
        # LLM.shutdown drops its executor (llmapi/llm.py: self._executor = None)
        if executor is None or getattr(executor, "doing_shutdown", False):
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, "TensorRT-LLM executor is shut down")]
        checks = [be.HealthCheckResult("scheduler", HealthState.READY, "TensorRT-LLM executor is running"),
                  be.HealthCheckResult("model", HealthState.READY, self._card.names[0])]
        if self._poll_error is not None:
            checks.append(be.HealthCheckResult("kv_connector" if self.kv_events_on else "scheduler",
                                               HealthState.DEGRADED, f"engine queue poll failing: {self._poll_error}"))
        return checks

    def dead(self) -> str | None:
        """A worker that died leaves the LLM's streams waiting forever (the proxy's result queue gets
        nothing more): its MPI future completes (executor/proxy.py ``mpi_done_callback`` queues the
        error) and the executor shuts itself down on the error (executor.py
        ``_handle_background_error``: ``self.shutdown()``, so ``doing_shutdown``) while the LLM
        keeps it. An LLM shut down by its owner drops the executor instead
        (``LLM.shutdown``: ``self._executor = None``): not a death, ``check_health`` reports it."""
        executor = getattr(self.llm, "_executor", None)
        if executor is None:
            return None
        for future in getattr(executor, "mpi_futures", None) or ():
            if future.done():
                error = None if future.cancelled() else future.exception()
                # the first line: CppExecutorError's str carries its stack trace (executor.py)
                said = (str(error) or type(error).__name__).splitlines()[0] if error else "without an error"
                return f"a TensorRT-LLM worker process exited: {said}"
        if getattr(executor, "doing_shutdown", False):
            return "the TensorRT-LLM executor shut down after a background error"
        return None

    async def load(self, per_rank: bool) -> be.LoadSnapshot:
        idle = not self._live
        if not self.stats_on:
            return be.LoadSnapshot(running_requests=0 if idle else None, queued_requests=0 if idle else None,
                                   attributes={"in_flight_requests": len(self._live)})
        snap = self.stats.snapshot(idle, per_rank, self.tp if self.attention_dp else 1, len(self._live))
        attrs = dict(snap.attributes)
        attrs["in_flight_requests"] = len(self._live)
        return be.LoadSnapshot(**{**snap.__dict__, "attributes": attrs,
                                  "active_kv_sessions": self.open_kv_sessions()})

    def runtime_events(self, types):
        wanted = frozenset(types)
        return self.stats.events.subscribe(lambda e: not wanted or e.type in wanted).__aiter__()

    def kv_events(self, ranks, include_snapshot, start_sequence_number):
        return self.kv.bridge.subscribe(ranks, include_snapshot, start_sequence_number)

    # ------------------------------------------------------------------ generation

    def _prompt_len(self, params: be.GenerateParams) -> int:
        if params.token_ids is not None:
            return len(params.token_ids)
        return len(self.tokenizer.encode(params.prompt))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_ids(self, params: be.GenerateParams) -> dict[str, list[int]]:
        """Stop strings as TensorRT-LLM matches them: their token ids (SamplingParams._setup)."""
        if self.tokenizer is None or not params.stopping.stop_texts:
            return {}
        return {s: list(self.tokenizer.encode(s, add_special_tokens=False)) for s in params.stopping.stop_texts}

    def _stop_holdback(self, params: be.GenerateParams) -> int:
        st = params.stopping
        if not st.stop_texts or st.include_stop_in_output or self.tokenizer is None:
            return 0
        return max(len(self.tokenizer.encode(s, add_special_tokens=False)) for s in st.stop_texts) - 1

    async def validate_generate(self, params: be.GenerateParams) -> None:
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            disagg.decode_disaggregated(params.kv_session, self._disagg_fields())
            check_seal(params.kv_session.attributes, params.prompt, params.token_ids)

    def _disagg_fields(self) -> frozenset[str]:
        """The fields of this TensorRT-LLM's ``DisaggregatedParams`` (they grew after 1.2)."""
        if self._disagg_field_names is None:
            from tensorrt_llm.disaggregated_params import DisaggregatedParams

            self._disagg_field_names = frozenset(inspect.signature(DisaggregatedParams).parameters)
        return self._disagg_field_names

    def _sampling_params(self, params: be.GenerateParams, prompt_len: int):
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.sampling_params import GuidedDecodingParams

        check_room(prompt_len, params.stopping.max_tokens, self._card.max_context_length)
        kw = request_mapping.sampling_kwargs(params)
        if params.guided is not None:
            kw["guided_decoding"] = GuidedDecodingParams(**guide_kwargs(params.guided, choice_as_regex=True))
        if self.tokenizer is not None:
            kw["detokenize"] = False  # decoded here, per output (see output_mapping.TrtllmOutputMapper)
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as exc:
            raise invalid(f"sampling: rejected by TensorRT-LLM: {exc}") from None

    def _engine_kwargs(self, params: be.GenerateParams) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if params.lora_name:
            request = self._loras.get(params.lora_name)
            if request is None:
                raise not_found(f"lora_name: adapter {params.lora_name!r} is not loaded", ErrorCode.MODEL_NOT_FOUND)
            kw["lora_request"] = request
        if params.cache_salt is not None:
            kw["cache_salt"] = params.cache_salt
        if params.trace_headers and "trace_headers" in self._accepts:
            kw["trace_headers"] = dict(params.trace_headers)  # used when TensorRT-LLM exports OTLP traces
        if params.data_parallel_rank is not None and self.attention_dp:
            from tensorrt_llm.scheduling_params import SchedulingParams

            kw["scheduling_params"] = SchedulingParams(attention_dp_rank=params.data_parallel_rank,
                                                       attention_dp_relax=False)
        if self.role != EngineRole.AGGREGATED:
            from tensorrt_llm.disaggregated_params import DisaggregatedParams

            if self.role == EngineRole.PREFILL:
                kw["disaggregated_params"] = DisaggregatedParams(request_type="context_only")
            elif params.kv_session is not None:  # none: a local request (TensorRT-LLM's server: no params)
                kw["disaggregated_params"] = DisaggregatedParams(
                    **disagg.decode_disaggregated(params.kv_session, self._disagg_fields()))
        return kw

    async def generate(self, params: be.GenerateParams):
        """Acceptance is TensorRT-LLM's first response. The LLM runs its worker behind a proxy, so
        what the worker refuses when it enqueues a request (``executor/base_worker.py``
        ``_enqueue_request``: lengths, LoRA, disaggregation, grammar) does not raise from
        ``generate_async``: it comes back as the stream's first item, a ``RequestError``
        (``executor/executor.py`` ``_handle_background_error``), and is refused here as
        INVALID_ARGUMENT; an error after the first response ends the stream (one EngineError)."""
        prompt_len = self._prompt_len(params)
        sp = self._sampling_params(params, prompt_len)
        kw = self._engine_kwargs(params)
        used = (disagg.session_key(kw["disaggregated_params"])
                if self.role == EngineRole.DECODE and "disaggregated_params" in kw else None)
        if used is not None:
            self.sessions.consume(used)  # a second decode would pull KV the prefill side released
        try:
            return await self._submit(params, sp, kw, prompt_len)
        except BaseException:
            if used is not None:
                self.sessions.unconsume(used)
            raise

    async def _submit(self, params: be.GenerateParams, sp, kw: dict[str, Any], prompt_len: int):
        self._submitted = True
        try:
            handle = self.llm.generate_async(request_mapping.prompt_input(params), sp, streaming=True, **kw)
        except (ValueError, TypeError) as exc:
            raise invalid(f"request: rejected by TensorRT-LLM: {exc}") from None
        except Exception as exc:
            if is_request_error(exc):  # the single-process worker raises it at once
                raise invalid(f"request: rejected by TensorRT-LLM: {exc}") from None
            raise engine_refused(f"TensorRT-LLM refused the request: {exc}") from None
        self._live[params.request_id] = handle  # Abort during the wait below reaches the engine
        if params.lora_name:
            self._lora_in_use[params.lora_name] += 1
        try:
            first = await handle.__aiter__().__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException as exc:
            self._release(params, handle)
            if isinstance(exc, asyncio.CancelledError):
                abort_handle(handle)
                raise
            if is_request_error(exc):
                raise invalid(f"request: rejected by TensorRT-LLM: {exc}") from None
            raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM error: {type(exc).__name__}: {exc}") from None
        translator = output_mapping.TrtllmOutputMapper(params, self.eos_token_id, self._stop_holdback(params),
                                                decode=self._decode if self.tokenizer is not None else None,
                                                stop_ids=self._stop_ids(params))
        translator.max_tokens = (sp.max_tokens if sp.max_tokens is not None
                                 else self.max_context - prompt_len if self.max_context else None)
        return self._stream(params, handle, translator, first)

    def _release(self, params: be.GenerateParams, handle) -> None:
        if self._live.get(params.request_id) is handle:
            del self._live[params.request_id]
        if params.lora_name:
            self._lora_in_use[params.lora_name] -= 1
            if self._lora_in_use[params.lora_name] <= 0:
                del self._lora_in_use[params.lora_name]

    async def _stream(self, params: be.GenerateParams, handle, translator: output_mapping.TrtllmOutputMapper, first):
        finished = False
        try:
            if first is not None:
                chunk = translator.chunk(first)
                finished = bool(first.finished)
                if finished and self.role == EngineRole.PREFILL:
                    chunk.prefill_ready = self._handoff(params, first)
                yield chunk
            if not finished and first is not None:
                async for out in iterate(handle):
                    chunk = translator.chunk(out)
                    finished = bool(out.finished)
                    if finished and self.role == EngineRole.PREFILL:
                        chunk.prefill_ready = self._handoff(params, out)
                    yield chunk
                    if finished:
                        break
        finally:
            self._release(params, handle)
            if not finished:
                abort_handle(handle)

    def _handoff(self, params: be.GenerateParams, out) -> be.KvSession | None:
        comp = out.outputs[0] if out.outputs else None
        if comp is None or comp.finish_reason == "cancelled":
            return None  # aborted: the service reports it
        dp = comp.disaggregated_params
        if dp is None:
            raise EngineFailure(ErrorCode.KV_TRANSFER_FAILED,
                                "TensorRT-LLM finished the context-only request without disaggregated params")
        session_id, dp_rank, attributes = disagg.encode_disaggregated(dp, params.request_id)
        session = be.KvSession(session_id=session_id, transfer_backend=self.transfer_backend,
                               dp_rank=dp_rank or params.data_parallel_rank or 0,
                               attributes={**attributes, **seal(params.prompt, params.token_ids)})
        self.sessions.hand_off(session_id, out)
        return session

    async def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            handle = self._live.get(rid)
            if handle is not None:
                abort_handle(handle)

    async def probe(self, model: str, role: EngineRole) -> None:
        """AGGREGATED/PREFILL: the default probe. DECODE: one local token with no handoff (a
        request without DisaggregatedParams is context_and_generation, which any engine serves)."""
        if role != EngineRole.DECODE:
            await super().probe(model, role)
            return
        from tensorrt_llm import SamplingParams

        self._submitted = True
        handle = self.llm.generate_async({"prompt_token_ids": [1]},
                                         SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0),
                                         streaming=False)
        produced = 0
        try:
            async for out in iterate(handle):
                produced = max(produced, len(out.outputs[0].token_ids) if out.outputs else 0)
        finally:
            if produced < 1:
                abort_handle(handle)
        if produced < 1:
            raise RuntimeError("probe produced no token")

    async def release_kv_session(self, session: be.KvSession) -> bool:
        """Prefill side: forget a handed-off session. Its KV blocks are not freed early: the
        context-only request has finished, and TensorRT-LLM cannot abort a finished request
        (``executor/base_worker.py`` ``abort_request``); the blocks return to the pool when the
        decode engine has pulled them."""
        return self.sessions.forget(session.session_id)

    def open_kv_sessions(self) -> int | None:
        return self.sessions.held() if self.role == EngineRole.PREFILL else None
