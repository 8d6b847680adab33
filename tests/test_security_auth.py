"""Bearer tokens and the operator-RPC policy on both surfaces, through gRPC on loopback and serve_fake.

A refusal carries the calling surface's own EngineError in ``openengine-error-bin``: revision 1's
(with ``details.auth``), or v0.1.0's, which has no ``details`` field.
"""

from __future__ import annotations

import grpc
import pytest
from fake_backend import FakeBackend
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import (
    collect,
    fake_fails_to_start,
    gen_request,
    outcome,
    refused_stream_requests,
    serve_backend,
    start_fake,
    stop_fake,
)

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.security.channel import open_channel
from openengine_adapters.security.tokens import Caller, TokenSet, bearer_token
from openengine_adapters.v0_1 import error_pb2 as v01_error_pb2
from openengine_adapters.v1 import engine_pb2, error_pb2, lifecycle_pb2, lora_pb2, openengine_pb2_grpc
from openengine_adapters.validation.peer import is_loopback
from openengine_adapters.wire.v0_1.stub import V01Stub

UNAUTHENTICATED, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
ALL = lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())


def adapter_dir(root) -> str:
    d = root / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text('{"r": 8}')
    return str(d)


def raw_trailer(exc: grpc.aio.AioRpcError) -> bytes:
    found = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
    assert len(found) == 1, f"no {ERROR_TRAILER} trailer on {exc.code()}: {exc.details()}"
    return found[0]


def revision1_stub(target: str, token: str | None = None):
    channel = open_channel(target, token=token)
    return channel, openengine_pb2_grpc.OpenEngineStub(channel)


def v01_channel(target: str, token: str | None = None) -> grpc.aio.Channel:
    return open_channel(target, token=token)


async def test_every_rpc_needs_a_configured_key_and_refusals_carry_each_surfaces_trailer():
    async with serve_backend(FakeBackend(), {"security": {"api_keys": ["key-one", "key-two"]}}) as h:
        for token in (None, "wrong", "key-one-"):
            channel, stub = revision1_stub(h.target, token)
            async with channel:
                code, exc = await outcome(stub.Generate(gen_request("hi"), timeout=5))
                assert code == UNAUTHENTICATED, token
                err = error_pb2.EngineError.FromString(raw_trailer(exc))
                assert err.details["auth"] == "unauthenticated" and not err.retryable
                code, exc = await outcome(stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=5))
                assert code == UNAUTHENTICATED
            async with v01_channel(h.target, token) as channel:
                generate = channel.unary_stream("/openengine.v1.Inference/Generate")
                code, exc = await outcome(generate(b"\x0a\x02hi", timeout=5))
                assert code == UNAUTHENTICATED
                raw = raw_trailer(exc)
                err = v01_error_pb2.EngineError.FromString(raw)
                assert err.message == exc.details() and err.SerializeToString() == raw, "not v0.1.0's encoding"
        for token in ("key-one", "key-two"):
            channel, stub = revision1_stub(h.target, token)
            async with channel:
                assert (await collect(stub, gen_request("hi")))[-1].HasField("finished")
            async with v01_channel(h.target, token) as channel:
                info = await V01Stub(channel).GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=5)
                assert info.schema_revision == 1
        # a non-bearer scheme is no key
        code, _ = await outcome(h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(),
                                                       metadata=(("authorization", "Basic a2V5LW9uZQ=="),)))
        assert code == UNAUTHENTICATED
        # probes carry no credentials: grpc.health stays open; reflection does not
        reply = await health_pb2_grpc.HealthStub(h.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(h.channel).ServerReflectionInfo(
            refused_stream_requests(), timeout=5)
        assert (await outcome(reflect))[0] == UNAUTHENTICATED


async def test_admin_key_guards_operator_rpcs_on_both_surfaces(tmp_path):
    config = {"security": {"api_keys": ["client"], "admin_api_keys": ["admin"], "lora_root": str(tmp_path)}}
    async with serve_backend(FakeBackend(), config) as h:
        adapter = adapter_dir(tmp_path)
        load = lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(lora_id=1, lora_name="ad", source_path=adapter))
        unload = lora_pb2.UnloadLoraRequest(lora_name="ad")
        drain = lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0)
        for token, expected in (("client", DENIED), (None, UNAUTHENTICATED)):
            channel, stub = revision1_stub(h.target, token)
            async with channel:
                for call in (stub.Abort(ALL), stub.Drain(drain), stub.LoadLora(load), stub.UnloadLora(unload)):
                    code, exc = await outcome(call)
                    assert code == expected, (token, code)
                    err = error_pb2.EngineError.FromString(raw_trailer(exc))
                    assert err.message == exc.details() and err.details["auth"]
                    if token == "client":
                        assert "operator RPC" in err.message and "admin API key" in err.message
                if token == "client":  # aborting one request stays a client action
                    code, exc = await outcome(stub.Abort(lifecycle_pb2.AbortRequest(request_id="nope")))
                    assert code == grpc.StatusCode.NOT_FOUND
            async with v01_channel(h.target, token) as channel:
                v01 = V01Stub(channel)
                for call in (v01.Abort(ALL), v01.LoadLora(load), v01.UnloadLora(unload)):
                    assert (await outcome(call))[0] == expected
        assert not h.fake.loras and h.service.lifecycle.accepting
        channel, stub = revision1_stub(h.target, "admin")
        async with channel:
            assert (await collect(stub, gen_request("hi")))[-1].HasField("finished")  # valid on data RPCs
            assert (await stub.Abort(ALL)).status == lifecycle_pb2.ABORT_STATUS_ABORTED
            assert (await stub.LoadLora(load)).adapter.lora_name == "ad"
            async with v01_channel(h.target, "admin") as v01_channel_:
                assert (await V01Stub(v01_channel_).UnloadLora(unload)).adapter.lora_name == "ad"
            assert [r async for r in stub.Drain(drain)][-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE


async def test_an_admin_key_alone_leaves_data_rpcs_open_and_guards_operator_rpcs():
    async with serve_backend(FakeBackend(), {"security": {"admin_api_keys": ["admin"]}}) as h:
        assert (await collect(h.stub, gen_request("hi")))[-1].HasField("finished")
        code, exc = await outcome(h.stub.Abort(ALL))  # loopback, but an admin key exists: it is needed
        assert code == UNAUTHENTICATED and "admin API key" in exc.details()
        channel, stub = revision1_stub(h.target, "admin")
        async with channel:
            assert (await stub.Abort(ALL)).status == lifecycle_pb2.ABORT_STATUS_ABORTED


async def test_key_file_and_environment_variable_and_start_up_report(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    keys.write_text("# client keys\nfrom-file\n\n")
    monkeypatch.setenv("OPENENGINE_API_KEY", "from-env")
    proc, port, log = await start_fake("--api-key", "from-flag", "--api-key-file", str(keys))
    try:
        text = "".join(log)
        assert "3 API key(s) required" in text, text
        assert "operator RPCs (Abort all, Drain, LoadLora, UnloadLora) are accepted only from loopback" in text
        for token in ("from-flag", "from-file", "from-env"):
            channel, stub = revision1_stub(f"127.0.0.1:{port}", token)
            async with channel:
                await stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=5)
        channel, stub = revision1_stub(f"127.0.0.1:{port}", "other")
        async with channel:
            assert (await outcome(stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())))[0] == UNAUTHENTICATED
    finally:
        await stop_fake(proc)
    keys.write_text("# nothing but comments\n")  # an empty secret mount must not turn authentication off
    assert "no keys in the file" in await fake_fails_to_start("--api-key-file", str(keys))


async def test_no_reflection_turns_reflection_off():
    for enabled in (True, False):
        async with serve_backend(FakeBackend(), {"security": {"reflection": enabled}}) as h:
            requests = (iter([reflection_pb2.ServerReflectionRequest(list_services="")]) if enabled
                        else refused_stream_requests())
            call = reflection_pb2_grpc.ServerReflectionStub(h.channel).ServerReflectionInfo(requests, timeout=5)
            code, _ = await outcome(call)
            assert code == (grpc.StatusCode.OK if enabled else grpc.StatusCode.UNIMPLEMENTED)


def test_tokens_and_peers():
    tokens = TokenSet(["c1", "c2"], ["a1"])
    assert tokens.identify([("authorization", "Bearer c2")]) == Caller.CLIENT
    assert tokens.identify([("authorization", "bearer  a1 ")]) == Caller.OPERATOR
    assert tokens.identify([("authorization", "Bearer c")]) == Caller.INVALID
    assert tokens.identify([("authorization", "Bearer ")]) == Caller.INVALID
    assert tokens.identify([("x", "y")]) == Caller.ANONYMOUS
    assert TokenSet().identify([("authorization", "Bearer x")]) == Caller.ANONYMOUS  # meant for a proxy
    assert bearer_token([("authorization", "Token x")]) == ""
    for bad in ([""], ["has space"], ["tab\t"]):
        with pytest.raises(ValueError):
            TokenSet(bad)
    assert is_loopback("ipv4:127.0.0.1:5000") and is_loopback("ipv4:127.8.9.10:1")
    assert is_loopback("ipv6:[::1]:5000") and is_loopback("ipv6:[::ffff:127.0.0.1]:5000")
    assert is_loopback("unix:/tmp/sock")
    assert not is_loopback("ipv4:198.18.13.2:5000") and not is_loopback("ipv6:[fe80::1%eth0]:5")
    assert not is_loopback("ipv6:[::ffff:198.18.0.1]:5") and not is_loopback("garbage")
