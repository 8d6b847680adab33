"""The backend seam: what an engine adapter implements, in plain Python types.

Nothing engine-specific lives above this module and no protobuf below it. The service validates
every request against the backend's ``ModelCard`` (the one capability table that both
``GetModelInfo`` advertises and validation enforces) before calling in, so a backend only sees
requests it declared it can serve.

Contract for ``generate``: awaiting it may raise ``RequestRejected`` (not accepted, the client gets
a status); once it returns, the request is accepted and the returned async iterator yields
``GenerationChunk``s until every output finished (or, for a prefill, ``prefill_ready`` is set).
After ``abort`` the stream must end promptly; outputs it did not finish are reported CANCELLED by
the service. Raise ``EngineFailure`` for an accepted request that fails.
"""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    Feature,
    FinishReason,
    Granularity,
    GuidedMode,
    HealthState,
    Modality,
    RuntimeEventType,
    ScoreNormalization,
    StorageMedium,
    TaskInputType,
    ValueSemantics,
)

# --------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class LogprobSupport:
    supported: bool | None = None
    candidate_selection_modes: tuple[CandidateMode, ...] = ()
    max_top_n: int | None = None
    # engine limit the contract has no field for; validation enforces it before acceptance
    max_token_ids: int | None = field(default=None, metadata={"wire": False})


@dataclass(frozen=True)
class GuidedSupport:
    supported: bool | None = None
    modes: tuple[GuidedMode, ...] = ()
    # the engine's grammar backend, set per engine: a request naming another is refused
    backend: str | None = field(default=None, metadata={"wire": False})


@dataclass(frozen=True)
class IgnoredOption:
    """A sampling option the engine accepts and does not apply (``name`` is a ``SamplingParams`` field):
    a value outside ``neutral`` is refused, or dropped under ``--ignored-options ignore`` (v0.1.0)."""

    name: str
    reason: str  # why the engine does not apply it, and how to make it
    neutral: tuple[Any, ...] = ()  # values that ask for what the engine does anyway


@dataclass(frozen=True)
class GenerationSupport:
    prompt_logprobs: LogprobSupport | None = None
    output_logprobs: LogprobSupport | None = None
    guided_decoding: GuidedSupport | None = None
    max_num_sequences: int | None = None
    supports_priority: bool | None = None
    supports_stop_in_output: bool | None = None
    supports_cache_salt: bool | None = None
    supports_prefix_cache_bypass: bool | None = None
    # engine limits the contract has no field for; validation enforces them before acceptance
    max_stop_strings: int | None = field(default=None, metadata={"wire": False})
    ignored_options: tuple[IgnoredOption, ...] = field(default=(), metadata={"wire": False})


@dataclass(frozen=True)
class EmbedSupport:
    supported: bool | None = None
    input_types: tuple[TaskInputType, ...] = ()
    granularities: tuple[Granularity, ...] = ()
    encodings: tuple[EmbeddingEncoding, ...] = ()
    dimension: int | None = None
    max_batch_size: int | None = None
    max_output_values_per_item: int | None = None
    supports_priority: bool | None = None
    supports_lora: bool | None = None
    supports_normalization: bool | None = None
    supports_dimension_override: bool | None = None
    modalities: tuple[Modality, ...] = ()


@dataclass(frozen=True)
class ClassifySupport:
    supported: bool | None = None
    input_types: tuple[TaskInputType, ...] = ()
    granularities: tuple[Granularity, ...] = ()
    semantics: tuple[ValueSemantics, ...] = ()
    max_batch_size: int | None = None
    max_output_values_per_item: int | None = None
    supports_priority: bool | None = None
    supports_lora: bool | None = None
    modalities: tuple[Modality, ...] = ()


@dataclass(frozen=True)
class ScoreSupport:
    supported: bool | None = None
    input_types: tuple[TaskInputType, ...] = ()
    granularities: tuple[Granularity, ...] = ()
    semantics: tuple[ValueSemantics, ...] = ()
    normalizations: tuple[ScoreNormalization, ...] = ()
    supports_label_token_scoring: bool | None = None
    supports_instruction: bool | None = None
    max_groups: int | None = None
    max_candidates_per_group: int | None = None
    max_output_values_per_candidate: int | None = None
    supports_priority: bool | None = None
    supports_lora: bool | None = None
    higher_is_better: bool | None = None
    modalities: tuple[Modality, ...] = ()
    max_label_token_ids: int | None = None
    # Seam only (not on the wire): False when the model can only do label-token scoring, so a
    # request without label_token_ids is refused before acceptance.
    native_scoring: bool = field(default=True, metadata={"wire": False})


@dataclass(frozen=True)
class TaskSupport:
    embed: EmbedSupport | None = None
    classify: ClassifySupport | None = None
    score: ScoreSupport | None = None


@dataclass(frozen=True)
class ModelCard:
    """openengine.v1.ModelInfo as a backend reports it. ``None`` = cannot report."""

    model_id: str
    served_model_name: str = ""
    served_model_aliases: tuple[str, ...] = ()
    max_context_length: int | None = None
    max_output_tokens: int | None = None
    kv_block_size: int | None = None
    total_kv_blocks: int | None = None
    max_running_requests: int | None = None
    max_batched_tokens: int | None = None
    tokenizer_modes: tuple[str, ...] = ()
    supports_text_input: bool | None = None
    supports_token_ids_input: bool | None = None
    generation: GenerationSupport | None = None
    supports_lora: bool | None = None
    supports_multimodal: bool | None = None
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    tasks: TaskSupport | None = None
    # engine-specific model metadata with no portable field (v0.1.0 ModelInfo.extra)
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"wire": False})

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may use to select this model."""
        return tuple(n for n in (self.served_model_name or self.model_id, *self.served_model_aliases) if n)


# --------------------------------------------------------------------------- engine-specific extras


@dataclass(frozen=True)
class ExtraKey:
    """One engine-specific ``GenerateRequest.extra`` key: its JSON type and what it does.

    ``kind`` is one of ``bool``, ``int``, ``number``, ``string``, ``int_list``, ``string_list``.
    """

    kind: str
    doc: str


# --------------------------------------------------------------------------- identity / load


@dataclass(frozen=True)
class Parallelism:
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    data_parallel_rank: int | None = None
    data_parallel_start_rank: int | None = None
    # v0.1.0 only (revision 1's ParallelismInfo has no such field)
    decode_context_parallel_size: int | None = field(default=None, metadata={"wire": False})


@dataclass(frozen=True)
class EngineIdentity:
    engine_name: str
    engine_version: str
    role: EngineRole = EngineRole.AGGREGATED
    parallelism: Parallelism = field(default_factory=Parallelism)
    max_loras: int | None = None  # resident LoRA adapters at once (v0.1.0 DeploymentCapacity)
    # engine-specific server metadata with no portable field (v0.1.0 ServerInfo.extra)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RankLoad:
    data_parallel_rank: int | None = None
    running_requests: int | None = None
    queued_requests: int | None = None
    used_kv_blocks: int | None = None
    total_kv_blocks: int | None = None
    prefill_batch_size: int | None = None
    decode_batch_size: int | None = None


@dataclass(frozen=True)
class LoadSnapshot:
    """openengine.v1.LoadInfo without instance_id (the service adds it). ``None`` = unavailable."""

    timestamp_unix_nanos: int | None = None
    running_requests: int | None = None
    queued_requests: int | None = None
    active_kv_sessions: int | None = None
    used_kv_blocks: int | None = None
    total_kv_blocks: int | None = None
    running_tokens: int | None = None
    waiting_tokens: int | None = None
    prefill_batch_size: int | None = None
    decode_batch_size: int | None = None
    ranks: tuple[RankLoad, ...] = ()
    # JSON-typed values (str, int, float, bool): revision 1 sends them as strings, v0.1.0 as a Struct
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthCheckResult:
    name: str
    state: HealthState
    message: str = ""


# --------------------------------------------------------------------------- KV


@dataclass(frozen=True)
class KvEndpoint:
    host: str
    port: int
    protocol: str = ""


@dataclass(frozen=True)
class KvSession:
    """openengine.v1.KvSessionRef; ``attributes`` is the JSON-like value of attributes_struct."""

    session_id: str
    transfer_backend: str = ""
    endpoints: tuple[KvEndpoint, ...] = ()
    dp_rank: int = 0
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KvConnector:
    enabled: bool | None = None
    transfer_backend: str = ""
    local_endpoints: tuple[KvEndpoint, ...] = ()
    supported_protocols: tuple[str, ...] = ()
    supports_remote_prefill: bool | None = None
    supports_decode_pull: bool | None = None
    supports_abort_cleanup: bool | None = None
    supports_drain: bool | None = None
    schema_version: int | None = None


@dataclass(frozen=True)
class KvEventSourceInfo:
    transport: str
    endpoint_addr: KvEndpoint
    topic: str = ""
    replay_endpoint: str = ""
    data_parallel_rank: int | None = None
    encoding: str = ""
    schema_version: int | None = None
    buffer_steps: int | None = None
    hwm: int | None = None
    max_queue_size: int | None = None


@dataclass(frozen=True)
class BlockHash:
    value: bytes
    encoding: str  # int64, string, bytes, engine_specific


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    lora_id: int = 0
    lora_name: str = ""
    medium: StorageMedium = StorageMedium.UNSPECIFIED
    extra_keys: tuple[tuple[str, ...], ...] = ()
    group_idx: int = 0
    kv_cache_spec_kind: str = ""
    kv_cache_spec_sliding_window: int = 0


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: StorageMedium = StorageMedium.UNSPECIFIED
    group_idx: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True)
class KvEventData:
    event: BlockStored | BlockRemoved | AllBlocksCleared
    request_id: str = ""
    kv_session: KvSession | None = None


@dataclass(frozen=True)
class KvEventBatchData:
    sequence_number: int
    timestamp_unix_nanos: int
    data_parallel_rank: int
    events: tuple[KvEventData, ...]


@dataclass(frozen=True)
class RuntimeEventData:
    event_id: str
    timestamp_unix_nanos: int
    type: RuntimeEventType
    attributes: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- generation input


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    num_sequences: int = 1


@dataclass(frozen=True, slots=True)
class Stopping:
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop_texts: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool | None = None
    include_stop_in_output: bool | None = None


@dataclass(frozen=True, slots=True)
class CandidateSelection:
    mode: CandidateMode
    top_n: int = 0
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    prompt: bool = False
    prompt_candidates: CandidateSelection | None = None
    prompt_start: int | None = None
    output: bool = False
    output_candidates: CandidateSelection | None = None


@dataclass(frozen=True, slots=True)
class Guided:
    """One structured-output constraint; ``value`` is the schema/regex/grammar/tag text, or the
    choices for CHOICE, or ``None`` for JSON_OBJECT."""

    mode: GuidedMode
    value: str | tuple[str, ...] | None
    backend: str = ""


@dataclass(frozen=True, slots=True)
class Media:
    modality: Modality
    url: str | None = None
    data_uri: str | None = None
    raw_bytes: bytes | None = None
    mime_type: str = ""
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class GenerateParams:
    request_id: str
    model: str
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    sampling: Sampling = Sampling()
    stopping: Stopping = Stopping()
    logprobs: LogprobRequest = LogprobRequest()
    guided: Guided | None = None
    media: tuple[Media, ...] = ()
    lora_name: str = ""
    priority: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    kv_session: KvSession | None = None
    data_parallel_rank: int | None = None
    bypass_prefix_cache: bool | None = None
    cache_salt: str | None = None
    # v0.1.0 GenerateRequest.extra, already checked against EngineBackend.request_extra
    extra: Mapping[str, Any] = field(default_factory=dict)
    # W3C Trace Context (traceparent, tracestate) for engines that take trace headers
    trace_headers: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- generation output


@dataclass(slots=True)
class Candidate:
    token_id: int
    logprob: float
    token: str = ""
    rank: int | None = None


@dataclass(slots=True)
class TokenLogprob:
    """Score of one emitted or prompt token; ``logprob``/``rank`` ``None`` when not computed."""

    logprob: float | None = None
    rank: int | None = None
    candidates: list[Candidate] = field(default_factory=list)


@dataclass(slots=True)
class StopMatch:
    stop_token_id: int | None = None
    stop_text: str | None = None
    eos_token_id: int | None = None


@dataclass(slots=True)
class OutputDelta:
    """New tokens of one output since the previous chunk (never cumulative).

    ``tokens`` (token strings) and ``logprobs`` are either ``None`` or aligned with ``token_ids``.
    ``finish_reason`` set means this output is done; ``stop`` says what matched on STOP.
    """

    index: int
    token_ids: Sequence[int] = ()
    text: str = ""
    tokens: Sequence[str] | None = None
    logprobs: Sequence[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop: StopMatch | None = None
    finish_message: str = ""


@dataclass(slots=True)
class PromptToken:
    token_id: int
    token: str = ""
    logprob: TokenLogprob | None = None


@dataclass(slots=True)
class GenerationChunk:
    """Everything one engine step produced for one request."""

    outputs: list[OutputDelta] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    reasoning_tokens: int | None = None
    prompt: list[PromptToken] | None = None
    prefill_ready: KvSession | None = None


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True, slots=True)
class TaskItem:
    """One TaskInput: exactly one of text / token_ids / media (with an optional prompt)."""

    item_id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    media: tuple[Media, ...] = ()


@dataclass(frozen=True, slots=True)
class TaskContext:
    request_id: str
    model: str
    lora_name: str = ""
    priority: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbedParams:
    context: TaskContext
    inputs: tuple[TaskItem, ...]
    granularity: Granularity | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    encoding: EmbeddingEncoding | None = None


@dataclass(frozen=True)
class ClassifyParams:
    context: TaskContext
    inputs: tuple[TaskItem, ...]
    granularity: Granularity | None = None
    semantics: ValueSemantics | None = None


@dataclass(frozen=True)
class ScoreGroupInput:
    group_id: str
    query: TaskItem
    candidates: tuple[TaskItem, ...]


@dataclass(frozen=True)
class ScoreParams:
    context: TaskContext
    groups: tuple[ScoreGroupInput, ...]
    granularity: Granularity | None = None
    semantics: ValueSemantics | None = None
    normalization: ScoreNormalization = ScoreNormalization.UNSPECIFIED
    label_token_ids: tuple[int, ...] = ()
    instruction: str = ""


@dataclass(slots=True)
class DenseTensor:
    shape: tuple[int, ...]
    values: Sequence[float]


@dataclass(slots=True)
class SparseTensor:
    shape: tuple[int, ...]
    indices: Sequence[int]
    values: Sequence[float]


@dataclass(slots=True)
class TaskUsageData:
    input_tokens: int = 0
    cached_input_tokens: int | None = None


@dataclass(slots=True)
class Embedding:
    granularity: Granularity
    tensor: DenseTensor | SparseTensor
    token_ids: Sequence[int] = ()


@dataclass(slots=True)
class EmbedResult:
    """One ``Embedding`` per input, in request order."""

    outputs: list[Embedding]
    usage: TaskUsageData = field(default_factory=TaskUsageData)


@dataclass(slots=True)
class Classification:
    granularity: Granularity
    semantics: ValueSemantics
    scores: DenseTensor
    labels: Sequence[str] = ()
    token_ids: Sequence[int] = ()


@dataclass(slots=True)
class ClassifyResult:
    outputs: list[Classification]
    usage: TaskUsageData = field(default_factory=TaskUsageData)


@dataclass(slots=True)
class CandidateScore:
    scores: DenseTensor
    token_ids: Sequence[int] = ()


@dataclass(slots=True)
class ScoreResult:
    """``groups[g][c]`` scores candidate c of group g, both in request order."""

    groups: list[list[CandidateScore]]
    granularity: Granularity
    semantics: ValueSemantics
    normalization: ScoreNormalization
    higher_is_better: bool | None = None
    label_token_ids: Sequence[int] = ()
    usage: TaskUsageData = field(default_factory=TaskUsageData)


# --------------------------------------------------------------------------- LoRA


@dataclass(frozen=True)
class LoraAdapterInfo:
    lora_id: int
    lora_name: str
    source_path: str


# --------------------------------------------------------------------------- the interface


class EngineBackend(abc.ABC):
    """One engine behind the OpenEngine service.

    ``features`` declares which optional method groups are implemented; the service answers
    UNIMPLEMENTED for the rest without calling them.
    """

    features: frozenset[Feature] = frozenset()
    # the engine-specific GenerateRequest.extra keys (v0.1.0) this adapter applies, by name; the
    # service refuses a known key of the wrong type and ignores unknown keys, as the spec says
    request_extra: Mapping[str, ExtraKey] = {}
    # why this engine's DECODE role cannot serve a request without a KV session (v0.1.0 conditional
    # disaggregation, validation.leniency); None: it serves it as a local request
    local_decode_refusal: str | None = None

    # identity and discovery ------------------------------------------------
    @abc.abstractmethod
    def identity(self) -> EngineIdentity: ...

    @abc.abstractmethod
    def models(self) -> Sequence[ModelCard]:
        """Every served model; the first is the default."""

    def kv_connector(self) -> KvConnector | None:
        """The configured KV connector, ``None`` when the engine has none."""
        return None

    # lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Called once before the server accepts calls."""

    async def shutdown(self) -> None:
        """Called once after the server stopped."""

    async def check_health(self) -> list[HealthCheckResult]:
        """Cheap liveness checks (scheduler, model, kv_connector...); never raises."""
        return []

    def dead(self) -> str | None:
        """Why the engine can serve nothing more (its process died), or None while it lives. Polled
        by the server's watchdog (cheap, never raises): a reason ends every open stream and
        subscription with one terminal retryable error and turns Health NOT_READY."""
        return None

    async def probe(self, model: str, role: EngineRole) -> None:
        """A minimal role-appropriate inference; raise to report failure.

        The default runs a 1-token generation (AGGREGATED) or a 1-token prefill whose KV session
        is released at once (PREFILL). A DECODE probe needs a session, so adapters that can
        decode without one override this.
        """
        if role == EngineRole.DECODE:
            raise RuntimeError("this adapter has no decode probe without a KV session")
        stream = await self.generate(
            GenerateParams(
                request_id=f"openengine-health-probe-{time.monotonic_ns()}",
                model=model,
                token_ids=(1,),
                sampling=Sampling(temperature=0.0),
                stopping=Stopping(max_tokens=1, ignore_eos=True),
            )
        )
        produced, session = 0, None
        async for chunk in stream:
            produced += sum(len(o.token_ids) for o in chunk.outputs)
            session = chunk.prefill_ready or session
        if role == EngineRole.PREFILL:
            if session is None:
                raise RuntimeError("prefill probe ended without a KV session")
            await self.release_kv_session(session)
        elif produced < 1:
            raise RuntimeError("probe produced no token")

    # generation and tasks ------------------------------------------------------
    async def validate_generate(self, params: GenerateParams) -> None:
        """Engine-specific checks before acceptance; raise ``RequestRejected``."""

    async def generate(self, params: GenerateParams) -> AsyncIterator[GenerationChunk]:
        """Submit the request (may raise ``RequestRejected``) and return its chunk stream."""
        raise NotImplementedError

    async def embed(self, params: EmbedParams) -> EmbedResult:
        raise NotImplementedError

    async def classify(self, params: ClassifyParams) -> ClassifyResult:
        raise NotImplementedError

    async def score(self, params: ScoreParams) -> ScoreResult:
        raise NotImplementedError

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Stop the engine work of these requests (already-finished ids are ignored)."""
        raise NotImplementedError

    async def release_kv_session(self, session: KvSession) -> bool:
        """Free engine-held KV state of a session; ``False`` when the engine does not know it."""
        return False

    def open_kv_sessions(self) -> int | None:
        """Sessions the engine still holds KV for; ``None`` when unknown."""
        return None

    # load and events -----------------------------------------------------------
    async def load(self, per_rank: bool) -> LoadSnapshot:
        raise NotImplementedError

    def kv_event_sources(self, ranks: Sequence[int]) -> list[KvEventSourceInfo]:
        raise NotImplementedError

    def kv_events(
        self, ranks: Sequence[int], include_snapshot: bool, start_sequence_number: int
    ) -> AsyncIterator[KvEventBatchData]:
        """Typed KV batches; raise ``EngineFailure`` to end the subscription with an error."""
        raise NotImplementedError

    def runtime_events(self, types: Sequence[RuntimeEventType]) -> AsyncIterator[RuntimeEventData]:
        """Runtime events of these types (all when empty); ``EngineFailure`` ends the stream."""
        raise NotImplementedError

    # LoRA ----------------------------------------------------------------------
    async def load_lora(self, adapter: LoraAdapterInfo) -> None:
        """Load and validate the adapter (the service has checked the spec's rules)."""
        raise NotImplementedError

    async def unload_lora(self, adapter: LoraAdapterInfo) -> None:
        raise NotImplementedError

    async def list_loras(self) -> list[LoraAdapterInfo]:
        return []
