"""TLS, tokens and the operator key checked on a sidecar started with them (tests/vllm and
tests/sglang test_security.py): one start per engine, certificates made at test time (tests/pki.py)."""

from __future__ import annotations

from pathlib import Path

import grpc
from helpers import collect, gen_request, outcome
from pki import make_ca

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.security.channel import open_channel
from openengine_adapters.v1 import engine_pb2, error_pb2, generation_pb2, lifecycle_pb2, openengine_pb2_grpc
from openengine_adapters.wire.v0_1.stub import V01Stub

CLIENT_KEY, ADMIN_KEY = "client-key-1", "admin-key-1"
FRESH = [("grpc.use_local_subchannel_pool", 1)]  # a new connection, so a new handshake, per channel


def secure_flags(directory: Path) -> tuple[list[str], str]:
    """The sidecar flags for TLS with a fresh CA, a client key and an admin key; and the CA file."""
    ca = make_ca(directory, "ca")
    server = ca.issue(directory, "server", hosts=("localhost", "127.0.0.1"))
    return ["--tls-cert-file", server.cert, "--tls-key-file", server.key,
            "--api-key", CLIENT_KEY, "--admin-api-key", ADMIN_KEY], ca.cert


def trailer_error(exc: grpc.aio.AioRpcError) -> error_pb2.EngineError:
    raw = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
    assert len(raw) == 1, f"no {ERROR_TRAILER} on {exc.code()}: {exc.details()}"
    return error_pb2.EngineError.FromString(raw[0])


async def check_secured_sidecar(target: str, ca_file: str, model: str) -> None:
    """Plaintext refused; a wrong token UNAUTHENTICATED; the client key generates on both surfaces and
    is PERMISSION_DENIED on operator RPCs, which the admin key runs (Abort of all, then Drain)."""
    info = engine_pb2.GetEngineInfoRequest()
    async with grpc.aio.insecure_channel(target, options=FRESH) as plain:
        code, _ = await outcome(openengine_pb2_grpc.OpenEngineStub(plain).GetEngineInfo(info, timeout=10))
        assert code == grpc.StatusCode.UNAVAILABLE, f"a plaintext client got {code}"
    for token in (None, "wrong", CLIENT_KEY + "x"):
        async with open_channel(target, ca_file=ca_file, token=token, options=FRESH) as channel:
            code, exc = await outcome(openengine_pb2_grpc.OpenEngineStub(channel).GetEngineInfo(info, timeout=10))
            assert code == grpc.StatusCode.UNAUTHENTICATED, (token, code)
            assert trailer_error(exc).details["auth"] == "unauthenticated"
    request = gen_request("Hello", model=model, stopping=generation_pb2.StoppingOptions(max_tokens=3, ignore_eos=True))
    abort_all = lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())
    drain = lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0)
    async with open_channel(target, ca_file=ca_file, token=CLIENT_KEY, options=FRESH) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        for surface in (stub, V01Stub(channel)):
            responses = await collect(surface, request, timeout=120)
            assert responses[-1].HasField("finished"), responses[-1]
            assert sum(len(r.token.tokens) for r in responses if r.HasField("token")) == 3
        for call in (stub.Abort(abort_all, timeout=10), V01Stub(channel).Abort(abort_all, timeout=10),
                     stub.Drain(drain, timeout=10)):
            code, exc = await outcome(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, code
            assert "admin API key" in trailer_error(exc).message
    async with open_channel(target, ca_file=ca_file, token=ADMIN_KEY, options=FRESH) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        assert (await stub.Abort(abort_all, timeout=10)).status == lifecycle_pb2.ABORT_STATUS_ABORTED
        assert (await V01Stub(channel).Abort(abort_all, timeout=10)).status == lifecycle_pb2.ABORT_STATUS_ABORTED
        events = [e async for e in stub.Drain(drain, timeout=60)]
        assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE, events
