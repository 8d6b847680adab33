"""bench/sglang_streaming.py --smoke: the benchmark still runs end to end (its figures mean nothing here),
and --json writes the figures the table printed."""

from __future__ import annotations

from launch_helpers import assert_bench_json_matches_table, bench_smoke


def test_streaming_bench_smoke(tmp_path):
    table, rows = bench_smoke("sglang_streaming.py", 900, "--json", str(tmp_path / "r.json"))
    assert {(r[0], r[1]) for r in rows} == {("limit", "1"), ("limit", "4"), ("ours", "1"), ("ours", "4")}, table
    data = assert_bench_json_matches_table(tmp_path / "r.json", rows)
    assert data["targets"]["limit"]["server_process"] is False and data["settings"]["size"] == "tiny"
