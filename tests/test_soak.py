"""A short soak on the fake engine: what each finished, cancelled, timed-out or aborted request leaves
behind in the server stays bounded (issue 25).

bench/soak.py drives the server process (tests/serve_fake.py) with its mixed traffic (Generate read to
the end, cancelled, cut by deadlines, aborted; v0.1.0 Generate; tasks; KV and runtime subscriptions
opening and closing) under tracemalloc, with a small finished-id memory so that it fills during
warm-up; then the memory Python holds after warm-up must not grow by more than a few bytes per
request. A structure that keeps something of every request (the fake's own ``seen_params`` once did,
about 1 KB each) grows it by hundreds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUND_BYTES_PER_REQUEST = 64
MEASURED_REQUESTS = 1000
WARMUP_REQUESTS = 300  # the fake's own memories (64 requests) and the finished ids (64) fill before the first snapshot


def test_server_memory_stays_flat_under_mixed_traffic(tmp_path):
    out = tmp_path / "soak.json"
    argv = [sys.executable, str(ROOT / "bench" / "soak.py"), "--target", "fake", "--minutes", "5",
            "--requests", str(WARMUP_REQUESTS + MEASURED_REQUESTS),
            "--clients", "6", "--subscribers", "2", "--sample-s", "2", "--warmup-fraction", "0",
            "--warmup-requests", str(WARMUP_REQUESTS),
            "--trace", str(tmp_path / "trace"), "--server-flag=--finished-id-memory=64",
            "--fail-above", str(BOUND_BYTES_PER_REQUEST), "--out", str(out)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=420,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OPENENGINE_TRACE_FRAMES": "4"})
    result = json.loads(out.read_text())["targets"]["fake"]
    kinds = {k.split(":")[0] for k in result["outcomes"]}
    assert {"complete", "cancel", "deadline", "abort", "v0.1", "task", "subscription"} <= kinds, result["outcomes"]
    assert result["requests"] >= WARMUP_REQUESTS + MEASURED_REQUESTS, result["outcomes"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    samples = result["samples"]
    assert samples[-1]["finished_ids"] == 64 and samples[-1]["live_requests"] == 0
    assert samples[-1]["fds"] <= samples[1]["fds"] + 2 and samples[-1]["threads"] == samples[1]["threads"]
