"""``python -m openengine_adapters.sglang`` and the ``sglang serve`` plugin as users run them
(issue 17): the README's command verbatim, a busy port, Ctrl-C at start-up and while serving,
``--help`` and ``--version``, a missing model path, the plugin's warning when it is not configured."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
import sys

import grpc
import pytest
from launch_helpers import (
    Launched,
    listening,
    port_is_free,
    readme_command,
    run_quick,
    stderr_lines,
    tree_rss_bytes,
    user_env,
)

from openengine_adapters import schema
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import kv_pb2, openengine_pb2_grpc

SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")  # every async test here, as in the rest of the suite

LAUNCHER = [sys.executable, "-m", "openengine_adapters.sglang"]


async def read_rest(call, timeout: float = 30) -> list:
    out = []
    while (r := await asyncio.wait_for(call.read(), timeout)) is not grpc.aio.EOF:
        out.append(r)
    return out


@SESSION_LOOP
async def test_readme_run_command_serves_the_demo_verbatim(tmp_path):
    """`python -m openengine_adapters.sglang`, exactly as the README says: it fits (the demo's KV cache
    is capped), serves, streams KV events without any KV-event flag, drains on Ctrl-C and aborts on a
    second one, and leaves nothing behind."""
    argv = readme_command("sglang")
    assert port_is_free(50051), "port 50051 is taken: the README's command serves there"
    server = Launched(argv, user_env(OPENENGINE_DEMO_MODEL_DIR=str(tmp_path / "demo")))
    try:
        target = await server.ready(600)
        assert server.port == 50051 and re.search(r"\(sglang: demo-llama\) ready on 0\.0\.0\.0:50051$",
                                                  server.output, re.M), server.tail()
        assert tree_rss_bytes(server.proc.pid) < 4 << 30  # SGLang's own default took 15 GB of KV cache here
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            events = stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
            await asyncio.sleep(0.5)
            req = g.GenerateRequest(prompt="Hello there", stopping=g.StoppingOptions(max_tokens=40, ignore_eos=True))
            out = [r async for r in stub.Generate(req, timeout=120)]
            assert out[-1].finished.reason == g.FINISH_REASON_LENGTH and out[-1].usage.completion_tokens == 40
            stored = None
            while stored is None:
                batch = (await asyncio.wait_for(events.read(), 30)).batch
                stored = next((e.block_stored for e in batch.events if e.HasField("block_stored")), None)
            assert stored.token_ids
            events.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as private:  # the default publisher is not advertised
                await stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
            assert private.value.code() == grpc.StatusCode.UNIMPLEMENTED
            call = stub.Generate(g.GenerateRequest(prompt="Hello", stopping=g.StoppingOptions(max_tokens=1500,
                                                                                                ignore_eos=True)))
            await call.read()
            server.ctrl_c()  # a terminal's Ctrl-C: the whole foreground process group
            await server.wait_for(r"SIGINT: draining for up to 30 s", 30)
            assert (await asyncio.wait_for(call.read(), 30)).HasField("token")  # the drain lets it go on
            server.ctrl_c()
            await server.wait_for(r"SIGINT again: aborting the remaining requests now", 30)
            rest = await read_rest(call)
            assert rest[-1].error.code == 11 and rest[-1].error.retryable  # ERROR_CODE_DRAINING, at once
        assert await server.wait(120) == 0
        assert "Traceback" not in server.output, server.output
        assert not server.leftovers(), server.leftovers()
    finally:
        server.kill()


def test_readme_run_command_on_a_busy_port_fails_in_a_second():
    with contextlib.ExitStack() as stack:
        if port_is_free(50051):
            stack.enter_context(listening("0.0.0.0", 50051))
        code, out, err, seconds = run_quick(readme_command("sglang"))
    assert code == 1, (out, err)
    assert stderr_lines(err) == [
        "error: cannot serve gRPC on 0.0.0.0:50051: the address is already in use; stop the other server, "
        "choose another --port, or pass --reuse-port to share the port"], err
    assert seconds < 10, seconds


@SESSION_LOOP
async def test_ctrl_c_during_start_up_stops_the_engine_without_tracebacks(tmp_path):
    server = Launched([*LAUNCHER, "--port", "0"], user_env(OPENENGINE_DEMO_MODEL_DIR=str(tmp_path / "demo")))
    try:
        await server.wait_for(r"Load weight begin|Init parallel begin", 600)  # SGLang's scheduler is starting
        server.record_children()
        assert server.children
        server.ctrl_c()
        assert await server.wait(60) == 130, server.tail()
        assert server.last_line_but_exit_notes() == "SIGINT during start-up: stopped the SGLang engine before it served"
        assert "Traceback" not in server.output, server.output
        await asyncio.sleep(1)
        assert not server.leftovers(), server.leftovers()
    finally:
        server.kill()


def test_version_help_and_a_missing_model_path():
    code, out, err, seconds = run_quick([*LAUNCHER, "--version"])
    assert code == 0, err
    assert out.splitlines()[:2] == [f"openengine-adapters {importlib.metadata.version('openengine-adapters')}",
                                    f"sglang {importlib.metadata.version('sglang')}"], out
    assert schema.SCHEMA_RELEASE in out and schema.V0_1_SCHEMA_RELEASE in out and seconds < 10, out
    code, out, err, _ = run_quick([*LAUNCHER, "--help"])
    assert code == 0, err
    sections = [line[:-1] for line in out.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert sections[:3] == ["OpenEngine server", "OpenEngine SGLang adapter", "OpenEngine security"], sections
    assert "Without --model-path this serves a tiny demo Llama" in " ".join(out.split())
    code, out, err, _ = run_quick([*LAUNCHER, "--model-path", "/no/such/model", "--port", "0"])
    assert code == 1 and stderr_lines(err)[-1] == (
        "error: --model-path /no/such/model: no such file or directory (a local model path must exist; a hub "
        "model is named ORG/NAME)"), err


def test_plugin_installed_but_not_configured_warns():
    """`sglang serve` (here `python -m sglang.launch_server`) without OPENENGINE_GRPC_PORT says that the
    plugin serves nothing (the model path is bad, so SGLang stops right after loading its plugins)."""
    code, out, err, _ = run_quick([sys.executable, "-m", "sglang.launch_server", "--model-path", "/no/such/model"],
                                  timeout=600)
    assert code != 0
    assert "the openengine plugin is installed but OPENENGINE_GRPC_PORT is not set" in out + err, out + err
