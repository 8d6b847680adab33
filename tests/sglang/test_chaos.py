"""Real faults on the REAL SGLang sidecar (issue 25, item 4): its scheduler process is killed under open
streams and subscriptions (tests/chaos.py, docs/lifecycle.md). One engine start.

SGLang's own reaction to a dead scheduler (its SubprocessWatchdog sends SIGQUIT within 1 s, whose
handler kills the whole process tree at once) would end every stream with a lost connection; the
sidecar takes SIGQUIT over, so each client gets one retryable error and the process exits 3."""

from __future__ import annotations

import sys

import grpc
import pytest
from chaos import PROGRESS_TIMEOUT_S, death_is_seen_by_every_client_then_the_process_exits
from conftest import CPU_FLAGS
from launch_helpers import Launched, engine_process, with_root

from openengine_adapters.v1 import openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_killed_scheduler_ends_every_stream_retryably_and_the_process(model_dir):
    server = Launched([sys.executable, "-m", "openengine_adapters.sglang", "--host", "127.0.0.1", "--port", "0",
                       "--model-path", str(model_dir), "--served-model-name", "tiny", *CPU_FLAGS,
                       "--progress-timeout-s", str(PROGRESS_TIMEOUT_S)], with_root())
    try:
        target = await server.ready(600)
        scheduler = engine_process(server, "sglang::scheduler")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            elapsed = await death_is_seen_by_every_client_then_the_process_exits(
                server, stub, channel, scheduler, "sglang",
                f"an SGLang engine process died: scheduler_0 (pid {scheduler.pid}, exit code -9)")
            print(f"scheduler SIGKILL: the sidecar exited {elapsed:.1f} s later")
    finally:
        server.kill()
