"""Real faults on the REAL vLLM sidecar (issue 25, item 4): its processes are frozen and killed under
open streams and subscriptions, and what every client sees, the health transitions, the exit code and
time, and the processes left behind are asserted (docs/lifecycle.md).

A killed engine cannot be shared, so each engine start carries several faults: the first freezes
(SIGSTOP) and thaws (SIGCONT) the engine core, then kills it; the second runs vLLM's workers in their
own process (``--distributed-executor-backend mp``) and kills the worker. Two engine starts in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import eventually, gen_request, rejection
from launch_helpers import Launched, with_root

from openengine_adapters.server import ENGINE_DEATH_STOP_S, ENGINE_DIED_EXIT_CODE
from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import kv_pb2, lifecycle_pb2, observability_pb2, openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROGRESS_TIMEOUT_S = 3
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
# from the engine's death to the launcher's exit: found within a watchdog interval (vLLM's own monitor
# sees the process end at once), the server stopped within ENGINE_DEATH_STOP_S, then 5 s at most to
# reap what is left of the engine's processes
EXIT_BOUND_S = 1 + ENGINE_DEATH_STOP_S + 5


def flags(model_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "openengine_adapters.vllm", "--host", "127.0.0.1", "--port", "0",
            "--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len", "512", "--enforce-eager",
            "--dtype", "float32", "--seed", "0", "--progress-timeout-s", str(PROGRESS_TIMEOUT_S),
            "--drain-grace-s", "2", *extra]


def long_generate(stub, rid: str):
    return stub.Generate(gen_request("hello " * 8, request_id=rid, model="tiny",
                                     stopping=g.StoppingOptions(max_tokens=400, ignore_eos=True)))


async def rest(call, timeout: float = 60) -> list:
    out = []
    while (r := await asyncio.wait_for(call.read(), timeout)) is not grpc.aio.EOF:
        out.append(r)
    return out


def one_retryable_error(events: list) -> object:
    """Exactly one terminal error, the last event, retryable at once."""
    errors = [e.error for e in events if e.HasField("error")]
    assert len(errors) == 1 and events[-1].HasField("error"), events[-3:]
    assert (errors[0].code, errors[0].retryable, errors[0].retry_after_ms) == (ErrorCode.INTERNAL, True, 0), errors
    return errors[0]


async def health(channel) -> tuple[int, int]:
    mine = await openengine_pb2_grpc.OpenEngineStub(channel).Health(lifecycle_pb2.HealthRequest(), timeout=10)
    std = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return mine.state, std.status


def engine_process(server: Launched, marker: str) -> psutil.Process:
    """The sidecar's child whose name or command line holds ``marker`` (vLLM titles its processes
    ``VLLM::EngineCore``, ``VLLM::Worker...``)."""
    server.record_children()
    found = []
    for p in server.children:
        with contextlib.suppress(psutil.Error):
            if marker in p.name() or marker in " ".join(p.cmdline()):
                found.append(p)
    assert len(found) == 1, [(p.pid, p.name()) for p in server.children]
    return found[0]


async def watch_health(channel, seen: list) -> None:
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for resp in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()):
            seen.append(resp.status)


async def death_is_seen_by_every_client_then_the_process_exits(server: Launched, stub, channel, kill) -> float:
    """Open Generates, a KV and a runtime-event subscription and a grpc.health Watch; ``kill()``; each
    ends with exactly one retryable error (no hang), health goes NOT_SERVING, the launcher exits with
    ENGINE_DIED_EXIT_CODE within EXIT_BOUND_S with one line naming the cause, nothing is left behind.
    Returns the seconds from the kill to the exit."""
    seen: list = []
    watcher = asyncio.ensure_future(watch_health(channel, seen))
    await eventually(lambda: seen == [SERVING])
    calls = [long_generate(stub, f"dies-{i}") for i in range(3)]
    for call in calls:
        await asyncio.wait_for(call.read(), 60)
    kv = stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    runtime = stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
    await asyncio.wait_for(runtime.read(), 30)  # FORWARD_PASS events flow while the Generates run
    killed_at = time.monotonic()
    kill()
    for call in calls:
        err = one_retryable_error(await rest(call, 30))
        assert "died" in err.message, err
    for sub in (kv, runtime):
        one_retryable_error(await rest(sub, 30))
    code = await server.wait(EXIT_BOUND_S + 10)
    elapsed = time.monotonic() - killed_at
    await asyncio.wait_for(watcher, 10)
    assert code == ENGINE_DIED_EXIT_CODE, server.tail()
    assert elapsed < EXIT_BOUND_S, f"exited {elapsed:.1f} s after the kill"
    assert seen[0] == SERVING and NOT_SERVING in seen, seen
    last = server.last_line_but_exit_notes()
    assert last.startswith("error: the vllm engine died: the vLLM engine core died"), server.tail()
    assert f"exiting with status {ENGINE_DIED_EXIT_CODE}" in last
    assert not server.leftovers(), server.leftovers()
    return elapsed


async def test_a_frozen_engine_core_is_out_of_rotation_until_it_thaws_and_a_killed_one_ends_the_process(model_dir):
    server = Launched(flags(model_dir), with_root())
    try:
        target = await server.ready(600)
        core = engine_process(server, "EngineCore")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            assert await health(channel) == (lifecycle_pb2.HEALTH_STATE_READY, SERVING)
            # SIGSTOP: open streams end retryably after the progress timeout, and the server stays out of
            # rotation while idle (it flapped back to SERVING before issue 25)
            calls = [long_generate(stub, f"frozen-{i}") for i in range(2)]
            for call in calls:
                await asyncio.wait_for(call.read(), 60)
            os.kill(core.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            for call in calls:
                err = one_retryable_error(await rest(call, PROGRESS_TIMEOUT_S + 15))
                assert "no progress" in err.message, err
            assert time.monotonic() - stopped_at < PROGRESS_TIMEOUT_S + 10
            for _ in range(4):  # several watchdog intervals with nothing pending
                assert await health(channel) == (lifecycle_pb2.HEALTH_STATE_NOT_READY, NOT_SERVING)
                await asyncio.sleep(1)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await rest(long_generate(stub, "while-frozen"))
            err = rejection(refused.value)
            assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
            # SIGCONT: the watchdog's probe inference finishes, READY again, and work is served
            os.kill(core.pid, signal.SIGCONT)
            waited = await eventually(lambda: _ready(channel), timeout=60, interval=0.2)
            print(f"READY {waited:.1f} s after SIGCONT")
            events = await rest(stub.Generate(gen_request("after", request_id="thawed", model="tiny",
                                                          stopping=g.StoppingOptions(max_tokens=4))))
            assert events[-1].HasField("finished"), events[-1]
            # SIGKILL of the engine core: every client sees one retryable error, then the process exits
            elapsed = await death_is_seen_by_every_client_then_the_process_exits(
                server, stub, channel, lambda: os.kill(core.pid, signal.SIGKILL))
            print(f"engine core SIGKILL: the sidecar exited {elapsed:.1f} s later")
    finally:
        server.kill()


async def _ready(channel) -> bool:
    return await health(channel) == (lifecycle_pb2.HEALTH_STATE_READY, SERVING)


async def test_a_killed_worker_process_ends_the_process(model_dir):
    """vLLM's workers in their own process (``--distributed-executor-backend mp``, as with tensor
    parallelism): SIGKILL of the worker kills the engine, and the sidecar ends as for the core."""
    server = Launched(flags(model_dir, "--distributed-executor-backend", "mp"), with_root())
    try:
        target = await server.ready(600)
        worker = engine_process(server, "Worker")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            elapsed = await death_is_seen_by_every_client_then_the_process_exits(
                server, stub, channel, lambda: os.kill(worker.pid, signal.SIGKILL))
            print(f"worker SIGKILL: the sidecar exited {elapsed:.1f} s later")
    finally:
        server.kill()
