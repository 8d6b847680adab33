"""SGLang load snapshots -> BATCH / QUEUE runtime events, by polling them.

SGLang 0.5.23 exposes no per-forward-pass record to the tokenizer process. What it does publish is a
``LoadSnapshot`` per DP rank (shared memory, what ``TokenizerManager.get_loads`` reads; read here
off the event loop, ``load_reading``): the scheduler writes one after every prefill batch, every
``--load-snapshot-publish-interval`` decode batches, and when it idles. This poller reads them every
``interval`` seconds (only while someone is subscribed) and publishes, per rank:

- BATCH for each new snapshot (its SGLang timestamp changed): running/waiting requests, KV tokens;
- QUEUE when the waiting count changed since the last snapshot seen.

Snapshots written between two polls are not seen (the newest wins), so this is a sampled view,
not one event per scheduler step; FORWARD_PASS is never emitted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from openengine_adapters.backend import RuntimeEventData
from openengine_adapters.event_hub import EventHub
from openengine_adapters.sglang.load_reading import LoadReads
from openengine_adapters.types import RuntimeEventType

log = logging.getLogger(__name__)


class LoadPoller:
    def __init__(self, reads: LoadReads, interval: float, page_size: int = 1, hub_queue_size: int = 1024) -> None:
        self.reads = reads
        self.interval = interval
        self.page_size = max(1, int(page_size or 1))
        self.events: EventHub[RuntimeEventData] = EventHub(hub_queue_size)
        self._ids = itertools.count(1)
        self._seen: dict[int, float] = {}      # dp rank -> timestamp of the last snapshot published
        self._waiting: dict[int, int] = {}     # dp rank -> waiting count of that snapshot
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self.events.subscriber_count == 0:
                continue
            try:
                loads = await self.reads.snapshots()
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine is going away; the next poll tells
                log.debug("SGLang get_loads failed", exc_info=True)
                continue
            if loads is not None:  # None: a stopped scheduler holds the lock, nothing new to publish
                self.observe(loads)

    def observe(self, loads) -> None:
        """Publish the events for one ``get_loads`` result (one snapshot per DP rank)."""
        for snap in loads:
            rank = int(getattr(snap, "dp_rank", 0) or 0)
            stamp = float(getattr(snap, "timestamp", 0.0) or 0.0)
            if self._seen.get(rank) == stamp:
                continue
            self._seen[rank] = stamp
            now = int(stamp * 1e9) if stamp else time.time_ns()
            running = int(snap.num_running_reqs)
            waiting = int(snap.num_waiting_reqs)
            common = {"data_parallel_rank": str(rank), "running_requests": str(running),
                      "waiting_requests": str(waiting)}
            used = int(snap.num_used_tokens)
            self._emit(RuntimeEventType.BATCH, now, {
                **common,
                "used_kv_tokens": str(used),
                "used_kv_blocks": str(-(-used // self.page_size)),
                "max_kv_tokens": str(int(snap.max_total_num_tokens)),
                "kv_cache_usage": f"{float(snap.token_usage):.6f}",
                "waiting_uncached_tokens": str(int(snap.num_waiting_uncached_tokens)),
                "gen_throughput": f"{float(snap.gen_throughput):.3f}",
                "cache_hit_rate": f"{float(snap.cache_hit_rate):.6f}",
                "total_prefill_uncached_tokens": str(int(snap.total_prefill_uncached_tokens)),
                "source": "sglang_load_snapshot",
            })
            if self._waiting.get(rank) != waiting:
                self._waiting[rank] = waiting
                self._emit(RuntimeEventType.QUEUE, now, {
                    **common, "waiting_uncached_tokens": str(int(snap.num_waiting_uncached_tokens))})

    def _emit(self, type_: RuntimeEventType, now: int, attributes: dict[str, str]) -> None:
        self.events.publish(RuntimeEventData(f"sglang-{next(self._ids)}", now, type_, attributes))
