"""TensorRT-LLM iteration stats -> load snapshots and runtime events.

``LLM.get_stats_async`` is a single-consumer queue that drains on read; the backend's poller
(``polling``) is its only reader and feeds ``StatsCollector``, which keeps the LAST snapshot (an
idle engine emits nothing, so GetLoad answers from the cache) and publishes FORWARD_PASS / BATCH /
QUEUE runtime events. KV-cache events are translated in ``kv_events``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.event_hub import EventHub
from openengine_adapters.types import RuntimeEventType


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
