"""--metrics-port on the vLLM sidecar: vLLM's own Prometheus metrics and ours on one endpoint."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from helpers import gen_request
from launch_helpers import metrics_url
from sidecar import drain_output, launch, stop

from openengine_adapters.v1 import openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_sidecar_serves_vllm_and_openengine_metrics(model_dir):
    proc, target, lines = await launch("--model", str(model_dir), "--served-model-name", "tiny",
                                       "--max-model-len", "256", "--gpu-memory-utilization", "0.2",
                                       "--enforce-eager", "--dtype", "float32", "--metrics-port", "0")
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            [r async for r in stub.Generate(gen_request("The cat", stopping={"max_tokens": 4, "ignore_eos": True}))]
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(metrics_url(lines), timeout=10).read().decode())
        assert "vllm:" in text, "vLLM's own stat logger metrics are served"
        assert 'openengine_requests_total{code="OK",method="/openengine.v1.OpenEngine/Generate"} 1.0' in text
        assert "openengine_generated_tokens_total 4.0" in text
    finally:
        await stop(proc)
        reader.cancel()
