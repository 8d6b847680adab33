"""--metrics-port on the SGLang sidecar with --enable-metrics: SGLang's metrics (its processes write
them to PROMETHEUS_MULTIPROC_DIR) and ours on one endpoint, no series twice."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from conftest import CPU_FLAGS
from helpers import gen_request
from launch_helpers import metrics_url
from sidecar import drain_output, launch, stop

from openengine_adapters.v1 import openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_sidecar_serves_sglang_and_openengine_metrics(model_dir):
    proc, target, lines = await launch("--model-path", str(model_dir), "--served-model-name", "tiny", *CPU_FLAGS,
                                       "--enable-metrics", "--metrics-port", "0")
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            [r async for r in stub.Generate(gen_request("the cat", stopping={"max_tokens": 4, "ignore_eos": True}),
                                            timeout=120)]
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(metrics_url(lines), timeout=10).read().decode())
        assert "sglang:" in text, "SGLang's own metrics are served"
        assert "openengine_generated_tokens_total 4.0" in text
        samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
        assert len(samples) == len(set(samples)), "a series is served twice"
    finally:
        await stop(proc)
        reader.cancel()
