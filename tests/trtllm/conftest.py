"""The fake TensorRT-LLM installed as ``tensorrt_llm`` and a server around a TrtllmBackend."""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fake_trtllm  # noqa: E402
from helpers import serve_backend  # noqa: E402

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
async def serve_trtllm(args: fake_trtllm.Args | None = None, config: dict | None = None, **options):
    from openengine_adapters.trtllm.backend import TrtllmBackend, TrtllmOptions

    llm = fake_trtllm.LLM(args)
    options.setdefault("poll_timeout_s", 0.02)
    options.setdefault("poll_interval_s", 0.005)
    backend = TrtllmBackend(llm, TrtllmOptions(**options), version=fake_trtllm.__version__)
    async with serve_backend(backend, config, harness=lambda server, channel, b: Harness(server, channel, llm, b)) as h:
        yield h


@pytest.fixture
async def trt():
    async with serve_trtllm() as h:
        yield h


@pytest.fixture
def serve():
    return serve_trtllm
