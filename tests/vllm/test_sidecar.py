"""The sidecar as a user runs it: ``python -m openengine_adapters.vllm`` with vLLM's own flags."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
from helpers import collect
from sidecar import drain_output, launch, stop
from stream_contract import check_generate_stream

from openengine_adapters.client import OpenEngineClient
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import lifecycle_pb2, openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _rest(call):
    while (r := await call.read()) is not grpc.aio.EOF:
        yield r


async def test_vllm_flags_are_accepted_unchanged(model_dir):
    """vLLM's own flags reach the engine (names, aliases, limits, the priority policy); the sidecar serves,
    probes, and on SIGTERM drains an open stream to its finish before it exits 0."""
    proc, target, _ = await launch("--model", str(model_dir), "--served-model-name", "tiny", "alias",
                                   "--max-model-len", "256", "--enforce-eager", "--gpu-memory-utilization", "0.2",
                                   "--max-num-seqs", "4", "--scheduling-policy", "priority")
    reader = asyncio.ensure_future(drain_output(proc))
    try:
        async with OpenEngineClient(target) as client:
            info = await client.get_model_info("alias")
            assert info.served_model_name == "tiny" and list(info.served_model_aliases) == ["alias"]
            assert info.max_context_length == 256 and info.max_running_requests == 4
            assert info.generation.supports_priority
            stub = openengine_pb2_grpc.OpenEngineStub(client.channel)
            req = g.GenerateRequest(model="alias", prompt="Hello",
                                    stopping=g.StoppingOptions(max_tokens=5, ignore_eos=True))
            s = check_generate_stream(req, await collect(stub, req, timeout=60))
            assert len(s.token_ids[0]) == 5
            health = await stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
            assert health.state == lifecycle_pb2.HEALTH_STATE_READY
            # SIGTERM with a stream open: drained to its finish, not dropped, then exit 0
            long = g.GenerateRequest(model="tiny", prompt="Hello",
                                     stopping=g.StoppingOptions(max_tokens=60, ignore_eos=True))
            call = stub.Generate(long)
            await call.read()
            proc.send_signal(signal.SIGTERM)
            rest = [r async for r in _rest(call)]
            assert rest[-1].finished.reason == g.FINISH_REASON_LENGTH
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await stop(proc)
        reader.cancel()
