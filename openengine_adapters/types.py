"""Enumerations shared across the backend seam.

Each mirrors an ``openengine.v1`` enum with the same numeric values, so converting between the
seam and the wire is an ``int()`` and a backend never needs protobuf. A unit test checks every
name and value against the generated descriptors.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class EngineRole(IntEnum):
    UNSPECIFIED = 0
    AGGREGATED = 1
    PREFILL = 2
    DECODE = 3


ROLE_BY_NAME = {"aggregated": EngineRole.AGGREGATED, "prefill": EngineRole.PREFILL,
                "decode": EngineRole.DECODE}


class CandidateMode(IntEnum):
    """openengine.v1.CandidateTokenSelectionMode."""

    UNSPECIFIED = 0
    TOP_N = 1
    TOKEN_IDS = 2
    ALL = 3


class GuidedMode(IntEnum):
    """openengine.v1.GuidedDecodingMode."""

    UNSPECIFIED = 0
    JSON_SCHEMA = 1
    REGEX = 2
    EBNF_GRAMMAR = 3
    STRUCTURAL_TAG = 4
    CHOICE = 5
    JSON_OBJECT = 6


class TaskInputType(IntEnum):
    UNSPECIFIED = 0
    TEXT = 1
    TOKEN_IDS = 2
    MULTIMODAL = 3


class Granularity(IntEnum):
    """openengine.v1.TaskOutputGranularity."""

    UNSPECIFIED = 0
    SEQUENCE = 1
    TOKEN = 2


class EmbeddingEncoding(IntEnum):
    UNSPECIFIED = 0
    DENSE = 1
    SPARSE = 2


class ValueSemantics(IntEnum):
    """openengine.v1.TaskValueSemantics."""

    UNSPECIFIED = 0
    LOGITS = 1
    PROBABILITIES = 2
    LOG_PROBABILITIES = 3
    SIMILARITY = 4
    RELEVANCE = 5
    REWARD = 6
    MODEL_DEFINED = 7


class ScoreNormalization(IntEnum):
    UNSPECIFIED = 0
    NONE = 1
    SOFTMAX = 2


class Modality(IntEnum):
    UNSPECIFIED = 0
    IMAGE = 1
    VIDEO = 2
    AUDIO = 3


class FinishReason(IntEnum):
    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2
    CANCELLED = 3


class HealthState(IntEnum):
    UNSPECIFIED = 0
    STARTING = 1
    READY = 2
    DEGRADED = 3
    DRAINING = 4
    NOT_READY = 5


class StorageMedium(IntEnum):
    UNSPECIFIED = 0
    GPU = 1
    CPU_PINNED = 2
    DISK = 3
    EXTERNAL = 4


class RuntimeEventType(IntEnum):
    UNSPECIFIED = 0
    FORWARD_PASS = 1
    BATCH = 2
    QUEUE = 3
    TRANSFER = 4


class ErrorCode(IntEnum):
    UNSPECIFIED = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED_FEATURE = 2
    ROLE_MISMATCH = 3
    MODEL_NOT_FOUND = 4
    OVERLOADED = 5
    REQUEST_NOT_FOUND = 6
    DUPLICATE_REQUEST = 7
    KV_SESSION_NOT_FOUND = 8
    KV_TRANSFER_FAILED = 9
    CANCELLED = 10
    DRAINING = 11
    INTERNAL = 12


class Feature(Enum):
    """What a backend implements at all. A missing feature is answered with UNIMPLEMENTED.

    Per-model support (tasks, LoRA, logprob modes, ...) is declared in ``ModelCard`` instead and
    answered with the spec's FAILED_PRECONDITION / INVALID_ARGUMENT.
    """

    GENERATE = "generate"
    EMBED = "embed"
    CLASSIFY = "classify"
    SCORE = "score"
    ABORT = "abort"
    LORA = "lora"
    LOAD = "load"
    KV_EVENT_SOURCES = "kv_event_sources"
    KV_EVENTS = "kv_events"
    RUNTIME_EVENTS = "runtime_events"
