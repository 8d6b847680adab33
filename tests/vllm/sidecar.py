"""Launching ``python -m openengine_adapters.vllm`` as a child process in tests (the start, wait
and stop are tests/launch_helpers.py's)."""

from __future__ import annotations

import sys

from launch_helpers import drain_output, start_server, stop_server

__all__ = ["drain_output", "launch", "stop"]


async def launch(*args, env=None):
    """Start the sidecar on a free port; return (process, target, output lines so far)."""
    proc, port, lines = await start_server(
        [sys.executable, "-m", "openengine_adapters.vllm", "--host", "127.0.0.1", "--port", "0", *args],
        env=env, line_timeout=600)
    return proc, f"127.0.0.1:{port}", lines


async def stop(proc):
    """SIGTERM first: a SIGKILLed sidecar would orphan its vLLM engine-core process."""
    await stop_server(proc, 60)
