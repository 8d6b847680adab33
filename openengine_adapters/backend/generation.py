"""One generation: ``GenerateParams`` in, ``GenerationChunk``s out, and the engine-specific
``GenerateRequest.extra`` keys an adapter applies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.backend.kv import KvSession
from openengine_adapters.types import CandidateMode, FinishReason, GuidedMode, Modality


@dataclass(frozen=True)
class ExtraKey:
    """One engine-specific ``GenerateRequest.extra`` key: its JSON type and what it does.

    ``kind`` is one of ``bool``, ``int``, ``number``, ``string``, ``int_list``, ``string_list``.
    """

    kind: str
    doc: str


# --------------------------------------------------------------------------- input


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


# --------------------------------------------------------------------------- output


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
