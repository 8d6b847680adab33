"""Stalled clients and hung or dead engines (issue 13, items 5-7), on both surfaces.

A frozen client is a raw channel with a small HTTP/2 window that opens a stream and never reads: the
server's write blocks once the window is full, as with a client process that is stopped or a host
that vanished without a FIN."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import grpc
import pytest
from fake_backend import FakeBackend, default_card
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import collect, eventually, gen_request, rejection, serve_backend, start_fake

from openengine_adapters.server_config import PLUGIN_ENV, ServerConfig, connection_options, plugin_server_config
from openengine_adapters.types import ErrorCode
from openengine_adapters.v0_1 import generation_pb2 as v01_generation
from openengine_adapters.v0_1 import lifecycle_pb2 as v01_lifecycle
from openengine_adapters.v0_1 import server_pb2 as v01_server
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import lifecycle_pb2, observability_pb2, openengine_pb2_grpc

# the client's per-stream window (no BDP growth): a few KB of responses fill it
FROZEN_CLIENT = [("grpc.http2.lookahead_bytes", 4096), ("grpc.http2.bdp_probe", 0)]
LONG = 100_000  # tokens: megabytes of responses


def long_backend() -> FakeBackend:
    return FakeBackend(cards=[default_card(max_output_tokens=LONG, max_context_length=LONG + 512)])


def frozen_generate(channel: grpc.aio.Channel, surface: str, rid: str, max_tokens: int = LONG):
    """Open a Generate and never read it."""
    if surface == "revision-1":
        return openengine_pb2_grpc.OpenEngineStub(channel).Generate(
            gen_request("hi", request_id=rid, stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True)))
    call = channel.unary_stream("/openengine.v1.Inference/Generate",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=v01_generation.GenerateResponse.FromString)
    return call(v01_generation.GenerateRequest(
        request_id=rid, prompt="hi", stopping=v01_generation.StoppingOptions(max_tokens=max_tokens, ignore_eos=True)))


SURFACES = ["revision-1", "v0.1.0"]


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_frozen_client_loses_its_stream_and_frees_the_slot(surface):
    fake = long_backend()
    n = 3
    async with serve_backend(fake, {"max_in_flight": n, "stall_timeout_s": 1.0, "metrics": True}) as h:
        frozen = grpc.aio.insecure_channel(h.target, options=FROZEN_CLIENT)
        try:
            calls = [frozen_generate(frozen, surface, f"frozen{i}") for i in range(n)]
            await eventually(lambda: h.service.admission.in_flight == n)
            # the slot is held while the client does not read ...
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(h.stub, gen_request("x", request_id="blocked"))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # ... until the stall watchdog ends the stream: engine request aborted, slot and id free
            waited = await eventually(lambda: h.service.admission.in_flight == 0 and len(h.service.registry) == 0)
            assert waited < 5
            assert sorted(fake.aborted) == [f"frozen{i}" for i in range(n)]
            assert not fake.running
            events = await collect(h.stub, gen_request("x", request_id="after",
                                                       stopping=g.StoppingOptions(max_tokens=4)))
            assert events[-1].finished.output_index == 0
            load = await h.stub.GetLoad(observability_pb2.GetLoadRequest())
            assert load.attributes["openengine.stalled_streams_ended"] == str(n)
            v01_load = await h.channel.unary_unary(
                "/openengine.v1.Control/GetLoad", request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=v01_server.LoadInfo.FromString)(v01_server.GetLoadRequest())
            assert v01_load.attributes["openengine.stalled_streams_ended"] == n
            from prometheus_client import REGISTRY

            assert REGISTRY.get_sample_value("openengine_stalled_streams_ended_total") == n
            assert REGISTRY.get_sample_value("openengine_engine_hung") == 0
            for call in calls:
                call.cancel()
        finally:
            await frozen.close()


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_stalled_watchdog_off_keeps_the_slot(surface):
    """--stall-timeout-s 0: the frozen stream holds its slot (what the watchdog exists to end)."""
    async with serve_backend(long_backend(), {"max_in_flight": 1, "stall_timeout_s": 0}) as h:
        frozen = grpc.aio.insecure_channel(h.target, options=FROZEN_CLIENT)
        try:
            call = frozen_generate(frozen, surface, "frozen")
            await eventually(lambda: h.service.admission.in_flight == 1)
            await asyncio.sleep(1.5)
            assert h.service.admission.in_flight == 1
            call.cancel()
            await eventually(lambda: h.service.admission.in_flight == 0)
        finally:
            await frozen.close()


async def test_a_frozen_subscriber_is_ended_and_frees_its_subscription_slot():
    fake = long_backend()
    async with serve_backend(fake, {"max_subscriptions": 1, "stall_timeout_s": 1.0}) as h:
        frozen = grpc.aio.insecure_channel(h.target, options=FROZEN_CLIENT)
        try:
            sub = openengine_pb2_grpc.OpenEngineStub(frozen).SubscribeRuntimeEvents(
                observability_pb2.SubscribeRuntimeEventsRequest())
            await eventually(lambda: h.service.subscriptions == 1)
            # thousands of FORWARD_PASS events, far more than the frozen window takes
            gen = h.stub.Generate(gen_request("x", request_id="busy", metadata={"fake.step_delay_ms": "1"},
                                              stopping=g.StoppingOptions(max_tokens=3000, ignore_eos=True)))
            await eventually(lambda: h.service.subscriptions == 0)
            assert h.service.watchdog.stalled_streams == 1
            # the slot is free: a new subscriber is taken
            fresh = h.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
            first = await asyncio.wait_for(fresh.read(), 5)
            assert first.HasField("runtime_event")
            fresh.cancel()
            gen.cancel()
            sub.cancel()
        finally:
            await frozen.close()


async def health_states(h) -> tuple[int, int]:
    mine = await h.stub.Health(lifecycle_pb2.HealthRequest())
    std = await health_pb2_grpc.HealthStub(h.channel).Check(health_pb2.HealthCheckRequest())
    return mine.state, std.status


async def test_a_hung_engine_is_not_ready_ends_every_stream_retryably_and_recovers():
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 1.0, "health_interval_s": 60}) as h:
        gen = h.stub.Generate(gen_request("x", request_id="hung", metadata={"fake.step_delay_ms": "20"},
                                          stopping=g.StoppingOptions(max_tokens=200)))
        v01 = h.channel.unary_stream("/openengine.v1.Inference/Generate",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=v01_generation.GenerateResponse.FromString)(
            v01_generation.GenerateRequest(request_id="hung-v01", prompt="x",
                                           stopping=v01_generation.StoppingOptions(max_tokens=200)),
            metadata=(("fake.step_delay_ms", "20"),))  # v0.1.0: application metadata rides in gRPC metadata
        sub = h.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
        await gen.read()
        await v01.read()
        await sub.read()
        assert await health_states(h) == (lifecycle_pb2.HEALTH_STATE_READY, health_pb2.HealthCheckResponse.SERVING)
        fake.hang()
        rest = await collect_rest(gen)
        assert rest[-1].HasField("error"), rest[-1]
        err = rest[-1].error
        assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
        assert "no progress" in err.message
        rest01 = await collect_rest(v01)
        assert rest01[-1].error.code == 11 and rest01[-1].error.retryable  # v0.1.0's ERROR_CODE_INTERNAL
        events = await collect_rest(sub)
        assert events[-1].HasField("error") and events[-1].error.retryable
        assert await gen.code() == await sub.code() == grpc.StatusCode.OK
        await eventually(lambda: len(h.service.registry) == 0)
        # hung: NOT_READY / NOT_SERVING, with nothing pending too (tests/test_lifecycle.py has every transition)
        assert h.service.watchdog.hung
        assert await health_states(h) == (lifecycle_pb2.HEALTH_STATE_NOT_READY,
                                          health_pb2.HealthCheckResponse.NOT_SERVING)
        v01_health = await h.channel.unary_unary(
            "/openengine.v1.Control/Health", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=v01_lifecycle.HealthResponse.FromString)(v01_lifecycle.HealthRequest())
        assert v01_health.state == v01_lifecycle.HEALTH_STATE_NOT_READY
        load = await h.stub.GetLoad(observability_pb2.GetLoadRequest())
        assert load.attributes["openengine.engine_hung"] == "true"
        fake.resume()  # the watchdog's probe inference finishes: progress
        await eventually(lambda: not h.service.watchdog.hung)
        events = await collect(h.stub, gen_request("z", request_id="after", stopping=g.StoppingOptions(max_tokens=3)))
        assert events[-1].HasField("finished")
        await asyncio.sleep(0.1)  # the grpc.health refresh is scheduled on the change
        assert await health_states(h) == (lifecycle_pb2.HEALTH_STATE_READY, health_pb2.HealthCheckResponse.SERVING)


async def test_a_dead_engine_ends_idle_subscriptions_with_one_retryable_error():
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0}) as h:
        runtime = h.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
        v01_kv = h.channel.unary_stream(
            "/openengine.v1.Control/SubscribeKvEvents", request_serializer=lambda b: b,
            response_deserializer=lambda b: b)(b"")
        await eventually(lambda: h.service.subscriptions == 2)
        fake.die("engine core exited with code 9")
        events = await collect_rest(runtime)
        assert len(events) == 1 and events[0].error.retryable
        assert events[0].error.code == ErrorCode.INTERNAL and "engine core exited" in events[0].error.message
        raw = await collect_rest(v01_kv)
        assert len(raw) == 1 and b"engine core exited" in raw[0]
        assert await runtime.code() == await v01_kv.code() == grpc.StatusCode.OK
        state, status = await health_states(h)
        assert (state, status) == (lifecycle_pb2.HEALTH_STATE_NOT_READY, health_pb2.HealthCheckResponse.NOT_SERVING)
        # new work is refused before acceptance, retryable elsewhere
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(h.stub, gen_request("x", request_id="after-death"))
        assert refused.value.code() == grpc.StatusCode.INTERNAL and "engine core exited" in refused.value.details()
        err = rejection(refused.value)
        assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect_rest(h.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest()))
        assert refused.value.code() == grpc.StatusCode.INTERNAL


class TakesOnFirstOutput(FakeBackend):
    """Accepts a request only once the engine gives its first output, as the SGLang backend does
    (openengine_adapters/sglang/backend.py ``generate`` awaits each sequence's first chunk)."""

    async def generate(self, params):
        await self._alive.wait()
        return await super().generate(params)


@pytest.mark.parametrize("fault", ["dies", "hangs"])
async def test_a_request_the_engine_was_still_taking_is_refused_retryably(fault):
    """Before acceptance, the stream has no terminal event to carry the failure: the call is refused with
    the error trailer, retryable at once (it was cancelled by the server's stop, UNAVAILABLE, before)."""
    fake = TakesOnFirstOutput()
    async with serve_backend(fake, {"progress_timeout_s": 1.0 if fault == "hangs" else 0}) as h:
        fake.hang()
        call = h.stub.Generate(gen_request("x", request_id="taking"))
        await eventually(lambda: len(h.service.registry) == 1)
        if fault == "dies":
            fake.die("engine core exited with code 9")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(collect_rest(call), 10)
        want = "engine core exited" if fault == "dies" else "no progress"
        assert refused.value.code() == grpc.StatusCode.INTERNAL and want in refused.value.details()
        err = rejection(refused.value)
        assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
        assert len(h.service.registry) == 0 and not h.service.watchdog.streams
        fake.resume()


async def test_abort_all_ends_the_streams_of_a_hung_engine_and_counts_them():
    fake = FakeBackend()
    async with serve_backend(fake, {"progress_timeout_s": 0}) as h:
        calls = [h.stub.Generate(gen_request("x", request_id=f"a{i}", metadata={"fake.step_delay_ms": "20"},
                                             stopping=g.StoppingOptions(max_tokens=200))) for i in range(2)]
        for c in calls:
            await c.read()
        fake.hang()  # deaf to the abort
        resp = await h.stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()))
        assert resp.message == "aborted 2 requests"
        for c in calls:
            rest = await asyncio.wait_for(collect_rest(c), 2)
            assert rest[-1].finished.reason == g.FINISH_REASON_CANCELLED
        assert len(h.service.registry) == 0
        fake.resume()


async def collect_rest(call) -> list:
    """The rest of a stream already read with ``call.read()``."""
    out = []
    while (r := await call.read()) is not grpc.aio.EOF:
        out.append(r)
    return out


async def test_sigterm_on_a_hung_engine_exits_within_the_grace_plus_a_small_bound():
    proc, port, _ = await start_fake("--drain-grace-s", "1", "--progress-timeout-s", "0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            call = stub.Generate(gen_request("x", request_id="stuck", metadata={"fake.hang_after": "2"},
                                             stopping=g.StoppingOptions(max_tokens=100)))
            await call.read()
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(collect_rest(call), 15)
            await asyncio.wait_for(proc.wait(), 15)
            elapsed = time.monotonic() - start
        assert rest[-1].HasField("error") and rest[-1].error.retryable, rest
        assert rest[-1].error.code == ErrorCode.DRAINING
        assert elapsed < 1 + 8, f"SIGTERM took {elapsed:.1f} s with a 1 s grace"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_lora_conflict_trailer_code_matches_already_exists(tmp_path):
    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    other = tmp_path / "b"
    other.mkdir()
    (other / "adapter_config.json").write_text("{}")
    from openengine_adapters.v1 import lora_pb2

    async with serve_backend(FakeBackend()) as h:
        await h.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
            lora_id=1, lora_name="a", source_path=str(adapter))))
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await h.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
                lora_id=1, lora_name="b", source_path=str(other))))
        assert exc.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert rejection(exc.value).code == ErrorCode.DUPLICATE_REQUEST


def test_plugins_take_the_watchdog_and_keepalive_settings_from_their_environment(monkeypatch):
    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.setenv(PLUGIN_ENV["max_subscriptions"], "7")
    monkeypatch.setenv(PLUGIN_ENV["stall_timeout_s"], "5")
    monkeypatch.setenv(PLUGIN_ENV["keepalive_time_s"], "15")
    config = plugin_server_config("OE_TEST_PORT", "OE_TEST_HOST", "OE_TEST_MAX")
    assert (config.max_subscriptions, config.stall_timeout_s, config.keepalive_time_s) == (7, 5.0, 15.0)
    assert config.progress_timeout_s == ServerConfig().progress_timeout_s
    options = dict(connection_options(config))
    assert options["grpc.keepalive_time_ms"] == 15000
    assert options["grpc.http2.max_pings_without_data"] == 0


class _Freezer:
    """A loopback TCP proxy that can stop forwarding in both directions: a peer host that vanished
    without closing its connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.frozen = asyncio.Event()
        self.server: asyncio.base_events.Server | None = None
        self.closed_by_server = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _client(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]

        async def pump(src, dst, from_server: bool) -> None:
            while not self.frozen.is_set():
                data = await src.read(65536)
                if not data:
                    if from_server:
                        self.closed_by_server.set()
                    return
                if self.frozen.is_set():
                    break
                dst.write(data)
            if from_server:  # frozen: keep reading the server's side only to see it close
                while await src.read(65536):
                    pass
                self.closed_by_server.set()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True),
                                 return_exceptions=True)

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        self.server.close()


async def test_keepalive_ends_the_stream_of_a_vanished_peer():
    """No FIN, no RST, no reads: only the server's keepalive ping (unanswered) finds the peer gone."""
    config = {"max_in_flight": 1, "stall_timeout_s": 0, "keepalive_time_s": 1.0, "keepalive_timeout_s": 1.0}
    async with serve_backend(FakeBackend(), config) as h:
        proxy = _Freezer(h.server.port)
        port = await proxy.start()
        peer = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            call = openengine_pb2_grpc.OpenEngineStub(peer).Generate(gen_request(
                "x", request_id="vanished", metadata={"fake.step_delay_ms": "50"},
                stopping=g.StoppingOptions(max_tokens=200)))
            await call.read()
            proxy.frozen.set()
            await asyncio.wait_for(proxy.closed_by_server.wait(), 8)
            await eventually(lambda: h.service.admission.in_flight == 0)
            call.cancel()
        finally:
            await peer.close()
            await proxy.close()
