"""What every client of a sidecar must see when its engine is frozen or killed (issue 25, item 4;
docs/lifecycle.md), shared by the real-engine chaos tests (tests/vllm/test_chaos.py,
tests/sglang/test_chaos.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import eventually, gen_request, rejection
from launch_helpers import Launched

from openengine_adapters.server import ENGINE_DEATH_STOP_S
from openengine_adapters.server_config import ENGINE_DIED_EXIT_CODE
from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import kv_pb2, lifecycle_pb2, observability_pb2, openengine_pb2_grpc

PROGRESS_TIMEOUT_S = 3  # the sidecars' --progress-timeout-s in the chaos tests
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
# from the engine's death to the launcher's exit: found within a watchdog interval (vLLM's own monitor
# sees the process end at once), the server stopped within ENGINE_DEATH_STOP_S, then 5 s at most to
# reap what is left of the engine's processes
EXIT_BOUND_S = 1 + ENGINE_DEATH_STOP_S + 5
# the engine's own count of the requests it holds, in GetLoad's attributes
HELD_BY = {"vllm": "unfinished_requests", "sglang": "in_flight_requests"}
# whether the engine takes a Generate before its first output (vLLM's AsyncLLM does; the SGLang backend
# waits for each sequence's first output, openengine_adapters/sglang/backend.py ``generate``)
ACCEPTED_BEFORE_OUTPUT = {"vllm": True, "sglang": False}


def long_generate(stub, rid: str):
    """A Generate that runs for a while on the tiny CPU models."""
    return stub.Generate(gen_request("hello " * 8, request_id=rid, model="tiny",
                                     stopping=g.StoppingOptions(max_tokens=400, ignore_eos=True)))


async def rest(call, timeout: float = 60) -> list:
    """The rest of a stream, each message within ``timeout`` (a stream that hangs fails the test)."""
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
    """(revision-1 Health state, grpc.health.v1 status)."""
    mine = await openengine_pb2_grpc.OpenEngineStub(channel).Health(lifecycle_pb2.HealthRequest(), timeout=10)
    std = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return mine.state, std.status


async def watch_health(channel, seen: list) -> None:
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for resp in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()):
            seen.append(resp.status)


async def first_runtime_event(stub, runtime, timeout: float = 60) -> None:
    """Short Generates until ``runtime`` (a SubscribeRuntimeEvents call) yields its first event: the
    server has then registered the subscription, which it does at a moment the client cannot see."""
    first = asyncio.ensure_future(runtime.read())
    deadline = time.monotonic() + timeout
    for n in itertools.count():
        if first.done():
            break
        assert time.monotonic() < deadline, "no runtime event while Generates ran"
        await rest(stub.Generate(gen_request("ping", request_id=f"ping-{n}", model="tiny",
                                             stopping=g.StoppingOptions(max_tokens=2))))
        await asyncio.wait([first], timeout=0.5)
    assert first.result() is not grpc.aio.EOF


async def held(stub, engine: str, n: int, timeout: float) -> None:
    """Until the engine's own count in GetLoad (``HELD_BY``) reads ``n`` requests."""
    attribute = HELD_BY[engine]
    seen: list = []

    async def check() -> bool:
        load = await stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=5)
        seen.append(load.attributes.get(attribute))
        return seen[-1] == str(n)

    await eventually(check, timeout=timeout, interval=0.05,
                     message=f"GetLoad's {attribute} never read {n} (read {seen[-5:]})")


async def the_deaths_error(call, engine: str):
    """The one retryable error a Generate open at the engine's death gets: its stream's terminal event
    when the engine took it at once (vLLM), the call's refusal with the error trailer when the engine
    was still taking it (SGLang takes a request with its first output, and a stopped engine gave none)."""
    if ACCEPTED_BEFORE_OUTPUT[engine]:
        return one_retryable_error(await rest(call, 30))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rest(call, 30)
    err = rejection(refused.value)
    assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0), err
    assert refused.value.code() == grpc.StatusCode.INTERNAL, refused.value
    return err


async def death_is_seen_by_every_client_then_the_process_exits(server: Launched, stub, channel,
                                                               victim: psutil.Process, engine: str,
                                                               cause: str) -> float:
    """Open Generates, a KV and a runtime-event subscription and a grpc.health Watch; kill ``victim``;
    each ends with exactly one retryable error (no hang), health goes NOT_SERVING, the launcher exits
    with ENGINE_DIED_EXIT_CODE within EXIT_BOUND_S with one line naming the cause, nothing is left
    behind. The Generates are sent to a stopped victim and it is killed once the engine holds them all,
    within the progress timeout: none can finish first, and the watchdog has not yet called it hung.
    Returns the seconds from the kill to the exit."""
    seen: list = []
    watcher = asyncio.ensure_future(watch_health(channel, seen))
    await eventually(lambda: seen == [SERVING])
    # the subscriptions first, proven open by a runtime event: a subscription the server registered
    # after the engine's last step would see nothing (CI of 2026-12-04)
    kv = stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    runtime = stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
    await first_runtime_event(stub, runtime)
    victim.suspend()
    calls = [long_generate(stub, f"dies-{i}") for i in range(3)]
    await held(stub, engine, len(calls), timeout=PROGRESS_TIMEOUT_S)
    killed_at = time.monotonic()
    victim.kill()
    for call in calls:
        err = await the_deaths_error(call, engine)
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
    assert last.startswith(f"error: the {engine} engine died: {cause}"), server.tail()
    assert f"exiting with status {ENGINE_DIED_EXIT_CODE}" in last
    assert not server.leftovers(), server.leftovers()
    return elapsed


async def ready(channel) -> bool:
    return await health(channel) == (lifecycle_pb2.HEALTH_STATE_READY, SERVING)
