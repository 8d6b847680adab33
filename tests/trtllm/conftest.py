"""The fake TensorRT-LLM installed as ``tensorrt_llm`` and a server around a TrtllmBackend."""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fake_trtllm  # noqa: E402

from openengine_adapters.server import OpenEngineServer, ServerConfig  # noqa: E402
from openengine_adapters.v1 import openengine_pb2_grpc  # noqa: E402

SUBMODULES = ("sampling_params", "disaggregated_params", "scheduling_params", "executor", "executor.request",
              "llmapi", "lora_helper")


@pytest.fixture(autouse=True)
def tensorrt_llm(monkeypatch):
    """``import tensorrt_llm`` (and its submodules the adapter uses) resolves to the fake."""
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake_trtllm)
    for name in SUBMODULES:
        alias = types.ModuleType(f"tensorrt_llm.{name}")
        alias.__dict__.update({k: v for k, v in vars(fake_trtllm).items() if not k.startswith("__")})
        monkeypatch.setitem(sys.modules, f"tensorrt_llm.{name}", alias)
    return fake_trtllm


class Harness:
    def __init__(self, server, channel, llm, backend):
        self.server = server
        self.channel = channel
        self.stub = openengine_pb2_grpc.OpenEngineStub(channel)
        self.llm = llm
        self.backend = backend


@contextlib.asynccontextmanager
async def serve_trtllm(args: fake_trtllm.Args | None = None, **options):
    from openengine_adapters.trtllm.backend import TrtllmBackend, TrtllmOptions

    llm = fake_trtllm.LLM(args)
    options.setdefault("poll_timeout_s", 0.02)
    options.setdefault("poll_interval_s", 0.005)
    backend = TrtllmBackend(llm, TrtllmOptions(**options), version=fake_trtllm.__version__)
    cfg = ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1", drain_grace_s=1.0)
    server = await OpenEngineServer(backend, cfg).start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Harness(server, channel, llm, backend)
    finally:
        await channel.close()
        await server.stop(0.5)


@pytest.fixture
async def trt():
    async with serve_trtllm() as h:
        yield h


@pytest.fixture
def serve():
    return serve_trtllm
