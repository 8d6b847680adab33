"""The ``sglang.srt.plugins`` entry point: OpenEngine gRPC inside SGLang's own HTTP server
(``python -m sglang.launch_server``, what ``sglang serve`` runs), sharing its live engine; off
unless ``OPENENGINE_GRPC_PORT`` is set."""

from __future__ import annotations

import asyncio
import importlib.metadata

import grpc
import pytest
from conftest import CPU_FLAGS
from helpers import collect, free_port, run_v0_1_client
from sidecar import drain_output, spawn, stop

from openengine_adapters.v1 import engine_pb2, openengine_pb2_grpc
from openengine_adapters.v1 import generation_pb2 as g

pytestmark = pytest.mark.asyncio(loop_scope="session")


def test_entry_point_registered():
    (ep,) = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name == "openengine"]
    assert ep.value == "openengine_adapters.sglang.plugin:register"


def test_register_is_off_without_the_variable(monkeypatch):
    from openengine_adapters.sglang import plugin

    monkeypatch.delenv(plugin.PORT_ENV, raising=False)
    plugin.register()
    assert not plugin._installed


async def test_grpc_inside_sglang_http_server(model_dir):
    grpc_port, http_port = free_port(), free_port()
    env = {"OPENENGINE_GRPC_PORT": str(grpc_port), "OPENENGINE_GRPC_HOST": "127.0.0.1", "OPENENGINE_DRAIN_GRACE_S": "1"}
    proc = spawn("-m", "sglang.launch_server", "--model-path", str(model_dir), "--served-model-name", "tiny",
                 "--host", "127.0.0.1", "--port", str(http_port), *CPU_FLAGS, env=env)
    lines: list[str] = []
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            info = None
            for _ in range(600):
                assert proc.poll() is None, "sglang exited:\n" + "".join(lines[-40:])
                try:
                    info = await stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=1)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.5)
            assert info is not None, "".join(lines[-40:])
            assert info.engine_name == "sglang" and list(info.supported_models) == ["tiny"]
            r = g.GenerateRequest(request_id="plugin", model="tiny", prompt="the cat")
            r.stopping.max_tokens = 4
            r.stopping.ignore_eos = True
            responses = await collect(stub, r, timeout=60)
            assert responses[-1].finished.reason == g.FINISH_REASON_LENGTH
            assert responses[-1].usage.completion_tokens == 4
            ready = [line for line in lines if "OpenEngine gRPC server" in line]  # one line says it listens
            assert len(ready) == 1 and ready[0].rstrip().endswith(
                f"OpenEngine gRPC server (sglang: tiny) ready on 127.0.0.1:{grpc_port}"), ready
            # v0.1.0 (Inference + Control) on the same port, checked by an unmodified v0.1.0 client
            await run_v0_1_client(f"127.0.0.1:{grpc_port}", "--model", "tiny", "--expect-engine", "sglang")
    finally:
        await stop(proc, timeout=60)
        reader.cancel()
