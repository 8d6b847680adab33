"""Launching ``python -m openengine_adapters.sglang`` as a child process in tests."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def launch(*args, env=None):
    """Start the sidecar on a free gRPC port; return (process, target, output lines so far)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "openengine_adapters.sglang", "--host", "127.0.0.1", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
             **(env or {})})
    lines = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 600)).decode()
        lines.append(line)
        assert line, "sidecar exited before it was ready:\n" + "".join(lines[-40:])
        if m := re.search(r"ready on .*:(\d+)", line):
            return proc, f"127.0.0.1:{m.group(1)}", lines


async def stop(proc, timeout=90):
    """SIGTERM first: the sidecar drains, then shuts SGLang's scheduler and detokenizer down."""
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
    return proc.returncode


async def drain_output(proc, sink: list[str] | None = None):
    """Keep reading the child's output (a full pipe would block it)."""
    while line := await proc.stdout.readline():
        if sink is not None:
            sink.append(line.decode())
