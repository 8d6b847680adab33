"""TensorRT-LLM KV-cache events -> typed KV batches.

``LLM.get_kv_cache_events_async`` is a single-consumer queue that drains on read; the backend's
poller (``polling``) is its only reader and feeds ``KvEventTranslator``, which puts typed batches
on the shared ``kv_events.KvEventBridge`` (per-rank sequence numbers, replay ring, snapshots,
subscribers), synthesizing ``AllBlocksCleared`` when the engine (re)creates its cache or event ids
show a gap (events lost in the engine's bounded buffer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.kv_events.bridge import KvEventBridge
from openengine_adapters.types import StorageMedium

log = logging.getLogger(__name__)


def block_hash(value: int) -> be.BlockHash:
    """TensorRT-LLM block hashes are 64-bit integers (signed or unsigned): 8 bytes, int64."""
    v = int(value) & (2**64 - 1)
    return be.BlockHash(v.to_bytes(8, "big"), "int64")


def medium(cache_level: Any) -> StorageMedium:
    """TensorRT-LLM cache levels: 0 = GPU (primary), 1 = host (secondary offload)."""
    return {0: StorageMedium.GPU, 1: StorageMedium.CPU_PINNED}.get(cache_level, StorageMedium.UNSPECIFIED)


@dataclass(slots=True)
class _Block:
    parent: int | None
    tokens: tuple[int, ...]
    medium: StorageMedium
    lora_id: int
    rank: int


class KvEventTranslator:
    """Engine KV-cache event dicts -> typed batches on the shared ``KvEventBridge`` (sequence
    numbers, replay ring, live-block snapshots and subscribers live there)."""

    def __init__(self, ranks: Iterable[int], replay_size: int = 4096, hub_queue_size: int = 4096) -> None:
        self.bridge = KvEventBridge.polled(ranks, ring_size=replay_size, subscriber_queue=hub_queue_size)
        self.blocks: dict[int, _Block] = {}  # what a "removed" / "updated" event refers to
        self.block_size = 0
        self._last_event_id: dict[int, int] = {}

    def _cleared(self, rank: int) -> be.KvEventData:
        for h in [h for h, b in self.blocks.items() if b.rank == rank]:
            del self.blocks[h]
        return be.KvEventData(be.AllBlocksCleared())

    def engine_restarted(self) -> None:
        """The engine (or the poller's view of it) started over: everything cached is gone."""
        self._last_event_id.clear()
        for r in self.bridge.ranks:
            self.bridge.publish(r, [self._cleared(r)])

    def ingest(self, raw: Iterable[Mapping[str, Any]]) -> None:
        """One poll's worth of engine events: one batch per DP rank, in engine order."""
        per_rank: dict[int, list[be.KvEventData]] = {}
        for ev in raw:
            rank = int(ev.get("attention_dp_rank") or 0)
            if rank not in self.bridge.ranks:
                log.warning("KV event for attention DP rank %d outside ranks %s: dropped", rank, self.bridge.ranks)
                continue
            out = per_rank.setdefault(rank, [])
            eid = ev.get("event_id")
            if isinstance(eid, int):
                last = self._last_event_id.get(rank)
                if last is not None and eid != last + 1:
                    out.append(self._cleared(rank))  # lost or restarted: nothing we track holds
                self._last_event_id[rank] = eid
            for item in self._translate(ev.get("data") or {}, rank):
                if not (isinstance(item.event, be.AllBlocksCleared) and out
                        and isinstance(out[-1].event, be.AllBlocksCleared)):
                    out.append(item)  # a restart is both a gap and "created": one clear
        for rank, events in per_rank.items():
            if events:
                self.bridge.publish(rank, events)

    def _translate(self, data: Mapping[str, Any], rank: int) -> list[be.KvEventData]:
        kind = data.get("type")
        if kind == "created":
            return [self._cleared(rank)]
        if kind == "stored":
            out = []
            parent = data.get("parent_hash")
            for blk in data.get("blocks") or ():
                h = blk["block_hash"]
                tokens = tuple(int(t["token_id"]) if isinstance(t, Mapping) else int(t)
                               for t in blk.get("tokens") or ())
                self.block_size = self.block_size or len(tokens)
                m = medium(blk.get("cache_level", 0))
                lora = int(blk.get("lora_id") or 0)
                self.blocks[h] = _Block(parent, tokens, m, lora, rank)
                out.append(be.KvEventData(self._stored(h, parent, tokens, m, lora)))
                parent = h
            return out
        if kind == "removed":
            hashes = list(data.get("block_hashes") or ())
            groups: dict[StorageMedium, list[int]] = {}
            for h in hashes:
                b = self.blocks.pop(h, None)
                groups.setdefault(b.medium if b is not None else StorageMedium.GPU, []).append(h)
            return [be.KvEventData(be.BlockRemoved(tuple(block_hash(h) for h in hs), m))
                    for m, hs in groups.items()]
        if kind == "updated":
            level = data.get("cache_level")
            h = data.get("block_hash")
            b = self.blocks.get(h)
            if not isinstance(level, Mapping) or b is None:
                return []  # priority-only updates do not change what is cached where
            new = medium(level.get("new_value", level.get("new")))
            if new == b.medium:
                return []
            old, b.medium = b.medium, new
            return [be.KvEventData(be.BlockRemoved((block_hash(h),), old)),
                    be.KvEventData(self._stored(h, b.parent, b.tokens, new, b.lora_id))]
        return []

    def _stored(self, h: int, parent: int | None, tokens: tuple[int, ...], m: StorageMedium,
                lora: int) -> be.BlockStored:
        return be.BlockStored((block_hash(h),), block_hash(parent) if parent is not None else None,
                              tokens, len(tokens) or self.block_size, lora, "", m)
