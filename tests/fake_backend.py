"""A deterministic in-memory engine behind the backend seam (test code, not product code).

Tokens are characters: a text prompt tokenizes to ``ord(c)``; token id t detokenizes to
``chr(t)``. Greedy output cycles through ``GREEDY_TEXT``; a seed picks letters with
``random.Random(seed + index)`` (per-index seeds, as vLLM does). Engine behaviour that tests need
to provoke is steered through request metadata (``fake.*`` keys), the opt-in hooks a black-box
conformance run needs from a test engine:

- ``fake.step_delay_ms=N``: sleep N ms before each engine step (keeps a "long" request running long
  enough to be aborted, cancelled or counted; conformance ``--long-request-metadata``);
- ``fake.fail_after=N`` / ``fake.crash_after=N``: fail after N steps, after acceptance, with a
  retryable KV_TRANSFER_FAILED ``EngineFailure`` / an unexpected exception (an INTERNAL error)
  (conformance ``--fail-request-metadata``);
- ``fake.serialize=1``: requests carrying it run one at a time, highest ``priority`` first (ties in
  arrival order), so scheduling order becomes observable (conformance ``--serial-request-metadata``);
- ``fake.eos_after=N``: the model emits EOS after N tokens; ``fake.reasoning=N``: N reasoning tokens;
- ``fake.hang_after=N`` / ``fake.die_after=N``: after N steps the whole engine hangs (alive, no
  progress, deaf to aborts) / dies (``dead()`` names the reason; nothing more is produced), as a
  process-level test needs (in-process tests call ``hang()``, ``resume()``, ``die()``).

A directory holding an ``adapter_config.json`` is a loadable LoRA adapter (conformance ``--lora-dir``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence

import grpc

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.event_hub import EventHub
from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    ErrorCode,
    Feature,
    FinishReason,
    Granularity,
    GuidedMode,
    HealthState,
    RuntimeEventType,
    ScoreNormalization,
    StorageMedium,
    TaskInputType,
    ValueSemantics,
)

GREEDY_TEXT = "hello world. "
EOS_ID = 3
VOCAB = 128
EMBED_DIM = 8
LABELS = ("negative", "neutral", "positive")
ALL_FEATURES = frozenset(Feature)


RECENT = 64  # requests the fake remembers (seen_params, aborted, prefix cache entries)


class BoundedSet(OrderedDict):
    """A set keeping its newest ``capacity`` members (the fake's prefix cache evicts, as an engine's does)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def add(self, key) -> None:
        self[key] = None
        self.move_to_end(key)
        if len(self) > self.capacity:
            self.popitem(last=False)


def tokenize(text: str) -> list[int]:
    return [ord(c) % VOCAB for c in text]


def detok(t: int) -> str:
    """Any id a request may name (candidate token ids are not checked against the vocabulary)
    detokenizes: ids with no character, and surrogates, become U+FFFD as a real tokenizer's
    invalid bytes do."""
    if t == EOS_ID:
        return ""
    return chr(t) if t < 0x110000 and not 0xD800 <= t < 0xE000 else "\ufffd"


def default_card(**overrides) -> be.ModelCard:
    gen = be.GenerationSupport(
        prompt_logprobs=be.LogprobSupport(True, (CandidateMode.TOP_N, CandidateMode.TOKEN_IDS), 5),
        output_logprobs=be.LogprobSupport(
            True, (CandidateMode.TOP_N, CandidateMode.TOKEN_IDS, CandidateMode.ALL), 5),
        guided_decoding=be.GuidedSupport(True, (GuidedMode.CHOICE, GuidedMode.JSON_OBJECT)),
        max_num_sequences=4,
        supports_priority=True,
        supports_stop_in_output=True,
        supports_cache_salt=True,
        supports_prefix_cache_bypass=True,
    )
    inputs = (TaskInputType.TEXT, TaskInputType.TOKEN_IDS)
    tasks = be.TaskSupport(
        embed=be.EmbedSupport(
            supported=True, input_types=inputs,
            granularities=(Granularity.SEQUENCE, Granularity.TOKEN),
            encodings=(EmbeddingEncoding.DENSE, EmbeddingEncoding.SPARSE), dimension=EMBED_DIM,
            max_batch_size=16, supports_normalization=True, supports_dimension_override=True,
            supports_lora=False, supports_priority=False),
        classify=be.ClassifySupport(
            supported=True, input_types=inputs, granularities=(Granularity.SEQUENCE,),
            semantics=(ValueSemantics.PROBABILITIES, ValueSemantics.LOGITS), max_batch_size=16,
            supports_priority=False, supports_lora=False),
        score=be.ScoreSupport(
            supported=True, input_types=inputs, granularities=(Granularity.SEQUENCE,),
            semantics=(ValueSemantics.SIMILARITY, ValueSemantics.LOG_PROBABILITIES,
                       ValueSemantics.PROBABILITIES),
            normalizations=(ScoreNormalization.NONE, ScoreNormalization.SOFTMAX),
            supports_label_token_scoring=True, supports_instruction=False, max_groups=8,
            max_candidates_per_group=8, higher_is_better=True, max_label_token_ids=4,
            supports_priority=False, supports_lora=False),
    )
    fields = dict(
        model_id="fake/tiny-model", served_model_name="tiny", served_model_aliases=("tiny-alias",),
        max_context_length=512, max_output_tokens=256, kv_block_size=16, total_kv_blocks=1000,
        max_running_requests=64, max_batched_tokens=2048, tokenizer_modes=("auto",),
        supports_text_input=True, supports_token_ids_input=True, generation=gen,
        supports_lora=True, supports_multimodal=False, tasks=tasks, extra={"fake_dtype": "char"},
    )
    fields.update(overrides)
    return be.ModelCard(**fields)


class FakeBackend(be.EngineBackend):
    def __init__(self, role: EngineRole = EngineRole.AGGREGATED, cards=None,
                 features: frozenset[Feature] = ALL_FEATURES, step_delay_s: float = 0.0,
                 data_parallel_size: int = 1, event_queue: int = 64) -> None:
        self.role = role
        self.cards = cards or [default_card()]
        self.features = features
        self.step_delay_s = step_delay_s
        self.data_parallel_size = data_parallel_size
        self.running: dict[str, asyncio.Event] = {}
        # what tests inspect, bounded like every per-request structure (a soak measures the server, not the fake)
        self.seen_params: deque[be.GenerateParams] = deque(maxlen=RECENT)
        self.aborted: deque[str] = deque(maxlen=RECENT)
        self.prefix_cache: BoundedSet[tuple[str | None, tuple[int, ...]]] = BoundedSet(RECENT)
        self.sessions: dict[str, be.KvSession] = {}
        self.loras: dict[str, be.LoraAdapterInfo] = {}
        self.health_state = HealthState.READY
        self.dead_reason: str | None = None
        self._alive = asyncio.Event()  # cleared: every engine step waits (a hung or dead engine)
        self._alive.set()
        self.runtime_hub: EventHub[be.RuntimeEventData] = EventHub(event_queue)
        self.kv_hub: EventHub[be.KvEventBatchData] = EventHub(event_queue)
        self.kv_history: deque[be.KvEventBatchData] = deque(maxlen=256)
        self.kv_seq = 0
        self.event_seq = 0
        self.probe_calls = 0
        # fake.serialize: one request at a time, highest priority first (a heap of waiters)
        self._serial_busy = False
        self._serial_waiters: list[tuple[int, int, asyncio.Future]] = []
        self._serial_order = itertools.count()

    # identity ----------------------------------------------------------------
    # engine-specific GenerateRequest.extra keys (v0.1.0), recorded in seen_params for the tests
    request_extra = {"fake_note": be.ExtraKey("string", "a note the fake records"),
                     "fake_flag": be.ExtraKey("bool", "a switch the fake records"),
                     "fake_count": be.ExtraKey("int", "a count the fake records"),
                     "fake_ids": be.ExtraKey("int_list", "token ids the fake records")}

    def identity(self) -> be.EngineIdentity:
        return be.EngineIdentity("fake", "0.0.1", self.role, be.Parallelism(
            tensor_parallel_size=1, pipeline_parallel_size=1,
            data_parallel_size=self.data_parallel_size, data_parallel_rank=0, decode_context_parallel_size=1),
            max_loras=4, extra={"fake_build": "test", "fake_steps_per_token": 1})

    def models(self):
        return self.cards

    def kv_connector(self):
        if self.role == EngineRole.AGGREGATED:
            return None
        return be.KvConnector(enabled=True, transfer_backend="fake",
                              local_endpoints=(be.KvEndpoint("127.0.0.1", 7000, "tcp"),),
                              supported_protocols=("tcp",), supports_remote_prefill=True,
                              supports_decode_pull=False, supports_abort_cleanup=True,
                              supports_drain=True, schema_version=1)

    async def check_health(self):
        return [be.HealthCheckResult("scheduler", self.health_state, "fake scheduler")]

    def hang(self) -> None:
        """Stop making progress (requests and aborts wait) until ``resume``."""
        self._alive.clear()

    def resume(self) -> None:
        if self.dead_reason is None:
            self._alive.set()

    def die(self, reason: str = "fake engine process exited") -> None:
        self.dead_reason = reason
        self._alive.clear()

    def dead(self):
        return self.dead_reason

    async def probe(self, model, role):
        self.probe_calls += 1
        if self.role == EngineRole.DECODE:
            return  # the fake decodes without a session for probes
        await super().probe(model, role)

    # generation ----------------------------------------------------------------
    async def validate_generate(self, params):
        ids = params.token_ids or ()
        if any(t >= VOCAB for t in ids):
            raise RequestRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"token_ids.ids: token id out of vocabulary (size {VOCAB})")
        if params.kv_session is not None and "room" not in params.kv_session.attributes:
            raise RequestRejected(grpc.StatusCode.NOT_FOUND,
                                  "kv.session: unknown session (no room attribute)",
                                  ErrorCode.KV_SESSION_NOT_FOUND)

    async def generate(self, params):
        self.seen_params.append(params)
        stop = asyncio.Event()
        self.running[params.request_id] = stop
        return self._run(params, stop)

    def _next_token(self, params, index: int, step: int, rng: random.Random | None) -> int:
        if params.guided is not None:
            return ord(self._guided_text(params)[step]) if step < len(self._guided_text(params)) else EOS_ID
        shift = 1 if params.lora_name else 0
        if rng is None:
            return (ord(GREEDY_TEXT[step % len(GREEDY_TEXT)]) + shift) % VOCAB
        return ord(rng.choice("abcdefghijklmnopqrstuvwxyz")) + shift

    @staticmethod
    def _guided_text(params) -> str:
        if params.guided.mode == GuidedMode.CHOICE:
            return params.guided.value[0]
        return "{}"

    def _logprob(self, params, token: int, sel) -> be.TokenLogprob:
        lp = be.TokenLogprob(logprob=-0.5, rank=1)
        if sel is None:
            return lp
        if sel.mode == CandidateMode.TOP_N:
            lp.candidates = [be.Candidate((token + j) % VOCAB, -0.5 - j, detok((token + j) % VOCAB), j + 1)
                             for j in range(sel.top_n)]
        elif sel.mode == CandidateMode.TOKEN_IDS:
            lp.candidates = [be.Candidate(t, -1.0 - (t % 7) * 0.1, detok(t)) for t in sel.token_ids]
        else:
            lp.candidates = [be.Candidate(t, -math.log(VOCAB), detok(t), None) for t in range(VOCAB)]
        return lp

    async def _serial_acquire(self, priority: int, stop: asyncio.Event) -> bool:
        """Wait for the serial slot (``fake.serialize``); False if aborted while waiting."""
        if not self._serial_busy and not self._serial_waiters:
            self._serial_busy = True
            return True
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._serial_waiters, (-priority, next(self._serial_order), fut))
        try:
            while not fut.done():
                await asyncio.wait({fut}, timeout=0.02)
                if stop.is_set() and not fut.done():
                    fut.cancel()
                    return False
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._serial_release()  # the slot was handed over as we were cancelled
            else:
                fut.cancel()
            raise
        return True

    def _serial_release(self) -> None:
        while self._serial_waiters:
            _, _, fut = heapq.heappop(self._serial_waiters)
            if not fut.done():
                fut.set_result(None)  # the slot passes to the highest-priority waiter
                return
        self._serial_busy = False

    async def _run(self, params: be.GenerateParams, stop: asyncio.Event) -> AsyncIterator[be.GenerationChunk]:
        meta = params.metadata
        if "fake.serialize" in meta:
            if not await self._serial_acquire(params.priority or 0, stop):
                self.running.pop(params.request_id, None)
                return
            try:
                async for chunk in self._run_now(params, stop):
                    yield chunk
            finally:
                self._serial_release()
            return
        async for chunk in self._run_now(params, stop):
            yield chunk

    async def _run_now(self, params: be.GenerateParams, stop: asyncio.Event) -> AsyncIterator[be.GenerationChunk]:
        meta = params.metadata
        delay = float(meta.get("fake.step_delay_ms", self.step_delay_s * 1000)) / 1000
        prompt_ids = list(params.token_ids) if params.token_ids is not None else tokenize(params.prompt)
        key = (params.cache_salt, tuple(prompt_ids))
        cached = len(prompt_ids) - 1 if key in self.prefix_cache and not params.bypass_prefix_cache else 0
        self.prefix_cache.add(key)
        try:
            self._publish_kv(params.request_id, prompt_ids)
            first = be.GenerationChunk(prompt_tokens=len(prompt_ids), cached_prompt_tokens=cached)
            if params.logprobs.prompt:
                start = params.logprobs.prompt_start or 0
                first.prompt = [
                    be.PromptToken(t, detok(t), None if i == 0 else self._logprob(
                        params, t, params.logprobs.prompt_candidates))
                    for i, t in enumerate(prompt_ids) if i >= start]
            if self.role == EngineRole.PREFILL:
                await asyncio.sleep(delay)
                session = be.KvSession(
                    session_id=f"sess-{params.request_id}", transfer_backend="fake",
                    endpoints=(be.KvEndpoint("127.0.0.1", 7000, "tcp"),), dp_rank=0,
                    attributes={"room": 42, "flag": True, "first_tokens": [1.0, 2.0],
                                "nested": {"engine": "fake"}, "big": "9007199254740993"})
                self.sessions[session.session_id] = session
                first.prefill_ready = session
                yield first
                return
            yield first
            yield_ = self._decode(params, stop, delay)
            async for chunk in yield_:
                yield chunk
        finally:
            self.running.pop(params.request_id, None)

    async def _decode(self, params, stop, delay) -> AsyncIterator[be.GenerationChunk]:
        meta = params.metadata
        n = params.sampling.num_sequences
        max_tokens = params.stopping.max_tokens or 16
        min_tokens = params.stopping.min_tokens or 0
        eos_after = int(meta["fake.eos_after"]) if "fake.eos_after" in meta else None
        fail_after = int(meta["fake.fail_after"]) if "fake.fail_after" in meta else None
        crash_after = int(meta["fake.crash_after"]) if "fake.crash_after" in meta else None
        hang_after = int(meta["fake.hang_after"]) if "fake.hang_after" in meta else None
        die_after = int(meta["fake.die_after"]) if "fake.die_after" in meta else None
        greedy = params.sampling.temperature == 0 or params.sampling.seed is None
        rngs = [None if greedy else random.Random(params.sampling.seed + i) for i in range(n)]
        include = bool(params.stopping.include_stop_in_output)
        texts = params.stopping.stop_texts
        state = [dict(count=0, pending="", text="", done=False) for _ in range(n)]
        step = 0
        while not all(s["done"] for s in state):
            if hang_after is not None and step >= hang_after:
                self.hang()
            if die_after is not None and step >= die_after:
                self.die()
            if not self._alive.is_set():
                await self._alive.wait()  # hung: deaf to aborts too
            if stop.is_set():
                return
            if delay:
                await asyncio.sleep(delay)
                if stop.is_set():
                    return
            if fail_after is not None and step >= fail_after:
                raise EngineFailure(ErrorCode.KV_TRANSFER_FAILED, "injected failure",
                                    retryable=True, retry_after_ms=5)
            if crash_after is not None and step >= crash_after:
                raise RuntimeError("injected crash")
            chunk = be.GenerationChunk()
            if "fake.reasoning" in meta:
                chunk.reasoning_tokens = int(meta["fake.reasoning"])
            for i, s in enumerate(state):
                if s["done"]:
                    continue
                if params.guided is None and eos_after is not None and s["count"] >= eos_after \
                        and not params.stopping.ignore_eos and s["count"] >= min_tokens:
                    token = EOS_ID
                else:
                    token = self._next_token(params, i, s["count"], rngs[i])
                    if token == EOS_ID and (params.stopping.ignore_eos or s["count"] < min_tokens):
                        token = ord(" ")
                s["count"] += 1
                delta = be.OutputDelta(index=i, token_ids=[token])
                if params.logprobs.output:
                    delta.logprobs = [self._logprob(params, token, params.logprobs.output_candidates)]
                    delta.tokens = [detok(token)]
                can_stop = s["count"] > min_tokens
                if token == EOS_ID:
                    delta.finish_reason, delta.stop = FinishReason.STOP, be.StopMatch(eos_token_id=EOS_ID)
                elif token in params.stopping.stop_token_ids and can_stop:
                    delta.finish_reason = FinishReason.STOP
                    delta.stop = be.StopMatch(stop_token_id=token)
                    delta.text = s["pending"] + (detok(token) if include else "")
                    s["pending"] = ""
                else:
                    s["pending"] += detok(token)
                    hit = next((t for t in texts if s["pending"].endswith(t)), None) if can_stop else None
                    if hit is not None:
                        delta.finish_reason, delta.stop = FinishReason.STOP, be.StopMatch(stop_text=hit)
                        delta.text = s["pending"] if include else s["pending"][: -len(hit)]
                        s["pending"] = ""
                    else:
                        # hold back a suffix that may still become a stop string
                        hold = max((k for t in texts for k in range(1, len(t))
                                    if s["pending"].endswith(t[:k])), default=0) if can_stop else 0
                        cut = len(s["pending"]) - hold
                        delta.text, s["pending"] = s["pending"][:cut], s["pending"][cut:]
                if delta.finish_reason is None and s["count"] >= max_tokens:
                    delta.finish_reason = FinishReason.LENGTH
                    delta.text += s["pending"]
                if delta.finish_reason is not None:
                    s["done"] = True
                chunk.outputs.append(delta)
            step += 1
            self._publish_runtime(RuntimeEventType.FORWARD_PASS,
                                  {"batch_size": str(len(self.running)), "step": str(step)})
            yield chunk

    async def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self.aborted.append(rid)
            ev = self.running.get(rid)
            if ev is not None:
                ev.set()

    async def release_kv_session(self, session) -> bool:
        return self.sessions.pop(session.session_id, None) is not None

    def open_kv_sessions(self):
        return len(self.sessions) if self.role == EngineRole.PREFILL else None

    # tasks -------------------------------------------------------------------------
    @staticmethod
    def _ids(item: be.TaskItem) -> list[int]:
        return list(item.token_ids) if item.token_ids is not None else tokenize(item.text or "")

    @staticmethod
    def _vector(ids: Sequence[int]) -> list[float]:
        v = [0.0] * EMBED_DIM
        for pos, t in enumerate(ids):
            v[(t + pos) % EMBED_DIM] += 1.0 + (t % 5) * 0.25
        return v

    @staticmethod
    def _normalized(v: list[float]) -> list[float]:
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    async def _task_delay(self, ctx: be.TaskContext) -> None:
        delay = float(ctx.metadata.get("fake.step_delay_ms", 0)) / 1000
        if delay:
            self.running[ctx.request_id] = asyncio.Event()
            try:
                await asyncio.sleep(delay)
            finally:
                self.running.pop(ctx.request_id, None)

    async def embed(self, p: be.EmbedParams) -> be.EmbedResult:
        await self._task_delay(p.context)
        outs, total = [], 0
        for item in p.inputs:
            ids = self._ids(item)
            total += len(ids)
            rows = [self._vector([t]) for t in ids] if p.granularity == Granularity.TOKEN \
                else [self._vector(ids)]
            if p.dimensions is not None:
                rows = [r[: p.dimensions] for r in rows]
            if p.normalize is not False:
                rows = [self._normalized(r) for r in rows]
            dim = len(rows[0])
            if p.granularity == Granularity.TOKEN:
                shape, gran, tok = (len(rows), dim), Granularity.TOKEN, ids
            else:
                shape, gran, tok = (dim,), Granularity.SEQUENCE, ()
            flat = [x for r in rows for x in r]
            if p.encoding == EmbeddingEncoding.SPARSE:
                idx = [i for i, x in enumerate(flat) if x != 0.0]
                tensor = be.SparseTensor(shape, idx, [flat[i] for i in idx])
            else:
                tensor = be.DenseTensor(shape, flat)
            outs.append(be.Embedding(gran, tensor, tok))
        return be.EmbedResult(outs, be.TaskUsageData(total, 0))

    async def classify(self, p: be.ClassifyParams) -> be.ClassifyResult:
        await self._task_delay(p.context)
        outs, total = [], 0
        for item in p.inputs:
            ids = self._ids(item)
            total += len(ids)
            logits = [sum(ids) % 7 * 0.5, len(ids) * 0.1, (ids[0] % 3) * 1.0]
            if p.semantics == ValueSemantics.LOGITS:
                values, sem = logits, ValueSemantics.LOGITS
            else:
                m = max(logits)
                e = [math.exp(x - m) for x in logits]
                values, sem = [x / sum(e) for x in e], ValueSemantics.PROBABILITIES
            outs.append(be.Classification(Granularity.SEQUENCE, sem, be.DenseTensor((3,), values),
                                          LABELS))
        return be.ClassifyResult(outs, be.TaskUsageData(total))

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        await self._task_delay(p.context)
        groups, total = [], 0
        labels = p.label_token_ids
        for g in p.groups:
            q = self._normalized(self._vector(self._ids(g.query)))
            row = []
            for c in g.candidates:
                ids = self._ids(c)
                total += len(ids)
                if labels:
                    lps = [-1.0 - ((sum(ids) + t) % 5) * 0.5 for t in labels]
                    if p.normalization == ScoreNormalization.SOFTMAX:
                        m = max(lps)
                        e = [math.exp(x - m) for x in lps]
                        lps = [x / sum(e) for x in e]
                    row.append(be.CandidateScore(be.DenseTensor((len(labels),), lps)))
                else:
                    v = self._normalized(self._vector(ids))
                    cos = sum(a * b for a, b in zip(q, v, strict=True))
                    # SOFTMAX normalizes across the returned vector: of one score, that is 1.0
                    value = 1.0 if p.normalization == ScoreNormalization.SOFTMAX else cos
                    row.append(be.CandidateScore(be.DenseTensor((1,), [value])))
            groups.append(row)
        if labels:
            softmax = p.normalization == ScoreNormalization.SOFTMAX
            sem = ValueSemantics.PROBABILITIES if softmax else ValueSemantics.LOG_PROBABILITIES
            norm = ScoreNormalization.SOFTMAX if softmax else ScoreNormalization.NONE
        else:
            softmax = p.normalization == ScoreNormalization.SOFTMAX
            sem = ValueSemantics.PROBABILITIES if softmax else ValueSemantics.SIMILARITY
            norm = ScoreNormalization.SOFTMAX if softmax else ScoreNormalization.NONE
        return be.ScoreResult(groups, Granularity.SEQUENCE, sem, norm, higher_is_better=True,
                              label_token_ids=labels, usage=be.TaskUsageData(total))

    # load, events -------------------------------------------------------------------
    async def load(self, per_rank: bool) -> be.LoadSnapshot:
        ranks = tuple(be.RankLoad(data_parallel_rank=r, running_requests=len(self.running) if r == 0 else 0,
                                  queued_requests=0) for r in range(self.data_parallel_size))
        return be.LoadSnapshot(
            running_requests=len(self.running), queued_requests=0,
            active_kv_sessions=len(self.sessions) if self.role == EngineRole.PREFILL else None,
            used_kv_blocks=len(self.prefix_cache), total_kv_blocks=1000, running_tokens=None,
            ranks=ranks if per_rank else (),
            attributes={"engine": "fake", "in_flight": len(self.running), "warm": True, "ratio": 0.5})

    def _publish_runtime(self, type_: RuntimeEventType, attributes: dict[str, str]) -> None:
        self.event_seq += 1
        self.runtime_hub.publish(be.RuntimeEventData(f"ev-{self.event_seq}", time.time_ns(), type_,
                                                     attributes))

    def _publish_kv(self, request_id: str, ids: list[int]) -> None:
        self.kv_seq += 1
        h = hash(tuple(ids)) & 0xFFFFFFFF
        batch = be.KvEventBatchData(self.kv_seq, time.time_ns(), 0, (be.KvEventData(
            be.BlockStored((be.BlockHash(h.to_bytes(8, "big"), "int64"),), None, tuple(ids[:16]), 16,
                           medium=StorageMedium.GPU, extra_keys=(("salt",),)), request_id),))
        self.kv_history.append(batch)
        self.kv_hub.publish(batch)

    def kv_event_sources(self, ranks):
        return [be.KvEventSourceInfo("zmq", be.KvEndpoint("*", 5557, "tcp"), "kv", "tcp://*:5558",
                                     r, "msgpack", 1, 100, 10000, 1000)
                for r in range(self.data_parallel_size)]

    async def kv_events(self, ranks, include_snapshot, start_sequence_number):
        sub = self.kv_hub.subscribe(lambda b: not ranks or b.data_parallel_rank in ranks)
        if include_snapshot:
            yield be.KvEventBatchData(0, time.time_ns(), 0, (be.KvEventData(be.AllBlocksCleared()),))
        last = 0
        if start_sequence_number:
            last = start_sequence_number - 1
            for batch in list(self.kv_history):
                if batch.sequence_number > last:
                    last = batch.sequence_number
                    yield batch
        async for batch in sub:
            if batch.sequence_number > last:
                last = batch.sequence_number
                yield batch

    def runtime_events(self, types):
        wanted = frozenset(types)
        return self.runtime_hub.subscribe(lambda e: not wanted or e.type in wanted).__aiter__()

    # LoRA -------------------------------------------------------------------------
    async def load_lora(self, adapter):
        import os

        if not os.path.exists(os.path.join(adapter.source_path, "adapter_config.json")):
            raise RequestRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                  "adapter.source_path: no adapter_config.json in the directory")
        self.loras[adapter.lora_name] = adapter

    async def unload_lora(self, adapter):
        del self.loras[adapter.lora_name]

    async def list_loras(self):
        return list(self.loras.values())
