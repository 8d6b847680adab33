"""bench/plot.py draws every committed result in bench/results/ (the figures the documentation shows come
from them): each renders to a PNG of the size its kind draws. Needs matplotlib, the ``bench`` extra, which
the docs session installs; without it this fails (the figures could not be remade)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))
SIZES = {"streaming": (1600, 950), "floor": (1200, 500), "soak": (1200, 800)}  # figsize x dpi 100


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_there_are_results_of_every_kind():
    kinds = {json.loads(p.read_text()).get("kind", "soak") for p in RESULTS}
    assert kinds >= {"streaming", "soak"}, kinds


@pytest.mark.parametrize("result", RESULTS, ids=[p.stem for p in RESULTS])
def test_plot_draws_a_committed_result(result, tmp_path):
    out = tmp_path / "figure.png"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "plot.py"), str(result), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert png_size(out.read_bytes()) == SIZES[json.loads(result.read_text()).get("kind", "soak")]


def test_plot_refuses_an_unknown_kind(tmp_path):
    source = tmp_path / "odd.json"
    source.write_text('{"kind": "odd"}')
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "plot.py"), str(source), str(tmp_path / "x.png")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown kind 'odd'" in run.stderr, run.stderr
    assert not (tmp_path / "x.png").exists()
