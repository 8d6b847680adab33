"""vLLM scheduler stats -> the last load snapshot per engine, and runtime events.

vLLM calls a ``StatLoggerBase`` once per engine step, in the frontend's event loop. The
collector keeps the newest ``SchedulerStats`` per data-parallel rank (GetLoad) and publishes
FORWARD_PASS / BATCH / QUEUE runtime events to the service's subscribers.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from openengine_adapters.backend import RuntimeEventData
from openengine_adapters.event_hub import EventHub
from openengine_adapters.types import RuntimeEventType


@dataclass
class RankStats:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefill_batch: int | None = None
    decode_batch: int | None = None
    updated_ns: int = 0


class StatsCollector:
    def __init__(self, hub_queue_size: int = 1024) -> None:
        self.ranks: dict[int, RankStats] = {}
        self.events: EventHub[RuntimeEventData] = EventHub(hub_queue_size)
        self._ids = itertools.count(1)

    def _emit(self, type_: RuntimeEventType, now: int, attributes: dict[str, str]) -> None:
        self.events.publish(RuntimeEventData(f"vllm-{next(self._ids)}", now, type_, attributes))

    def record(self, scheduler_stats, iteration_stats, engine_idx: int) -> None:
        if scheduler_stats is None:
            return
        now = time.time_ns()
        rank = self.ranks.setdefault(engine_idx, RankStats())
        queue_changed = scheduler_stats.num_waiting_reqs != rank.waiting
        rank.running = scheduler_stats.num_running_reqs
        rank.waiting = scheduler_stats.num_waiting_reqs
        rank.kv_cache_usage = scheduler_stats.kv_cache_usage
        rank.updated_ns = now
        details = getattr(scheduler_stats, "iteration_details", None)
        if details is not None:
            rank.prefill_batch = details.num_ctx_requests
            rank.decode_batch = details.num_generation_requests
        if self.events.subscriber_count == 0:
            return
        common = {"data_parallel_rank": str(engine_idx)}
        generated = iteration_stats.num_generation_tokens if iteration_stats is not None else 0
        forward = {**common, "generated_tokens": str(generated)}
        if details is not None:  # with --enable-logging-iteration-details
            forward.update({
                "iteration": str(details.iteration_index),
                "prefill_requests": str(details.num_ctx_requests),
                "prefill_tokens": str(details.num_ctx_tokens),
                "decode_requests": str(details.num_generation_requests),
                "decode_tokens": str(details.num_generation_tokens),
                "elapsed_ms": f"{details.elapsed_ms:.3f}",
            })
        self._emit(RuntimeEventType.FORWARD_PASS, now, forward)
        self._emit(RuntimeEventType.BATCH, now, {
            **common,
            "running_requests": str(rank.running),
            "waiting_requests": str(rank.waiting),
            "kv_cache_usage": f"{rank.kv_cache_usage:.6f}",
        })
        if queue_changed:
            self._emit(RuntimeEventType.QUEUE, now, {**common, "waiting_requests": str(rank.waiting),
                                                     "running_requests": str(rank.running)})
        if transfer := connector_totals(getattr(scheduler_stats, "kv_connector_stats", None)):
            self._emit(RuntimeEventType.TRANSFER, now, {**common, "phase": "connector_stats", **transfer})

    def emit_transfer(self, attributes: dict[str, str]) -> None:
        """A KV handoff milestone of one request (prefill_ready, decode_started/loaded/failed)."""
        if self.events.subscriber_count:
            self._emit(RuntimeEventType.TRANSFER, time.time_ns(), attributes)


def connector_totals(stats: dict | None) -> dict[str, str]:
    """A step's KV-connector stats (NIXL: lists of per-transfer values) as event attributes."""
    if not stats:
        return {}
    out = {}
    if durations := stats.get("transfer_duration"):
        out["transfers"] = str(len(durations))
        out["transfer_seconds"] = f"{sum(durations):.6f}"
    if sizes := stats.get("bytes_transferred"):
        out["bytes_transferred"] = str(int(sum(sizes)))
    for key in ("num_failed_transfers", "num_failed_handshakes", "num_kv_expired_reqs"):
        if values := stats.get(key):
            out[key.removeprefix("num_")] = str(len(values))
    return out


# The collector of a plugin-mode server (``vllm serve`` + openengine plugin), filled by the
# stat-logger entry point that vLLM creates with the engine.
SHARED = StatsCollector()
