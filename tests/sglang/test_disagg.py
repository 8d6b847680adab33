"""PREFILL / DECODE on the REAL SGLang engines with SGLang's ``fake`` KV transfer backend.

SGLang 0.5.23 refuses ``fake`` on a PREFILL server ("Prefill server does not support 'fake' as the
transfer backend"), and its real backends (mooncake, nixl) need RDMA / GPU transfer engines, so
the PREFILL role cannot run for real on this CPU: it is tested on a faithful fake of SGLang's
prefill tokenizer-manager behaviour (``test_prefill_fake.py``). The DECODE role runs for real here on
the ``fake`` backend, with SGLang's fake bootstrap host (what SGLang's own warmup uses): the request
goes through SGLang's decode queues and generates without received KV.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import pytest_asyncio
from conftest import CPU_FLAGS
from helpers import collect, expect_status, rejection, run_v0_1_client, v0_1_conformance
from sidecar import drain_output, launch, stop
from stream_contract import check_generate_stream

from openengine_adapters.engine_kit.sessions import text_digest
from openengine_adapters.v1 import engine_pb2, error_pb2, kv_pb2, lifecycle_pb2, openengine_pb2_grpc
from openengine_adapters.v1 import generation_pb2 as g

pytestmark = pytest.mark.asyncio(loop_scope="session")
FAKE_HOST = "2.2.2.2"  # SGLang's FAKE_BOOTSTRAP_HOST: the fake backend transfers nothing


class Sidecar:
    def __init__(self, channel, target):
        self.channel = channel
        self.stub = openengine_pb2_grpc.OpenEngineStub(channel)
        self.target = target


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def decode(model_dir):
    """A real DECODE engine on SGLang's fake transfer backend (SGLang refuses ``fake`` for PREFILL),
    served by the sidecar in its own process: ``Engine.shutdown`` kills every child process of the
    process it runs in, so a second in-process engine would take the session's engine down with it.
    ``host_pool`` retraction backup (the decode default) pins host memory with cudaHostRegister."""
    proc, target, lines = await launch(
        "--model-path", str(model_dir), "--served-model-name", "tiny", *CPU_FLAGS,
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake",
        "--disaggregation-decode-retraction-backup", "cpu_tensor", "--advertise-host", "127.0.0.1")
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            yield Sidecar(channel, target)
    finally:
        assert await stop(proc) == 0, "".join(lines[-40:])
        reader.cancel()


def req(rid, **kw):
    return g.GenerateRequest(request_id=rid, model="tiny", prompt="the cat sees the dog", **kw)


def session(room=12345, host=FAKE_HOST, port=8998, rank=0):
    ref = kv_pb2.KvSessionRef(session_id="s-1", transfer_backend="fake")
    ref.attributes_struct.update({"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room,
                                  "prefill_dp_rank": rank})
    return ref


async def test_decode_role_and_connector(decode):
    assert (await decode.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())).role == engine_pb2.ENGINE_ROLE_DECODE
    info = await decode.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
    assert info.enabled and info.transfer_backend == "fake" and info.supports_remote_prefill


async def test_decode_generates_from_a_session(decode):
    d = req("pd-decode")
    d.kv.session.CopyFrom(session())
    d.stopping.max_tokens = 6
    d.stopping.ignore_eos = True
    responses = await collect(decode.stub, d, timeout=120)
    summary = check_generate_stream(d, responses)
    assert summary.finished[0].reason == g.FINISH_REASON_LENGTH and len(summary.token_ids[0]) == 6


async def test_decode_rejects_bad_sessions(decode):
    await expect_status(decode.stub.Generate(req("no-session")), grpc.StatusCode.FAILED_PRECONDITION)
    d = req("bad-session")
    d.kv.session.session_id = "s"
    d.kv.session.attributes_struct.update({"bootstrap_host": "127.0.0.1", "bootstrap_port": 1234})
    await expect_status(decode.stub.Generate(d), grpc.StatusCode.INVALID_ARGUMENT, "bootstrap_room")
    d = req("bad-room")
    d.kv.session.CopyFrom(session(room=-1))
    await expect_status(decode.stub.Generate(d), grpc.StatusCode.INVALID_ARGUMENT, "bootstrap_room")
    d = req("real-host-on-fake")
    d.kv.session.CopyFrom(session(host="127.0.0.1"))
    await expect_status(decode.stub.Generate(d), grpc.StatusCode.INVALID_ARGUMENT, "bootstrap_host")


async def test_decode_takes_a_session_once_and_only_for_its_prompt(decode):
    """The shared session table's guarantees (engine_kit/sessions.py), as vLLM's: a second decode
    of one bootstrap room would wait for KV the prefill side already sent; a prompt other than the
    sealed one would decode on KV computed for a different prompt. Both refused before acceptance."""
    other = req("pd-other-prompt")
    other.kv.session.CopyFrom(session(room=777))
    other.kv.session.attributes_struct.update({"prompt_digest": text_digest("another prompt")})
    await expect_status(decode.stub.Generate(other), grpc.StatusCode.INVALID_ARGUMENT, "prompt", "differs")
    sealed = session(room=778)
    sealed.attributes_struct.update({"prompt_digest": text_digest("the cat sees the dog")})
    for rid in ("pd-once", "pd-right-prompt"):
        d = req(rid)
        d.kv.session.CopyFrom(session(room=777) if rid == "pd-once" else sealed)
        d.stopping.max_tokens = 2
        check_generate_stream(d, await collect(decode.stub, d, timeout=120))
    again = req("pd-again")
    again.kv.session.CopyFrom(session(room=777))
    exc = await expect_status(decode.stub.Generate(again), grpc.StatusCode.NOT_FOUND, "already decoded")
    assert rejection(exc).code == error_pb2.ERROR_CODE_KV_SESSION_NOT_FOUND


async def test_v0_1_decode_without_a_session_is_refused_naming_why(decode):
    """SGLang's decode mode takes every request as a KV transfer to wait for; without a bootstrap host only
    the fake backend skips it, decoding from KV nobody computed (sglang/srt/disaggregation/utils.py
    _is_fake_transfer, 0.5.x): no local request can be served honestly, so v0.1.0's conditional
    disaggregation is refused before acceptance, naming why, and ServerInfo.extra says so."""
    from google.protobuf import json_format

    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc
    from openengine_adapters.v0_1 import server_pb2 as v01_server
    from openengine_adapters.wire.v0_1.stub import V01Stub

    d = req("pd-local", stopping=g.StoppingOptions(max_tokens=4))
    await expect_status(V01Stub(decode.channel).Generate(d), grpc.StatusCode.FAILED_PRECONDITION,
                        "kv.session", "SGLang's decode mode")
    info = await v01_grpc.ControlStub(decode.channel).GetServerInfo(v01_server.GetServerInfoRequest())
    assert json_format.MessageToDict(info.extra)["decode_without_kv_session"].startswith("refused: ")


async def test_decode_health_probe(decode):
    resp = await decode.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY, resp


async def test_conformance_suite_on_the_decode_role(decode):
    from conformance import run_suite_async

    report = await run_suite_async(decode.target, "tiny", check_timeout_s=120)
    print(report.table())
    assert not report.failures(), "\n".join(f"{r.name}: {r.reason}" for r in report.failures())
    assert report.passed >= 20, f"only {report.passed} checks passed"
    await v0_1_conformance(decode.target, "tiny", check_timeout_s=120)
    await run_v0_1_client(decode.target, "--model", "tiny", "--expect-engine", "sglang")
