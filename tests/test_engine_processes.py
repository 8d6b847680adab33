"""What every spawned engine process does first (openengine_adapters/engine_processes.py), in a real
interpreter: the prelude ends a process whose parent went away mid-spawn without a traceback."""

from __future__ import annotations

import subprocess
import sys

HALF_SPAWNED = """
import os, sys, multiprocessing.spawn as spawn
sys.argv = ["-c", "--multiprocessing-fork"]  # as spawn's command line sets it
from openengine_adapters import engine_processes
engine_processes.prepare(child=True)  # what PRELUDE runs first in every spawned process
r, w = os.pipe()
os.close(w)  # the parent ended before it wrote this process's preparation data
spawn.spawn_main(pipe_handle=r)
"""


def test_a_process_whose_parent_ended_mid_spawn_ends_quietly():
    """Ctrl-C during start-up stops the engine while it spawns a worker: the worker reads its work from
    a pipe the dead parent never wrote. It ends with status 1 and says nothing (it printed
    ``EOFError: Ran out of input`` under the launcher's last line before)."""
    run = subprocess.run([sys.executable, "-c", HALF_SPAWNED], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr, run.stdout) == (1, "", "")
