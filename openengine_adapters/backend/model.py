"""What a served model can do: the ``ModelCard`` (``ModelInfo``) with its capability tables, the
one table that discovery advertises and validation enforces, and the LoRA adapters loaded onto it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    Granularity,
    GuidedMode,
    Modality,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)


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
    # the modalities a multimodal model takes (empty: any); no wire field, so what validation checks
    media_modalities: tuple[Modality, ...] = field(default=(), metadata={"wire": False})
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    tasks: TaskSupport | None = None
    # engine-specific model metadata with no portable field (v0.1.0 ModelInfo.extra)
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"wire": False})

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may use to select this model."""
        return tuple(n for n in (self.served_model_name or self.model_id, *self.served_model_aliases) if n)


# --------------------------------------------------------------------------- LoRA


@dataclass(frozen=True)
class LoraAdapterInfo:
    lora_id: int
    lora_name: str
    source_path: str
