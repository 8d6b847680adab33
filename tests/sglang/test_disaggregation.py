"""PREFILL / DECODE on the REAL SGLang engines with SGLang's ``fake`` KV transfer backend.

SGLang 0.5.23 refuses ``fake`` on a PREFILL server ("Prefill server does not support 'fake' as the
transfer backend"), and its real backends (mooncake, nixl) need RDMA / GPU transfer engines, so
the PREFILL role cannot run for real on this CPU: it is tested on a faithful fake of SGLang's
prefill tokenizer-manager behaviour (``test_prefill_fake.py``). The DECODE role runs for real here on
the ``fake`` backend, with SGLang's fake bootstrap host (what SGLang's own warmup uses): the request
goes through SGLang's decode queues and generates without received KV.
"""

from __future__ import annotations

import grpc
import pytest
import pytest_asyncio
from conftest import engine_kwargs, serve_sglang
from helpers import collect, expect_status
from stream_contract import check_generate_stream

from openengine_adapters.v1 import engine_pb2, kv_pb2, lifecycle_pb2
from openengine_adapters.v1 import generation_pb2 as g

pytestmark = pytest.mark.asyncio(loop_scope="session")
FAKE_HOST = "2.2.2.2"  # SGLang's FAKE_BOOTSTRAP_HOST: the fake backend transfers nothing


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def decode(model_dir):
    """A real DECODE engine on SGLang's fake transfer backend (SGLang refuses ``fake`` for PREFILL)."""
    # host_pool retraction backup (the decode default) pins host memory with cudaHostRegister
    kw = engine_kwargs(model_dir, disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                       disaggregation_decode_retraction_backup="cpu_tensor")
    async with serve_sglang(kw) as served:
        yield served


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


async def test_decode_health_probe(decode):
    resp = await decode.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY, resp
