"""``python -m conformance`` as a newcomer meets it: progress while it runs, one error for a target it
cannot reach, a quiet end on a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import free_port, start_fake, stop_fake

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_unreachable_target_is_one_error_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "conformance", "--target", f"127.0.0.1:{free_port()}",
                          "--timeout", "2"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert run.returncode == 2, run
    assert run.stdout == "" and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "cannot examine" in run.stderr and "UNAVAILABLE" in run.stderr


def test_list_into_a_closed_pipe_ends_quietly():
    run = subprocess.run(f"{sys.executable} -m conformance --list | head -1", shell=True, capture_output=True,
                         text=True, env=ENV, cwd=ROOT, timeout=60)
    assert run.stdout.startswith("identity.") and "Traceback" not in run.stderr, run.stderr


async def test_progress_shows_each_check_as_it_runs():
    proc, port, _ = await start_fake()
    try:
        run = subprocess.run([sys.executable, "-m", "conformance", "--target", f"127.0.0.1:{port}", "--only",
                              "identity"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    finally:
        await stop_fake(proc)
    assert run.returncode == 0, run.stdout + run.stderr
    progress = [line for line in run.stderr.splitlines() if line.startswith("  [revision-1] ")]
    assert len(progress) >= 4 and all(" PASS identity." in line for line in progress), run.stderr
