"""Launching ``python -m openengine_adapters.sglang`` (or SGLang's own server) as a child process
(the start, wait and stop are tests/launch_helpers.py's).

``subprocess.Popen`` with reads in a thread, not asyncio subprocesses: once an in-process SGLang
``Engine`` exists, SGLang has installed uvloop's event-loop policy, which has no child watcher for
the asyncio loop the tests run on.
"""

from __future__ import annotations

import subprocess
import sys

from launch_helpers import drain_output, spawn_threaded, start_server, stop_server

__all__ = ["drain_output", "launch", "spawn", "stop"]


def spawn(*argv: str, env: dict | None = None) -> subprocess.Popen:
    return spawn_threaded([sys.executable, *argv], env)


async def launch(*args, env=None):
    """Start the sidecar on a free gRPC port; return (process, target, output lines so far)."""
    proc, port, lines = await start_server(
        [sys.executable, "-m", "openengine_adapters.sglang", "--host", "127.0.0.1", "--port", "0", *args],
        env=env, line_timeout=600, threaded=True)
    return proc, f"127.0.0.1:{port}", lines


async def stop(proc: subprocess.Popen, timeout=90):
    """SIGTERM first: the sidecar drains, then shuts SGLang's scheduler and detokenizer down."""
    return await stop_server(proc, timeout)
