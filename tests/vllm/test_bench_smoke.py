"""bench/vllm_streaming.py --smoke: the benchmark still runs end to end (its figures mean nothing here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_streaming_bench_smoke():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_streaming.py"), "--smoke"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    table = run.stdout
    assert "ratios: median of the per-round ratios" in table, table
    rows = [line.split() for line in table.splitlines() if line.startswith(("limit ", "ours "))]
    assert {(r[0], r[1]) for r in rows} == {("limit", "1"), ("limit", "4"), ("ours", "1"), ("ours", "4")}, table
    assert all(float(r[2]) > 0 for r in rows), table  # tokens/s


def test_frontend_ceiling_bench_smoke():
    """bench/frontend_ceiling.py --smoke (the fake engine; uvloop comes with vLLM)."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "frontend_ceiling.py"), "--smoke"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("ours ")]
    assert {(r[0], r[1]) for r in rows} == {("ours", "1"), ("ours", "4")}, run.stdout
    assert all(float(r[2]) > 0 for r in rows), run.stdout
