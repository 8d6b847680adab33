"""The server as a process: SIGTERM drains in-flight work, then the process exits cleanly."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import sys
from pathlib import Path

import grpc
from helpers import gen_request, read_rest

from openengine_adapters.server import freeze_startup_heap
from openengine_adapters.server_config import resolve_advertise_host
from openengine_adapters.v1 import generation_pb2, openengine_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


async def start_server(*args: str):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "tests" / "serve_fake.py"), "--host", "127.0.0.1", "--port", "0",
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    while not (m := re.search(r"ready on .*:(\d+)", line := (await asyncio.wait_for(proc.stdout.readline(), 30)
                                                             ).decode())):
        assert line, "the server exited before it was ready"
    return proc, f"127.0.0.1:{m.group(1)}"


async def test_sigterm_drains_in_flight_requests_then_exits():
    proc, target = await start_server("--drain-grace-s", "10")
    async with grpc.aio.insecure_channel(target) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        req = gen_request("hi", metadata={"fake.step_delay_ms": "20"},
                          stopping=generation_pb2.StoppingOptions(max_tokens=25))
        call = stub.Generate(req)
        await call.read()
        proc.send_signal(signal.SIGTERM)
        rest = await read_rest(call)
        assert rest[-1].finished.reason == generation_pb2.FINISH_REASON_LENGTH
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_sigterm_aborts_after_grace():
    proc, target = await start_server("--drain-grace-s", "0.2")
    async with grpc.aio.insecure_channel(target) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        call = stub.Generate(gen_request("hi", metadata={"fake.step_delay_ms": "50"},
                                         stopping=generation_pb2.StoppingOptions(max_tokens=200)))
        await call.read()
        proc.send_signal(signal.SIGTERM)
        rest = await read_rest(call)
        assert rest[-1].error.code == 11  # ERROR_CODE_DRAINING, retryable elsewhere
    assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_advertise_host_rule(monkeypatch):
    monkeypatch.delenv("OPENENGINE_ADVERTISE_HOST", raising=False)
    assert resolve_advertise_host("0.0.0.0", "10.1.2.3") == "10.1.2.3"
    assert resolve_advertise_host("192.0.2.7", None) == "192.0.2.7"
    monkeypatch.setenv("OPENENGINE_ADVERTISE_HOST", "node-7")
    assert resolve_advertise_host("0.0.0.0", None) == "node-7"
    monkeypatch.delenv("OPENENGINE_ADVERTISE_HOST")
    auto = resolve_advertise_host("0.0.0.0", None)
    assert auto not in ("", "*", "0.0.0.0", "::")
    try:
        resolve_advertise_host("0.0.0.0", "*")
    except ValueError:
        pass
    else:
        raise AssertionError("a wildcard advertise host must be refused")


def test_the_start_up_heap_leaves_the_collectors_reach():
    """What start-up allocated is frozen (``run`` does it before the ready line), so a full
    collection during serving walks only what serving allocates."""
    gc.unfreeze()
    kept = [[i] for i in range(1000)]  # tracked containers
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
