"""KV cache state that crosses the seam: the connector, handed-off sessions, event sources and the
block events an engine publishes for KV-aware routing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.types import StorageMedium


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
