"""bench/sglang_streaming.py --smoke: the benchmark still runs end to end (its figures mean nothing here)."""

from __future__ import annotations

from launch_helpers import bench_smoke


def test_streaming_bench_smoke():
    table, rows = bench_smoke("sglang_streaming.py", timeout=900)
    assert {(r[0], r[1]) for r in rows} == {("limit", "1"), ("limit", "4"), ("ours", "1"), ("ours", "4")}, table
