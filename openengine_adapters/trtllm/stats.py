"""TensorRT-LLM iteration stats and KV-cache events -> load snapshots, runtime events, KV batches.

Both engine sources are single-consumer queues that drain on read (``LLM.get_stats_async`` and
``LLM.get_kv_cache_events_async``); the backend's poller is their only reader and feeds the two
collectors here:

- ``StatsCollector`` keeps the LAST iteration-stats snapshot (an idle engine emits nothing, so
  GetLoad answers from the cache) and publishes FORWARD_PASS / BATCH / QUEUE runtime events.
- ``KvEventTranslator`` turns engine events into typed batches on the shared
  ``kv_events.KvEventBridge`` (per-rank sequence numbers, replay ring, snapshots, subscribers),
  synthesizing ``AllBlocksCleared`` when the engine (re)creates its cache or event ids show a gap
  (events lost in the engine's bounded buffer).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.events import EventHub
from openengine_adapters.kv_events.bridge import KvEventBridge
from openengine_adapters.trtllm.translate import block_hash, medium
from openengine_adapters.types import RuntimeEventType, StorageMedium

log = logging.getLogger(__name__)


def _int(d: Mapping[str, Any] | None, key: str) -> int | None:
    if not d:
        return None
    v = d.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class StatsCollector:
    def __init__(self, hub_queue_size: int = 1024) -> None:
        self.last: dict[str, Any] | None = None
        self.last_ns: int | None = None
        self.events: EventHub[be.RuntimeEventData] = EventHub(hub_queue_size)
        self._ids = itertools.count(1)

    def _emit(self, type_: RuntimeEventType, now: int, attributes: dict[str, str]) -> None:
        self.events.publish(be.RuntimeEventData(f"trtllm-{next(self._ids)}", now, type_, attributes))

    def record(self, stat: Mapping[str, Any]) -> None:
        now = time.time_ns()
        prev = self.last
        self.last, self.last_ns = dict(stat), now
        if self.events.subscriber_count == 0:
            return
        ifb = stat.get("inflightBatchingStats") or {}
        kv = stat.get("kvCacheStats") or {}
        forward = {"iteration": str(stat.get("iter", "")),
                   "elapsed_ms": str(stat.get("iterLatencyMS", ""))}
        for key, name in (("numContextRequests", "prefill_requests"), ("numCtxTokens", "prefill_tokens"),
                          ("numGenRequests", "decode_requests"), ("numScheduledRequests", "scheduled_requests")):
            if key in ifb:
                forward[name] = str(ifb[key])
        self._emit(RuntimeEventType.FORWARD_PASS, now, forward)
        batch = {"running_requests": str(stat.get("numActiveRequests", "")),
                 "waiting_requests": str(stat.get("numQueuedRequests", ""))}
        if "usedNumBlocks" in kv:
            batch["used_kv_blocks"] = str(kv["usedNumBlocks"])
            batch["total_kv_blocks"] = str(kv.get("maxNumBlocks", ""))
        self._emit(RuntimeEventType.BATCH, now, batch)
        if prev is None or prev.get("numQueuedRequests") != stat.get("numQueuedRequests"):
            self._emit(RuntimeEventType.QUEUE, now, {"waiting_requests": str(stat.get("numQueuedRequests", "")),
                                                     "running_requests": str(stat.get("numActiveRequests", ""))})

    def snapshot(self, idle: bool, per_rank: bool, dp_size: int = 1, in_flight: int = 0) -> be.LoadSnapshot:
        """The last engine snapshot; an idle adapter (no request in flight) reports zero load,
        since the engine emits no stats once it stops iterating.

        With attention DP (``dp_size`` > 1) the stats are attention-DP rank 0's alone: each rank's
        PyExecutor counts its own requests and blocks, and only rank 0's worker forwards them
        (``executor/worker.py`` ``start``: the stats thread runs ``if mpi_rank() == 0``). They are
        reported as rank 0's; the engine-wide request count is the adapter's own (``in_flight``),
        and what only the other ranks know (their queues, blocks, batches) is left unset.
        """
        snap = self._snapshot(idle, per_rank)
        if dp_size <= 1:
            return snap
        return be.LoadSnapshot(
            timestamp_unix_nanos=snap.timestamp_unix_nanos, running_requests=in_flight,
            ranks=snap.ranks, attributes={**snap.attributes, "running_requests_source": "adapter_in_flight",
                                          "per_rank": "attention-DP rank 0 only (TensorRT-LLM 1.2 reports no other)"})

    def _snapshot(self, idle: bool, per_rank: bool) -> be.LoadSnapshot:
        s = self.last
        if s is None:
            zero = 0 if idle else None
            return be.LoadSnapshot(running_requests=zero, queued_requests=zero,
                                   attributes={"stats": "no iteration stats yet"})
        kv = s.get("kvCacheStats") or {}
        ifb = s.get("inflightBatchingStats") or {}
        running, queued = _int(s, "numActiveRequests"), _int(s, "numQueuedRequests")
        prefill, decode = _int(ifb, "numContextRequests"), _int(ifb, "numGenRequests")
        if idle:
            running, queued, prefill, decode = 0, 0, (0 if prefill is not None else None), \
                (0 if decode is not None else None)
        used, total = _int(kv, "usedNumBlocks"), _int(kv, "maxNumBlocks")
        block = _int(kv, "tokensPerBlock")
        rank = be.RankLoad(data_parallel_rank=0, running_requests=running, queued_requests=queued,
                           used_kv_blocks=used, total_kv_blocks=total, prefill_batch_size=prefill,
                           decode_batch_size=decode)
        return be.LoadSnapshot(
            timestamp_unix_nanos=self.last_ns, running_requests=running, queued_requests=queued,
            used_kv_blocks=used, total_kv_blocks=total,
            running_tokens=used * block if used is not None and block else None,
            prefill_batch_size=prefill, decode_batch_size=decode,
            ranks=(rank,) if per_rank else (),
            attributes={"iteration": _int(s, "iter"), "stale": idle} if _int(s, "iter") is not None
            else {"stale": idle},
        )


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
