"""Observability of the vLLM sidecar, one sidecar for both: --metrics-port (vLLM's own Prometheus
metrics and ours on one endpoint) and --otlp-traces-endpoint (vLLM's flag: our RPC spans and vLLM's
request spans, exported to a real OTLP/gRPC receiver on loopback, tests/otlp_receiver.py)."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
import pytest_asyncio
from helpers import eventually, gen_request
from launch_helpers import metrics_url
from otlp_receiver import otlp_receiver
from sidecar import drain_output, launch, stop

from openengine_adapters.v0_1 import generation_pb2 as v01_gen
from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc
from openengine_adapters.v1 import openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")
CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sidecar(model_dir):
    async with otlp_receiver() as rx:
        proc, target, lines = await launch(
            "--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len", "256",
            "--gpu-memory-utilization", "0.2", "--enforce-eager", "--dtype", "float32", "--metrics-port", "0",
            "--otlp-traces-endpoint", rx.endpoint, env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
        reader = asyncio.ensure_future(drain_output(proc, lines))
        try:
            yield target, lines, rx
        finally:
            await stop(proc)
            reader.cancel()


async def test_sidecar_serves_vllm_and_openengine_metrics(sidecar):
    target, lines, _ = sidecar
    async with grpc.aio.insecure_channel(target) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        [r async for r in stub.Generate(gen_request("The cat", stopping={"max_tokens": 4, "ignore_eos": True}))]
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(metrics_url(lines), timeout=10).read().decode())
    assert "vllm:" in text, "vLLM's own stat logger metrics are served"
    assert 'openengine_requests_total{code="OK",method="/openengine.v1.OpenEngine/Generate"} 1.0' in text
    assert "openengine_generated_tokens_total 4.0" in text


async def test_trace_runs_from_the_caller_through_our_span_into_vllms(sidecar):
    target, _, rx = sidecar
    async with grpc.aio.insecure_channel(target) as channel:
        request = v01_gen.GenerateRequest(prompt="The cat", request_id="traced",
                                          stopping=v01_gen.StoppingOptions(max_tokens=3, ignore_eos=True))
        [r async for r in v01_grpc.InferenceStub(channel).Generate(
            request, metadata=(("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"),), timeout=60)]

    def chain():
        ours = [s for s in rx.named("openengine.v1.Inference/Generate") if s.trace_id == CALLER_TRACE]
        engine = [s for s in rx.spans if s.name == "llm_request" and s.trace_id == CALLER_TRACE]
        return (ours, engine) if ours and engine else None

    await eventually(chain, timeout=30, message=f"no caller -> ours -> vLLM chain in {rx.spans}")
    [ours], [engine] = chain()
    assert ours.parent_span_id == CALLER_SPAN, "our span is the caller's child"
    assert engine.parent_span_id == ours.span_id, "vLLM's request span is our span's child"
    assert ours.service_name == "openengine-adapters" and engine.attributes["gen_ai.request.id"]
