"""bench/vllm_streaming.py and bench/frontend_ceiling.py --smoke: the benchmarks still run end to end
(their figures mean nothing here)."""

from __future__ import annotations

from launch_helpers import bench_smoke


def test_streaming_bench_smoke():
    table, rows = bench_smoke("vllm_streaming.py", timeout=600)
    assert "ratios: median of the per-round ratios" in table, table
    assert {(r[0], r[1]) for r in rows} == {("limit", "1"), ("limit", "4"), ("ours", "1"), ("ours", "4")}, table


def test_frontend_ceiling_bench_smoke():
    """The fake engine; uvloop comes with vLLM."""
    table, rows = bench_smoke("frontend_ceiling.py", timeout=300)
    assert {(r[0], r[1]) for r in rows} == {("ours", "1"), ("ours", "4")}, table
