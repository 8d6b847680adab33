"""bench/vllm_streaming.py and bench/frontend_ceiling.py --smoke: the benchmarks still run end to end
(their figures mean nothing here), --pin splits the engines from the front ends, and --json writes the
figures the table printed."""

from __future__ import annotations

import json
import subprocess
import sys

from launch_helpers import ROOT, assert_bench_json_matches_table, bench_smoke


def test_streaming_bench_smoke(tmp_path):
    table, rows = bench_smoke("vllm_streaming.py", 600, "--pin", "--json", str(tmp_path / "r.json"))
    assert "ratios: median of the per-round ratios" in table, table
    assert {(r[0], r[1]) for r in rows} == {("limit", "1"), ("limit", "4"), ("ours", "1"), ("ours", "4")}, table
    data = assert_bench_json_matches_table(tmp_path / "r.json", rows)
    assert data["targets"]["limit"]["server_process"] is False and data["settings"]["size"] == "tiny"
    pinned = data["settings"]["pinned"]  # --pin: both engine cores on one CPU, the front ends on the other
    assert len(pinned["engine_cpus"]) == 1 and pinned["front_end_cpus"], pinned
    assert not set(pinned["engine_cpus"]) & set(pinned["front_end_cpus"]), pinned
    assert pinned["engine_processes"] >= 2 and pinned["front_end_processes"] >= 2, pinned
    assert {(r["of"], r["to"], r["streams"]) for r in data["ratios"] if r["metric"] == "tps"} >= {
        ("ours", "limit", 1), ("ours", "limit", 4)}, data["ratios"]


def test_frontend_ceiling_bench_smoke(tmp_path):
    """The fake engine; uvloop comes with vLLM."""
    table, rows = bench_smoke("frontend_ceiling.py", 300, "--json", str(tmp_path / "r.json"))
    assert {(r[0], r[1]) for r in rows} == {("ours", "1"), ("ours", "4")}, table
    data = assert_bench_json_matches_table(tmp_path / "r.json", rows)
    assert data["settings"]["step_ms"] == 0.0 and data["settings"]["size"] is None, data["settings"]


def test_grpc_floor_json(tmp_path):
    """No engine (a bare grpc.aio server); uvloop comes with vLLM."""
    out = tmp_path / "floor.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "grpc_floor.py"), "--streams", "1", "2", "--tokens",
                          "8", "--seconds", "0.5", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "floor" and data["settings"]["streams"] == [1, 2], data
    printed = [line.split()[2] for line in run.stdout.splitlines() if " streams: " in line]
    assert [f"{r['messages_per_s']:.0f}" for r in data["rows"]] == printed, (printed, data["rows"])
