"""SGLang's load snapshots (``get_loads``, one per DP rank) -> the backend seam's ``LoadSnapshot``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from openengine_adapters import backend as be


def load_snapshot(loads: Sequence[Any], page_size: int, per_rank: bool) -> be.LoadSnapshot:
    """SGLang ``get_loads()`` snapshots (one per DP rank) -> LoadSnapshot. SGLang counts KV in
    tokens; blocks are pages (``page_size`` tokens)."""
    page = max(1, int(page_size or 1))

    def blocks(tokens: Any) -> int | None:
        return None if tokens is None else -(-int(tokens) // page)

    ranks = []
    for s in loads:
        ranks.append(be.RankLoad(
            data_parallel_rank=getattr(s, "dp_rank", None),
            running_requests=getattr(s, "num_running_reqs", None),
            queued_requests=getattr(s, "num_waiting_reqs", None),
            used_kv_blocks=blocks(getattr(s, "num_used_tokens", None)),
            total_kv_blocks=(None if getattr(s, "max_total_num_tokens", None) is None
                             else int(s.max_total_num_tokens) // page),
        ))

    def total(name: str) -> int | None:
        values = [getattr(r, name) for r in ranks]
        return None if not values or any(v is None for v in values) else sum(values)

    waiting = [getattr(s, "num_waiting_uncached_tokens", None) for s in loads]
    timestamps = [getattr(s, "timestamp", None) for s in loads]
    return be.LoadSnapshot(
        timestamp_unix_nanos=int(max(timestamps) * 1e9) if timestamps and None not in timestamps else None,
        running_requests=total("running_requests"),
        queued_requests=total("queued_requests"),
        used_kv_blocks=total("used_kv_blocks"),
        total_kv_blocks=total("total_kv_blocks"),
        running_tokens=sum(int(getattr(s, "num_used_tokens", 0) or 0) for s in loads) if loads else None,
        waiting_tokens=sum(int(w) for w in waiting) if waiting and None not in waiting else None,
        ranks=tuple(ranks) if per_rank else (),
        attributes={"page_size": str(page)},
    )


def with_in_flight(snap: be.LoadSnapshot, in_flight: int) -> be.LoadSnapshot:
    """Count what is in flight the moment it is. SGLang publishes its ``get_loads`` snapshot on a
    prefill and then every 15 decode steps (and when idle), so a request that runs can read as
    ``running 0`` until the next one; every engine request the adapter holds and SGLang does not
    report queued is running (TensorRT-LLM's own tests pin that in-flight work is counted:
    NVIDIA/TensorRT-LLM tests/unittest/grpc/openengine/). Per-rank rows stay SGLang's."""
    if snap.running_requests is None:
        return snap
    running = max(snap.running_requests, in_flight - (snap.queued_requests or 0))
    return dataclasses.replace(snap, running_requests=running)

