"""Launching ``python -m openengine_adapters.sglang`` (or SGLang's own server) as a child process.

``subprocess.Popen`` with reads in a thread, not asyncio subprocesses: once an in-process SGLang
``Engine`` exists, SGLang has installed uvloop's event-loop policy, which has no child watcher for
the asyncio loop the tests run on.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env_with_root(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            **(extra or {})}


def spawn(*argv: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env_with_root(env), text=True, bufsize=1)


async def launch(*args, env=None):
    """Start the sidecar on a free gRPC port; return (process, target, output lines so far)."""
    proc = spawn("-m", "openengine_adapters.sglang", "--host", "127.0.0.1", "--port", "0", *args, env=env)
    lines = []
    while True:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 600)
        lines.append(line)
        assert line, "sidecar exited before it was ready:\n" + "".join(lines[-40:])
        if m := re.search(r"ready on .*:(\d+)", line):
            return proc, f"127.0.0.1:{m.group(1)}", lines


async def stop(proc: subprocess.Popen, timeout=90):
    """SIGTERM first: the sidecar drains, then shuts SGLang's scheduler and detokenizer down."""
    if proc.poll() is None:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
    return proc.returncode


async def drain_output(proc: subprocess.Popen, sink: list[str] | None = None):
    """Keep reading the child's output (a full pipe would block it)."""
    while line := await asyncio.to_thread(proc.stdout.readline):
        if sink is not None:
            sink.append(line)
