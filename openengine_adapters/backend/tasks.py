"""Embed, Classify and Score: the params a backend receives and the results it returns
(``messages.tasks`` checks them and builds the responses)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from openengine_adapters.backend.generation import Media
from openengine_adapters.types import EmbeddingEncoding, Granularity, ScoreNormalization, ValueSemantics


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
