"""EngineBackend on TensorRT-LLM's ``LLM.generate_async(..., streaming=True)`` (1.2.x).

Acceptance is ``generate_async``: it returns a ``RequestOutput`` at once (TensorRT-LLM's own
input checks raise there, and are refused before acceptance as INVALID_ARGUMENT); the stream is
then its async iteration, converted from cumulative outputs to deltas by
``translate.OutputTranslator``.

TensorRT-LLM has no abort-all, no request-id lookup and no runtime LoRA API, so this backend
keeps its own maps: request id -> ``RequestOutput`` (Abort by id / all / KV session all end in
``RequestOutput.abort()``), handed-off prefill sessions -> their ``RequestOutput``, and a lazy
LoRA registry (see ``load_lora``). Engine stats and KV-cache events are single-consumer queues:
one poller per queue (``start``) is their only reader.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.engine_kit.sessions import SessionTable, check_seal, seal
from openengine_adapters.errors import EngineFailure, RequestRejected, engine_refused, invalid, not_found, precondition
from openengine_adapters.guided import guide_kwargs
from openengine_adapters.label_scores import label_logprobs, label_score_result
from openengine_adapters.trtllm import translate
from openengine_adapters.trtllm.stats import KvEventTranslator, StatsCollector
from openengine_adapters.types import (
    CandidateMode,
    EngineRole,
    ErrorCode,
    GuidedMode,
    HealthState,
)

log = logging.getLogger(__name__)

# the guides each grammar backend builds (tensorrt_llm/grpc/openengine/capabilities.py
# GUIDE_SUPPORT_BY_BACKEND: llguidance has no structural-tag matcher); choice is lowered to a regex
GUIDED_BY_BACKEND = {
    "xgrammar": tuple(GuidedMode)[1:],
    "llguidance": tuple(m for m in tuple(GuidedMode)[1:] if m != GuidedMode.STRUCTURAL_TAG),
}
LORA_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# sampling field -> its no-op values: what TensorRT-LLM 1.2's TorchSampler accepts and ignores
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


def _model_max_positions(llm) -> int | None:
    """The context length of the model's own config (``max_position_embeddings``): what the PyTorch
    worker uses when ``max_seq_len`` is not set. ``LLM.args.max_seq_len`` stays None then (the
    worker keeps its deduced value: ``executor/base_worker.py`` ``setup_engine``), so the adapter
    reads the checkpoint's config.json (``LLM._hf_model_dir``)."""
    model_dir = getattr(llm, "_hf_model_dir", None)
    if not model_dir:
        return None
    try:
        with open(os.path.join(str(model_dir), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    for doc in (config, config.get("text_config") or {}):
        value = doc.get("max_position_embeddings") if isinstance(doc, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


class TrtllmBackend(be.EngineBackend):
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
        self.max_context = options.max_context_length or _get(args, "max_seq_len") or _model_max_positions(llm)
        self.max_batch_size = _get(args, "max_batch_size")
        kv = _get(args, "kv_cache_config")
        self.block_reuse = bool(_get(kv, "enable_block_reuse", default=True))
        self.kv_events_on = int(_get(kv, "event_buffer_max_size", default=0)) > 0
        self.stats_on = bool(_get(args, "enable_iter_perf_stats", default=False))
        self.lora_on = _get(args, "lora_config") is not None
        self.guided_backend = _get(args, "guided_decoding_backend") or ""
        sampler = _get(args, "sampler_type", default="auto")
        self.sampler = str(getattr(sampler, "value", sampler))
        # TorchSampler (sampler_type auto or TorchSampler) ignores these in TensorRT-LLM 1.2; the C++
        # decoder behind TRTLLMSampler applies them
        self.ignored_sampling = () if self.sampler == "TRTLLMSampler" else IGNORED_BY_TORCH_SAMPLER
        self.attention_dp = bool(_get(args, "enable_attention_dp", default=False))
        self.tp = _get(args, "tensor_parallel_size", default=1)
        self.pp = _get(args, "pipeline_parallel_size", default=1)
        self.transfer_backend = str(_get(args, "cache_transceiver_config", "backend", default="") or "")
        if self.role != EngineRole.AGGREGATED and not self.transfer_backend:
            raise ValueError(f"role {self.role.name} needs cache_transceiver_config (KV transfer backend)")
        if self.role == EngineRole.PREFILL and not _get(args, "disable_overlap_scheduler", default=False):
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
        lora = _get(self.llm.args, "lora_config")
        max_loras = _get(lora, "max_loras") if lora is not None else None
        return be.EngineIdentity(
            engine_name="tensorrt_llm", engine_version=self.version, role=self.role,
            parallelism=be.Parallelism(tensor_parallel_size=self.tp, pipeline_parallel_size=self.pp,
                                       data_parallel_size=self.tp if self.attention_dp else 1),
            max_loras=int(max_loras) if max_loras else None,  # LoraConfig.max_loras: adapters on the GPU
            extra={k: str(v) for k, v in (("backend", _get(self.llm.args, "backend")),
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

    def _build_card(self) -> be.ModelCard:
        names = self.options.served_model_names or (str(_get(self.args, "model", default="model")),)
        top = be.LogprobSupport(True, (CandidateMode.TOP_N,), self.options.max_top_n)
        n_max = self.options.max_num_sequences or self.max_batch_size or 8
        gen = be.GenerationSupport(
            prompt_logprobs=top, output_logprobs=top,
            guided_decoding=card.guided_support(GUIDED_BY_BACKEND.get(self.guided_backend)),
            max_num_sequences=n_max,
            supports_priority=False, supports_stop_in_output=True,
            supports_cache_salt=self.block_reuse and "cache_salt" in self._accepts,
            supports_prefix_cache_bypass=False,
        )
        tasks = None
        if self.role == EngineRole.AGGREGATED:
            tasks = be.TaskSupport(score=card.label_score_support(lora=self.lora_on))
        kv = _get(self.args, "kv_cache_config")
        return be.ModelCard(
            model_id=str(_get(self.args, "model", default=names[0])),
            served_model_name=names[0], served_model_aliases=tuple(names[1:]),
            # at least one prompt token: the whole window is never output
            max_context_length=self.max_context, max_output_tokens=self.max_context - 1 if self.max_context else None,
            kv_block_size=_get(kv, "tokens_per_block") or _get(self.args, "tokens_per_block"),
            max_running_requests=self.max_batch_size,
            max_batched_tokens=_get(self.args, "max_num_tokens"),
            supports_text_input=self.tokenizer is not None, supports_token_ids_input=True,
            generation=gen, supports_lora=self.lora_on, supports_multimodal=False, tasks=tasks,
        )

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

    async def _poll(self, read, sink) -> None:
        """Drain one single-consumer engine queue forever (this adapter must be its only reader).

        TensorRT-LLM hands out one ``IterationResult`` per queue (``executor/result.py``): once a
        read times out it stays done, so every later read ends at once, until ``mark_undone`` -
        which the executor calls only when a request is submitted. The poller marks it undone
        itself after each read, so events that come while no request arrives (evictions, the
        end of the last request) are not held back. Before the first request the KV queue does
        not exist yet (``executor/executor.py`` ``aget_kv_events`` asserts it): that is "not
        started", not a failure.
        """
        failed = False
        while True:
            try:
                it = read(timeout=self.options.poll_timeout_s)
                # a busy engine keeps the iteration going: handle every item as it arrives
                async for item in it:
                    sink([json.loads(item) if isinstance(item, str | bytes) else item])
                undone = getattr(it, "mark_undone", None)
                if undone is not None:
                    undone()
                if failed:
                    failed, self._poll_error = False, None
                    if sink == self._on_kv_events:
                        self.kv.engine_restarted()  # events may be lost while we could not read
            except asyncio.CancelledError:
                raise
            except AssertionError:
                if self._submitted:
                    self._poll_failed(read, "AssertionError: the engine queue is gone")
                    failed = True
                await asyncio.sleep(max(self.options.poll_interval_s, 0.1))
            except Exception as exc:
                if not failed:
                    log.warning("polling %s failed: %s", getattr(read, "__name__", read), exc)
                failed, self._poll_error = True, f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(max(self.options.poll_interval_s, 0.5))
            await asyncio.sleep(self.options.poll_interval_s)

    def _poll_failed(self, read, message: str) -> None:
        if self._poll_error is None:
            log.warning("polling %s failed: %s", getattr(read, "__name__", read), message)
        self._poll_error = message

    def _on_stats(self, items: list) -> None:
        for s in items:
            self.stats.record(s)

    def _on_kv_events(self, items: list) -> None:
        self.kv.ingest(items)

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
        for name, neutral in self.ignored_sampling:
            value = getattr(params.sampling, name)
            if value is not None and value not in neutral:
                raise invalid(f"sampling.{name}: TensorRT-LLM's TorchSampler (sampler_type {self.sampler}) ignores "
                              "it; serve with sampler_type: TRTLLMSampler to use it")
        g = params.guided
        if g is not None and g.backend and g.backend != self.guided_backend:
            raise invalid(f"guided.backend: {g.backend!r} differs from the engine's guided decoding backend "
                          f"{self.guided_backend!r} (set per engine, not per request)")
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            translate.decode_disaggregated(params.kv_session, self._disagg_fields())
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

        kw = translate.sampling_kwargs(params, prompt_len, self.max_context)
        if self.role == EngineRole.PREFILL:
            kw["max_tokens"] = 1
        if params.guided is not None:
            kw["guided_decoding"] = GuidedDecodingParams(**guide_kwargs(params.guided, choice_as_regex=True))
        if self.tokenizer is not None:
            kw["detokenize"] = False  # decoded here, per output (see translate.OutputTranslator)
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
            else:
                kw["disaggregated_params"] = DisaggregatedParams(
                    **translate.decode_disaggregated(params.kv_session, self._disagg_fields()))
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
        used = translate.session_key(kw["disaggregated_params"]) if self.role == EngineRole.DECODE else None
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
            handle = self.llm.generate_async(translate.prompt_input(params), sp, streaming=True, **kw)
        except (ValueError, TypeError) as exc:
            raise invalid(f"request: rejected by TensorRT-LLM: {exc}") from None
        except Exception as exc:
            if _is_request_error(exc):  # the single-process worker raises it at once
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
                _abort(handle)
                raise
            if _is_request_error(exc):
                raise invalid(f"request: rejected by TensorRT-LLM: {exc}") from None
            raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM error: {type(exc).__name__}: {exc}") from None
        translator = translate.OutputTranslator(params, self.eos_token_id, self._stop_holdback(params),
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

    async def _stream(self, params: be.GenerateParams, handle, translator: translate.OutputTranslator, first):
        finished = False
        try:
            if first is not None:
                chunk = translator.chunk(first)
                finished = bool(first.finished)
                if finished and self.role == EngineRole.PREFILL:
                    chunk.prefill_ready = self._handoff(params, first)
                yield chunk
            if not finished and first is not None:
                async for out in _iterate(handle):
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
                _abort(handle)

    def _handoff(self, params: be.GenerateParams, out) -> be.KvSession | None:
        comp = out.outputs[0] if out.outputs else None
        if comp is None or comp.finish_reason == "cancelled":
            return None  # aborted: the service reports it
        dp = comp.disaggregated_params
        if dp is None:
            raise EngineFailure(ErrorCode.KV_TRANSFER_FAILED,
                                "TensorRT-LLM finished the context-only request without disaggregated params")
        session_id, dp_rank, attributes = translate.encode_disaggregated(dp, params.request_id)
        session = be.KvSession(session_id=session_id, transfer_backend=self.transfer_backend,
                               dp_rank=dp_rank or params.data_parallel_rank or 0,
                               attributes={**attributes, **seal(params.prompt, params.token_ids)})
        self.sessions.hand_off(session_id, out)
        return session

    async def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            handle = self._live.get(rid)
            if handle is not None:
                _abort(handle)

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
            async for out in _iterate(handle):
                produced = max(produced, len(out.outputs[0].token_ids) if out.outputs else 0)
        finally:
            if produced < 1:
                _abort(handle)
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

    # ------------------------------------------------------------------ LoRA (lazy registry)

    async def load_lora(self, adapter: be.LoraAdapterInfo) -> None:
        """Validate and register; TensorRT-LLM reads the weights on the first request using it.

        TensorRT-LLM caches adapter weights by ``lora_int_id`` until evicted, so an id once
        used for one directory is refused for another (it could serve the stale weights).
        """
        path = adapter.source_path
        config = os.path.join(path, "adapter_config.json")
        if not os.path.isfile(config):
            raise invalid(f"adapter.source_path: {path!r} has no adapter_config.json (not a PEFT LoRA adapter)")
        try:
            with open(config, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise invalid(f"adapter.source_path: unreadable adapter_config.json: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid("adapter.source_path: adapter_config.json is not a JSON object")
        if not any(os.path.isfile(os.path.join(path, w)) for w in LORA_WEIGHT_FILES):
            raise invalid(f"adapter.source_path: {path!r} has no weights ({' or '.join(LORA_WEIGHT_FILES)})")
        previous = self._lora_ids_used.get(adapter.lora_id)
        if previous is not None and previous != path:
            raise invalid(f"adapter.lora_id: {adapter.lora_id} was used for {previous!r}; TensorRT-LLM may "
                          "still cache those weights under this id, choose a new id")
        from tensorrt_llm.executor.request import LoRARequest

        self._loras[adapter.lora_name] = LoRARequest(adapter.lora_name, adapter.lora_id, path)
        self._lora_info[adapter.lora_name] = adapter
        self._lora_ids_used[adapter.lora_id] = path

    async def unload_lora(self, adapter: be.LoraAdapterInfo) -> None:
        """Refused (FAILED_PRECONDITION, retryable) while a request uses the adapter; otherwise
        the name is unregistered (TensorRT-LLM evicts cached weights itself)."""
        busy = self._lora_in_use.get(adapter.lora_name, 0)
        if busy:
            raise precondition(f"lora_name: adapter {adapter.lora_name!r} is in use by {busy} running "
                               "request(s); unload it after they finish", retry_after_ms=100)
        self._loras.pop(adapter.lora_name, None)
        self._lora_info.pop(adapter.lora_name, None)

    async def list_loras(self) -> list[be.LoraAdapterInfo]:
        return list(self._lora_info.values())

    # ------------------------------------------------------------------ score

    def _ids(self, item: be.TaskItem) -> list[int]:
        if item.token_ids is not None:
            return list(item.token_ids)
        return list(self.tokenizer.encode(item.text, add_special_tokens=False))

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Label-token scoring: the log-probabilities of the label tokens as the next token after
        query + candidate, exact for every label. One 1-token greedy generation per pair returns
        the raw logits of that position (``return_generation_logits``), log-softmaxed here.

        Not logprobs: in TensorRT-LLM 1.2.x both kinds are top-k only. Prompt logprobs come from
        ``tensorrt_llm/executor/base_worker.py`` ``_compute_pytorch_prompt_logprobs``, which calls
        ``compute_logprobs(k, None, context_logits, None, None)`` without the prompt tokens, so
        ``executor/result.py`` ``_topk_logprobs`` adds no prompt token outside the top k (that
        came with PR #11235, the 1.3 line); output logprobs add at most the sampled token.
        """
        from tensorrt_llm import SamplingParams

        labels = list(p.label_token_ids)  # non-empty: the card declares native_scoring=False
        lora = self._loras.get(p.context.lora_name) if p.context.lora_name else None
        handles: list = []

        async def one(where: str, prompt_ids: list[int]) -> list[float]:
            sp = SamplingParams(max_tokens=1, temperature=0.0, return_generation_logits=True)
            kw = {"lora_request": lora} if lora is not None else {}
            self._submitted = True
            handle = self.llm.generate_async({"prompt_token_ids": prompt_ids}, sp, streaming=False, **kw)
            handles.append(handle)
            last = None
            async for out in _iterate(handle):
                last = out
            comp = last.outputs[0] if last is not None and last.outputs else None
            logits = comp.generation_logits if comp is not None and comp.finish_reason != "cancelled" else None
            if logits is None or len(logits) == 0:
                raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM returned no generation logits for {where} "
                                    "(it skips them with speculative decoding)")
            # a vocabulary-wide row: off the event loop, which streams other requests meanwhile
            return await asyncio.to_thread(lambda: label_logprobs(logits[0].tolist(), labels))

        jobs, shape, total = [], [], 0
        for g in p.groups:
            # a text query starts as the model's tokenizer starts a prompt (BOS where it adds one):
            # TensorRT-LLM's tokenizer wrapper has no bos_token_id to read
            head = (list(self.tokenizer.encode(g.query.text)) if g.query.text is not None
                    else list(g.query.token_ids))
            shape.append(len(g.candidates))
            for c in g.candidates:
                ids = head + self._ids(c)
                total += len(ids)
                jobs.append(one(f"group {g.group_id!r} candidate {c.item_id!r}", ids))
        try:
            results = await asyncio.gather(*jobs)
        finally:
            for h in handles:
                if not getattr(h, "finished", True):
                    _abort(h)
        return label_score_result(p, results, total)


async def _iterate(handle):
    """A RequestOutput's updates, engine errors as EngineFailure."""
    it = handle.__aiter__()
    while True:
        try:
            out = await it.__anext__()
        except StopAsyncIteration:
            return
        except (asyncio.CancelledError, EngineFailure, RequestRejected):
            raise
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM error: {type(exc).__name__}: {exc}") from None
        yield out


def _is_request_error(exc: BaseException) -> bool:
    """TensorRT-LLM's per-request error (``executor/utils.py`` ``RequestError``), by class name:
    importing it would import the engine."""
    return any(c.__name__ == "RequestError" for c in type(exc).__mro__)


def _abort(handle) -> None:
    try:
        handle.abort()
    except Exception:  # already finished / executor gone: nothing left to stop
        log.debug("abort of a TensorRT-LLM request failed", exc_info=True)
