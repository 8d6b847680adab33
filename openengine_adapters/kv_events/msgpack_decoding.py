"""Decoding of engine-native msgpack KV-event batches (vLLM and SGLang ZMQ publishers).

Pure functions, no I/O. Everything is read BY KEY NAME because both publishers encode with
``omit_defaults``: a key equal to its default is simply absent. Layouts accepted:

* batch: an array ``[ts, events, dp_rank?]`` (msgspec ``array_like``) or a map with ``ts``,
  ``events`` and ``data_parallel_rank``/``dp_rank``/``attn_dp_rank``;
* event: a map tagged ``"type"`` (vLLM 0.32, SGLang) or an ``array_like`` tagged array
  ``[tag, field...]`` in the historical field order (older vLLM and SGLang releases).

Hashes become ``BlockHash``: an int is its 8-byte big-endian value (``int64``; a negative int is
its two's complement), bytes stay ``bytes``, text is ``string``. An unknown event type, or an
event whose fields have the wrong types, is skipped and counted in ``DecodeStats``; it never
raises. Only a payload that is not a batch at all raises ``DecodeError``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from openengine_adapters.backend import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvEventBatchData,
    KvEventData,
)
from openengine_adapters.types import StorageMedium


class DecodeError(ValueError):
    """The payload is not a KV-event batch."""


@dataclass
class DecodeStats:
    batches: int = 0
    events: int = 0
    unknown_events: Counter = field(default_factory=Counter)  # type tag -> count
    malformed_events: int = 0

    @property
    def skipped(self) -> int:
        return sum(self.unknown_events.values()) + self.malformed_events


_MEDIUM = {
    "GPU": StorageMedium.GPU,
    "CPU": StorageMedium.CPU_PINNED,
    "CPU_PINNED": StorageMedium.CPU_PINNED,
    "DISK": StorageMedium.DISK,
}

# Positional field order of the historical array_like (``[tag, ...]``) event encodings.
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def medium(value: Any) -> StorageMedium:
    """Engine medium string -> ``StorageMedium`` (absent -> UNSPECIFIED, unknown -> EXTERNAL)."""
    if value is None or value == "":
        return StorageMedium.UNSPECIFIED
    if isinstance(value, int) and not isinstance(value, bool):
        return StorageMedium(value) if value in StorageMedium._value2member_map_ else StorageMedium.EXTERNAL
    name = str(value).upper()
    if name.startswith("STORAGE_MEDIUM_"):
        name = name[len("STORAGE_MEDIUM_"):]
    return _MEDIUM.get(name, StorageMedium.EXTERNAL)


def block_hash(value: Any) -> BlockHash:
    if isinstance(value, bool):
        raise TypeError("a block hash cannot be a bool")
    if isinstance(value, int):
        if 0 <= value < 1 << 64:
            return BlockHash(value.to_bytes(8, "big"), "int64")
        if -(1 << 63) <= value < 0:
            return BlockHash(value.to_bytes(8, "big", signed=True), "int64")
        return BlockHash(value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True), "engine_specific")
    if isinstance(value, bytes | bytearray | memoryview):
        return BlockHash(bytes(value), "bytes")
    if isinstance(value, str):
        return BlockHash(value.encode("utf-8"), "string")
    raise TypeError(f"unsupported block hash {type(value).__name__}")


def _opaque(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return json.dumps(value, separators=(",", ":"), default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


def extra_keys(value: Any) -> tuple[tuple[str, ...], ...]:
    """vLLM's per-block ``extra_keys`` (a tuple or None per block) -> one string tuple per block."""
    if not value:
        return ()
    out = []
    for entry in value:
        if entry is None:
            out.append(())
        elif isinstance(entry, list | tuple):
            out.append(tuple(_opaque(v) for v in entry))
        else:
            out.append((_opaque(entry),))
    return tuple(out)


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return value


def _ints(values: Sequence[Any]) -> tuple[int, ...]:
    out = tuple(values)
    if not all(type(v) is int for v in out):
        raise TypeError("token_ids must be integers")
    return out


def _str(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise TypeError("block_hashes must be an array")
    return tuple(block_hash(h) for h in value)


def _tag(tag: Any) -> str:
    text = tag.decode("utf-8", "replace") if isinstance(tag, bytes) else str(tag)
    return {"blockstored": "BlockStored", "blockremoved": "BlockRemoved",
            "allblockscleared": "AllBlocksCleared"}.get(text.replace("_", "").lower(), text)


def decode_event(raw: Any) -> BlockStored | BlockRemoved | AllBlocksCleared | str:
    """One event; returns the unknown type tag (a str) instead of raising for unknown types.

    Raises ``TypeError``/``ValueError`` for a known type with malformed fields.
    """
    if isinstance(raw, Mapping):
        tag = _tag(raw.get("type", ""))
        fields = raw
    elif isinstance(raw, list | tuple) and raw:
        tag = _tag(raw[0])
        names = _ARRAY_FIELDS.get(tag)
        if names is None:
            return tag
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise TypeError(f"an event must be a map or a tagged array, got {type(raw).__name__}")
    get = fields.get
    if tag == "BlockStored":
        parent = get("parent_block_hash")
        token_ids = get("token_ids") or ()
        if not isinstance(token_ids, list | tuple):
            raise TypeError("token_ids must be an array")
        return BlockStored(
            block_hashes=_hashes(get("block_hashes")),
            parent_block_hash=None if parent is None else block_hash(parent),
            token_ids=_ints(token_ids),
            block_size=_int(get("block_size")),
            lora_id=_int(get("lora_id")),
            lora_name=_str(get("lora_name")),
            medium=medium(get("medium")),
            extra_keys=extra_keys(get("extra_keys")),
            group_idx=_int(get("group_idx")),
            kv_cache_spec_kind=_str(get("kv_cache_spec_kind")),
            kv_cache_spec_sliding_window=_int(get("kv_cache_spec_sliding_window")),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(block_hashes=_hashes(get("block_hashes")), medium=medium(get("medium")),
                            group_idx=_int(get("group_idx")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return tag


def _timestamp_ns(ts: Any) -> int:
    if ts is None:
        return 0
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise DecodeError(f"bad batch timestamp {ts!r}")
    if isinstance(ts, int) and ts > 10**14:  # already nanoseconds
        return ts
    return int(round(ts * 1e9))


def decode_batch(payload: bytes | Any, sequence_number: int, data_parallel_rank: int | None = None,
                 stats: DecodeStats | None = None) -> KvEventBatchData:
    """A msgpack payload (or an already unpacked object) -> ``KvEventBatchData``.

    ``data_parallel_rank`` is the rank of the source the payload came from; it wins over the
    rank inside the payload (the publisher of one socket is one rank). When None, the payload's
    rank is used (0 if absent).
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:
            raise DecodeError(f"payload is not msgpack: {exc}") from exc
    else:
        obj = payload
    if isinstance(obj, Mapping):
        ts, events = obj.get("ts"), obj.get("events")
        rank = next((obj[k] for k in ("data_parallel_rank", "dp_rank", "attn_dp_rank") if obj.get(k) is not None),
                    None)
    elif isinstance(obj, list | tuple) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise DecodeError(f"a batch must be [ts, events, dp_rank] or a map, got {type(obj).__name__}")
    if events is None:
        events = ()
    if not isinstance(events, Sequence) or isinstance(events, str | bytes):
        raise DecodeError("batch events must be an array")
    if data_parallel_rank is None:
        data_parallel_rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else 0
    stats = stats if stats is not None else DecodeStats()
    out = []
    for raw in events:
        try:
            ev = decode_event(raw)
        except (TypeError, ValueError, OverflowError):
            stats.malformed_events += 1
            continue
        if isinstance(ev, str):
            stats.unknown_events[ev] += 1
            continue
        out.append(KvEventData(ev))
    stats.batches += 1
    stats.events += len(out)
    return KvEventBatchData(sequence_number, _timestamp_ns(ts), data_parallel_rank, tuple(out))
