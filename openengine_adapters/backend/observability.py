"""What the service observes of an engine: its load, its health checks and its runtime events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.types import HealthState, RuntimeEventType


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


@dataclass(frozen=True)
class RuntimeEventData:
    event_id: str
    timestamp_unix_nanos: int
    type: RuntimeEventType
    attributes: Mapping[str, str] = field(default_factory=dict)
