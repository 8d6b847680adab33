"""The lifecycle state machine (docs/lifecycle.md) on the fake engine: every transition, as both
surfaces' Health (revision 1 ``OpenEngine.Health``, v0.1.0 ``Control.Health``) and ``grpc.health.v1``
report it, and a dead engine ending the process (issue 25, items 1 and 2).

    READY --no progress with work pending--> NOT_READY (hung) --a probe inference finishes--> READY
    READY | NOT_READY (hung) --SIGTERM or Drain--> DRAINING --> exit 0
    any --the engine dies--> NOT_READY (dead) --> exit 3 (--keep-alive-on-engine-death: stays)
"""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest
from fake_backend import FakeBackend
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import collect, eventually, gen_request, rejection, serve_backend, start_fake

from openengine_adapters.server import ENGINE_DEATH_STOP_S
from openengine_adapters.server_config import (
    ENGINE_DIED_EXIT_CODE,
    PLUGIN_ENV,
    ServerConfig,
    plugin_server_config,
    server_config_from_args,
)
from openengine_adapters.types import ErrorCode
from openengine_adapters.v0_1 import lifecycle_pb2 as v01_lifecycle
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import kv_pb2, lifecycle_pb2, observability_pb2, openengine_pb2_grpc

READY, NOT_READY, DRAINING = (lifecycle_pb2.HEALTH_STATE_READY, lifecycle_pb2.HEALTH_STATE_NOT_READY,
                              lifecycle_pb2.HEALTH_STATE_DRAINING)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
# v0.1.0's HealthState numbers differ from revision 1's (and it has no DRAINING: NOT_READY, with its "drain" check)
V01_NAME = {READY: "HEALTH_STATE_READY", NOT_READY: "HEALTH_STATE_NOT_READY", DRAINING: "HEALTH_STATE_NOT_READY"}


async def states(channel) -> tuple[int, int]:
    """(revision-1 Health state, grpc.health status); asserts v0.1.0's Control.Health agrees."""
    mine = await openengine_pb2_grpc.OpenEngineStub(channel).Health(lifecycle_pb2.HealthRequest())
    v01 = await channel.unary_unary(
        "/openengine.v1.Control/Health", request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=v01_lifecycle.HealthResponse.FromString)(v01_lifecycle.HealthRequest())
    assert v01_lifecycle.HealthState.Name(v01.state) == V01_NAME[mine.state], (mine, v01)
    std = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    return mine.state, std.status


async def rest(call) -> list:
    """The rest of a stream (read with ``call.read()`` so far)."""
    out = []
    while (r := await call.read()) is not grpc.aio.EOF:
        out.append(r)
    return out


def long_request(rid: str) -> g.GenerateRequest:
    return gen_request("x", request_id=rid, metadata={"fake.step_delay_ms": "20"},
                       stopping=g.StoppingOptions(max_tokens=250, ignore_eos=True))


async def test_hung_stays_not_ready_while_idle_and_turns_ready_when_a_probe_finishes():
    """READY -> NOT_READY (hung) -> (idle: still NOT_READY, new work refused) -> READY by the
    watchdog's probe inference once the engine works again; no client traffic needed."""
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0.4, "health_interval_s": 0.1}) as h:
        assert await states(h.channel) == (READY, SERVING)
        call = h.stub.Generate(long_request("hung"))
        await call.read()
        fake.hang()
        events = await asyncio.wait_for(rest(call), 5)
        assert [e.error.retryable for e in events if e.HasField("error")] == [True]
        await eventually(lambda: len(h.service.registry) == 0)
        # nothing pending, and for many watchdog intervals: the hang is not forgotten (it flapped before)
        for _ in range(6):
            await asyncio.sleep(0.25)
            assert await states(h.channel) == (NOT_READY, NOT_SERVING)
        health = await h.stub.Health(lifecycle_pb2.HealthRequest())
        assert any(c.name == "progress" and "hung" in c.message for c in health.checks), health
        # out of rotation: new work is refused before acceptance, retryable elsewhere
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(h.stub, gen_request("y", request_id="while-hung"))
        err = rejection(refused.value)
        assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
        assert "hung" in refused.value.details()
        assert fake.probe_calls >= 1 and h.service.watchdog.probes_started == 1  # one probe, still waiting
        fake.resume()  # the engine works again: the probe finishes, no client sent anything
        await eventually(lambda: not h.service.watchdog.hung, timeout=5)
        await eventually(lambda: h.service.health.state == READY, timeout=5)
        assert await states(h.channel) == (READY, SERVING)
        done = await collect(h.stub, gen_request("z", request_id="after", stopping=g.StoppingOptions(max_tokens=3)))
        assert done[-1].HasField("finished")


async def test_a_health_probe_that_finishes_ends_the_hang():
    """NOT_READY (hung) -> READY by a client's Health(include_inference_probe) as well."""
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0.4, "health_interval_s": 60}) as h:
        call = h.stub.Generate(long_request("hung"))
        await call.read()
        fake.hang()
        await asyncio.wait_for(rest(call), 5)
        await eventually(lambda: h.service.watchdog.hung)
        watchdog_probe = h.service.watchdog._probe_task
        watchdog_probe.cancel()  # only the client's probe may end the hang here
        fake.resume()
        resp = await h.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
        assert any(c.name == "inference_probe" and c.state == READY for c in resp.checks), resp
        await eventually(lambda: not h.service.watchdog.hung)
        assert await states(h.channel) == (READY, SERVING)


async def test_a_probe_that_times_out_keeps_it_hung_and_is_tried_again():
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0.4, "probe_timeout_s": 0.3,
                                    "health_interval_s": 60}) as h:
        call = h.stub.Generate(long_request("hung"))
        await call.read()
        fake.hang()
        await asyncio.wait_for(rest(call), 5)
        await eventually(lambda: h.service.watchdog.probes_started >= 3, timeout=10)
        assert h.service.watchdog.hung
        assert await states(h.channel) == (NOT_READY, NOT_SERVING)
        fake.resume()
        await eventually(lambda: not h.service.watchdog.hung, timeout=5)


async def test_draining_wins_over_ready_and_hung():
    """READY -> DRAINING, and NOT_READY (hung) -> DRAINING: a drained server never turns READY."""
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0.4, "health_interval_s": 0.1}) as h:
        call = h.stub.Generate(long_request("hung"))
        await call.read()
        fake.hang()
        await asyncio.wait_for(rest(call), 5)
        await eventually(lambda: h.service.watchdog.hung)
        drain = [e async for e in h.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True))]
        assert drain[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE
        assert await states(h.channel) == (DRAINING, NOT_SERVING)
        fake.resume()
        await eventually(lambda: not h.service.watchdog.hung, timeout=5)
        await asyncio.sleep(0.3)
        assert await states(h.channel) == (DRAINING, NOT_SERVING)
    fake = FakeBackend()
    async with serve_backend(fake, {"health_interval_s": 0.1}) as h:
        assert await states(h.channel) == (READY, SERVING)
        [e async for e in h.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True))]
        assert await states(h.channel) == (DRAINING, NOT_SERVING)


async def test_dead_is_final_and_kept_alive_when_asked():
    """NOT_READY (dead) in process with keep-alive: never READY again, whatever the engine does."""
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0.4, "keep_alive_on_engine_death": True}) as h:
        fake.die("engine core exited with code -9")
        await eventually(lambda: h.service.engine_died.is_set())
        assert await states(h.channel) == (NOT_READY, NOT_SERVING)
        fake._alive.set()  # even an engine that answers again: its process is gone
        await asyncio.sleep(0.5)
        assert await states(h.channel) == (NOT_READY, NOT_SERVING)
        assert h.service.watchdog.probes_started == 0  # a dead engine is not probed


def test_the_flag_and_the_plugin_variable(monkeypatch):
    import argparse

    from openengine_adapters.server_config import add_server_args

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert server_config_from_args(parser.parse_args([])).keep_alive_on_engine_death is False
    assert server_config_from_args(parser.parse_args(["--keep-alive-on-engine-death"])).keep_alive_on_engine_death
    monkeypatch.setenv("OE_TEST_PORT", "0")
    assert PLUGIN_ENV["keep_alive_on_engine_death"] == "OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH"
    for value, expected in (("1", True), ("true", True), ("0", False), ("no", False)):
        monkeypatch.setenv("OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH", value)
        assert plugin_server_config("OE_TEST_PORT", "H", "M").keep_alive_on_engine_death is expected
    monkeypatch.setenv("OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH", "maybe")
    with pytest.raises(ValueError, match="keep_alive_on_engine_death"):
        plugin_server_config("OE_TEST_PORT", "H", "M")
    assert ServerConfig().keep_alive_on_engine_death is False


async def _watch_health(channel, seen: list) -> None:
    """grpc.health.v1 Watch, every status it sends, until the server goes away."""
    try:
        async for resp in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()):
            seen.append(resp.status)
    except grpc.aio.AioRpcError:
        pass


async def test_a_dead_engine_ends_every_stream_once_then_the_process_exits_with_one_line():
    """The sidecar's process: every client sees exactly one terminal retryable error, grpc.health
    goes NOT_SERVING, then the process exits with ENGINE_DIED_EXIT_CODE within the documented
    bound, its last line naming the cause. Before issue 25 it served on as a zombie."""
    proc, port, _ = await start_fake("--progress-timeout-s", "0")
    lines: list[str] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            seen: list = []
            watcher = asyncio.ensure_future(_watch_health(channel, seen))
            await eventually(lambda: seen == [SERVING])
            streams = [stub.Generate(long_request(f"s{i}")) for i in range(3)]
            subs = [stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest()),
                    stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())]
            for s in streams:
                await s.read()
            dying = stub.Generate(gen_request("x", request_id="dies", metadata={"fake.die_after": "3"},
                                              stopping=g.StoppingOptions(max_tokens=100)))
            died_at = time.monotonic()
            for call in [*streams, dying]:
                events = await asyncio.wait_for(rest(call), 10)
                errors = [e.error for e in events if e.HasField("error")]
                assert len(errors) == 1 and events[-1].HasField("error"), events[-3:]
                assert (errors[0].code, errors[0].retryable, errors[0].retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
                assert "fake engine process exited" in errors[0].message
            for sub in subs:
                events = await asyncio.wait_for(rest(sub), 10)
                errors = [e.error for e in events if e.HasField("error")]
                assert len(errors) == 1 and errors[0].retryable and events[-1].HasField("error")
            code = await asyncio.wait_for(proc.wait(), ENGINE_DEATH_STOP_S + 10)
            elapsed = time.monotonic() - died_at
            await asyncio.wait_for(watcher, 5)
        lines = (await proc.stdout.read()).decode().splitlines()
        assert code == ENGINE_DIED_EXIT_CODE, lines[-20:]
        assert elapsed < ENGINE_DEATH_STOP_S, elapsed
        assert NOT_SERVING in seen and seen[0] == SERVING, seen
        assert lines[-1].startswith("error: the fake engine died: fake engine process exited"), lines[-5:]
        assert f"exiting with status {ENGINE_DIED_EXIT_CODE}" in lines[-1]
        assert not [line for line in lines if "Traceback" in line], lines
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_keep_alive_on_engine_death_serves_on_not_ready_until_stopped():
    proc, port, _ = await start_fake("--progress-timeout-s", "0", "--keep-alive-on-engine-death")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            call = stub.Generate(gen_request("x", request_id="dies", metadata={"fake.die_after": "2"},
                                             stopping=g.StoppingOptions(max_tokens=100)))
            events = await asyncio.wait_for(rest(call), 10)
            assert events[-1].error.retryable
            await asyncio.sleep(ENGINE_DEATH_STOP_S / 5)
            assert proc.returncode is None
            assert await states(channel) == (NOT_READY, NOT_SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(stub, gen_request("y", request_id="after"))
            assert "fake engine process exited" in refused.value.details()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_plugin_refuses_a_keep_alive_setting_its_host_server_would_not_honour(monkeypatch):
    """Plugin mode follows the host (vllm serve: VLLM_KEEP_ALIVE_ON_ENGINE_DEATH; sglang serve: never
    keeps a dead engine's process): our variable, when set, must agree, or the plugin does not start."""
    from openengine_adapters.server_config import check_plugin_keep_alive

    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.delenv("OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH", raising=False)
    unset = plugin_server_config("OE_TEST_PORT", "H", "M")
    check_plugin_keep_alive(unset, False, "the host exits")  # unset: the host decides, nothing to agree
    check_plugin_keep_alive(unset, True, "the host keeps it")
    monkeypatch.setenv("OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    keep = plugin_server_config("OE_TEST_PORT", "H", "M")
    check_plugin_keep_alive(keep, True, "the host keeps it")
    with pytest.raises(ValueError, match="OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH=1: in plugin mode the host"):
        check_plugin_keep_alive(keep, False, "sglang serve ends its process tree")
