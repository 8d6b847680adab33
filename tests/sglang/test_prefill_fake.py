"""The PREFILL role on a FAITHFUL FAKE of SGLang's prefill-server tokenizer manager.

Why a fake: SGLang 0.5.23 refuses the ``fake`` transfer backend on a prefill server and its real
backends (mooncake, nixl) need RDMA / GPU transfer engines that this CPU machine lacks. The fake
reproduces what SGLang's prefill server does with a ``GenerateReqInput`` (disaggregation/prefill.py):
it needs the bootstrap host/port/room; while the decode peer has not connected, the request waits in
the bootstrap queue (abortable: finish ``abort``, no status code); once the KV is sent it ends with
the first sampled token and ``finish_reason {"type": "length", "length": 0}``. The real
``GenerateReqInput`` class is used, so the adapter's keyword arguments are SGLang's own.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from helpers import collect, eventually, expect_status, serve_backend
from stream_contract import check_generate_stream

from openengine_adapters.engine_kit.sessions import prompt_digest
from openengine_adapters.sglang.backend import SglangBackend, SglangOptions
from openengine_adapters.sglang.disagg import FAKE_BOOTSTRAP_HOST, decode_session
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2, lifecycle_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")
BOOTSTRAP_PORT = 18998


class FakePrefillTokenizerManager:
    """SGLang's prefill-server behaviour as the adapter sees it through TokenizerManager."""

    def __init__(self, wait_for_decode: bool = False):
        self.context_len = 2048
        self.is_generation = True
        self.tokenizer = None
        self.server_status = None
        self.gracefully_exit = False
        self.wait_for_decode = wait_for_decode
        self.received: list = []
        self.aborted: set[str] = set()
        self.running = 0

    def auto_create_handle_loop(self):
        pass

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()
        if obj.bootstrap_room is None or obj.bootstrap_host is None or obj.bootstrap_port is None:
            raise ValueError("prefill requests need bootstrap_host, bootstrap_port and bootstrap_room")
        self.received.append(obj)
        self.running += 1
        try:
            prompt = len(obj.input_ids)
            if self.wait_for_decode and obj.bootstrap_host != FAKE_BOOTSTRAP_HOST:
                while obj.rid not in self.aborted:  # the bootstrap queue: no decode peer yet
                    await asyncio.sleep(0.01)
                yield {"text": "", "output_ids": [], "meta_info": {
                    "id": obj.rid, "prompt_tokens": prompt, "completion_tokens": 0, "cached_tokens": 0,
                    "finish_reason": {"type": "abort", "message": "Aborted", "status_code": None}}}
                return
            await asyncio.sleep(0)
            yield {"text": "", "output_ids": [7], "meta_info": {
                "id": obj.rid, "prompt_tokens": prompt, "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 0}}}
        finally:
            self.running -= 1

    def abort_request(self, rid="", abort_all=False):
        self.aborted.add(rid)

    @property
    def load_snapshot_reader(self):  # SGLang's ShmLoadSnapshotReader: read_all, a blocking read
        return SimpleNamespace(read_all=self.read_loads)

    def read_loads(self):
        return [SimpleNamespace(dp_rank=0, num_running_reqs=self.running, num_waiting_reqs=0,
                                num_used_tokens=0, max_total_num_tokens=8192, num_waiting_uncached_tokens=0,
                                timestamp=1.0)]


def server_args():
    return SimpleNamespace(disaggregation_mode="prefill", disaggregation_transfer_backend="mooncake",
                           disaggregation_bootstrap_port=BOOTSTRAP_PORT, page_size=4, model_path="/m",
                           served_model_name="tiny", enable_lora=False, chunked_prefill_size=4096,
                           kv_events_config=None, dp_size=1, tp_size=1, pp_size=1, grammar_backend="none")


def backend(tm):
    return SglangBackend(tm, server_args(), {"max_total_num_tokens": 8192},
                         SglangOptions(served_model_names=("tiny",), advertise_host="10.1.2.3"))


def req(rid):
    return g.GenerateRequest(request_id=rid, model="tiny", token_ids=input_pb2.TokenIds(ids=[1, 5, 6, 7, 8]))


async def test_prefill_ready_carries_the_bootstrap_session():
    tm = FakePrefillTokenizerManager()
    async with serve_backend(backend(tm)) as h:
        r = req("p-1")
        responses = await collect(h.stub, r)
        summary = check_generate_stream(r, responses, prefill=True)
        ref = summary.prefill_ready.kv_session
        (obj,) = tm.received
        assert obj.sampling_params["max_new_tokens"] == 1
        assert (obj.bootstrap_host, obj.bootstrap_port) == ("10.1.2.3", BOOTSTRAP_PORT)
        assert ref.session_id == "p-1" and ref.transfer_backend == "mooncake"
        assert [(e.host, e.port, e.protocol) for e in ref.endpoints] == [("10.1.2.3", BOOTSTRAP_PORT,
                                                                          "sglang-bootstrap")]
        attrs = dict(ref.attributes_struct)
        assert attrs["bootstrap_host"] == "10.1.2.3" and attrs["bootstrap_port"] == BOOTSTRAP_PORT
        assert attrs["prefill_dp_rank"] == 0
        # the prompt is sealed in, so a decode engine refuses another prompt (engine_kit/sessions.py)
        assert attrs["prompt_digest"] == prompt_digest([1, 5, 6, 7, 8]) and attrs["prompt_tokens"] == 5
        # what a decode engine rebuilds from it: the same rendezvous (room as a string above 2^53)
        from google.protobuf import json_format

        decoded = decode_session(json_format.MessageToDict(ref.attributes_struct))
        assert decoded == {"bootstrap_host": "10.1.2.3", "bootstrap_port": BOOTSTRAP_PORT,
                           "bootstrap_room": obj.bootstrap_room, "disagg_prefill_dp_rank": 0}
        assert responses[-1].usage.prompt_tokens == 5
        load = await h.stub.GetLoad(__import__("openengine_adapters.v1.observability_pb2",
                                               fromlist=["x"]).GetLoadRequest())
        assert load.active_kv_sessions == 1


async def test_prefill_rooms_are_unique():
    tm = FakePrefillTokenizerManager()
    async with serve_backend(backend(tm)) as h:
        for i in range(5):
            await collect(h.stub, req(f"room-{i}"))
    assert len({o.bootstrap_room for o in tm.received}) == 5


async def test_prefill_rejects_decode_options():
    async with serve_backend(backend(FakePrefillTokenizerManager())) as h:
        r = req("p-max")
        r.stopping.max_tokens = 5
        await expect_status(h.stub.Generate(r), grpc.StatusCode.FAILED_PRECONDITION, "max_tokens")


async def test_abort_while_waiting_for_the_decode_peer():
    tm = FakePrefillTokenizerManager(wait_for_decode=True)
    async with serve_backend(backend(tm)) as h:
        call = h.stub.Generate(req("p-wait"))
        await eventually(lambda: tm.received)
        resp = await h.stub.Abort(lifecycle_pb2.AbortRequest(request_id="p-wait"))
        assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
        responses = [r async for r in call]
        assert responses[-1].WhichOneof("event") == "error"
        assert tm.aborted == {tm.received[0].rid} and tm.running == 0


async def test_prefill_probe_uses_sglangs_fake_bootstrap_host():
    tm = FakePrefillTokenizerManager(wait_for_decode=True)  # a real peer would never come
    async with serve_backend(backend(tm)) as h:
        resp = await h.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
        assert resp.state == lifecycle_pb2.HEALTH_STATE_READY, resp
        assert tm.received[-1].bootstrap_host == FAKE_BOOTSTRAP_HOST


async def test_connector_info():
    async with serve_backend(backend(FakePrefillTokenizerManager())) as h:
        info = await h.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
        assert info.enabled and info.transfer_backend == "mooncake"
        assert [(e.host, e.port) for e in info.local_endpoints] == [("10.1.2.3", BOOTSTRAP_PORT)]
