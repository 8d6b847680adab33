"""Real faults on the REAL vLLM sidecar (issue 25, item 4): its processes are frozen and killed under
open streams and subscriptions, and what every client sees, the health transitions, the exit code and
time, and the processes left behind are asserted (tests/chaos.py, docs/lifecycle.md).

A killed engine cannot be shared, so each engine start carries several faults: the first freezes
(SIGSTOP) and thaws (SIGCONT) the engine core, then kills it; the second runs vLLM's workers in their
own process (``--distributed-executor-backend mp``) and kills the worker. Two engine starts in all.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import grpc
import pytest
from chaos import (
    NOT_SERVING,
    PROGRESS_TIMEOUT_S,
    SERVING,
    death_is_seen_by_every_client_then_the_process_exits,
    health,
    held,
    long_generate,
    one_retryable_error,
    ready,
    rest,
)
from helpers import eventually, gen_request, rejection
from launch_helpers import Launched, engine_process, with_root

from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import lifecycle_pb2, openengine_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="session")
CORE_DIED = "the vLLM engine core died"  # VllmBackend.dead()


async def test_a_dead_engine_core_is_a_retryable_failure():
    """A request that died with its engine did not complete: retry it elsewhere at once, whether vLLM's
    output handler (EngineDeadError) or the watchdog sees the death first (issue 25)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from openengine_adapters.vllm.errors import engine_failure

    failure = engine_failure(EngineDeadError())
    assert (failure.code, failure.retryable, failure.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
    assert "engine died" in failure.message
    assert not engine_failure(RuntimeError("boom")).retryable


def flags(model_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "openengine_adapters.vllm", "--host", "127.0.0.1", "--port", "0",
            "--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len", "512", "--enforce-eager",
            "--dtype", "float32", "--seed", "0", "--progress-timeout-s", str(PROGRESS_TIMEOUT_S),
            "--drain-grace-s", "2", *extra]



async def test_a_frozen_engine_core_is_out_of_rotation_until_it_thaws_and_a_killed_one_ends_the_process(model_dir):
    server = Launched(flags(model_dir), with_root())
    try:
        target = await server.ready(600)
        core = engine_process(server, "EngineCore")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            assert await health(channel) == (lifecycle_pb2.HEALTH_STATE_READY, SERVING)
            # SIGSTOP: open streams end retryably after the progress timeout, and the server stays out of
            # rotation while idle (it flapped back to SERVING before issue 25). The Generates are sent
            # to the stopped core, so none can finish first
            os.kill(core.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            calls = [long_generate(stub, f"frozen-{i}") for i in range(2)]
            await held(stub, "vllm", len(calls), timeout=PROGRESS_TIMEOUT_S)
            for call in calls:
                err = one_retryable_error(await rest(call, PROGRESS_TIMEOUT_S + 15))
                assert "no progress" in err.message, err
            assert time.monotonic() - stopped_at < PROGRESS_TIMEOUT_S + 10
            for _ in range(4):  # several watchdog intervals with nothing pending
                assert await health(channel) == (lifecycle_pb2.HEALTH_STATE_NOT_READY, NOT_SERVING)
                await asyncio.sleep(1)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await rest(long_generate(stub, "while-frozen"))
            err = rejection(refused.value)
            assert (err.code, err.retryable, err.retry_after_ms) == (ErrorCode.INTERNAL, True, 0)
            # SIGCONT: the watchdog's probe inference finishes, READY again, and work is served
            os.kill(core.pid, signal.SIGCONT)
            waited = await eventually(lambda: ready(channel), timeout=60, interval=0.2)
            print(f"READY {waited:.1f} s after SIGCONT")
            events = await rest(stub.Generate(gen_request("after", request_id="thawed", model="tiny",
                                                          stopping=g.StoppingOptions(max_tokens=4))))
            assert events[-1].HasField("finished"), events[-1]
            # SIGKILL of the engine core: every client sees one retryable error, then the process exits
            elapsed = await death_is_seen_by_every_client_then_the_process_exits(
                server, stub, channel, core, "vllm", CORE_DIED)
            print(f"engine core SIGKILL: the sidecar exited {elapsed:.1f} s later")
    finally:
        server.kill()


async def test_a_killed_worker_process_ends_the_process(model_dir):
    """vLLM's workers in their own process (``--distributed-executor-backend mp``, as with tensor
    parallelism): SIGKILL of the worker kills the engine, and the sidecar ends as for the core."""
    server = Launched(flags(model_dir, "--distributed-executor-backend", "mp"), with_root())
    try:
        target = await server.ready(600)
        worker = engine_process(server, "Worker")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            elapsed = await death_is_seen_by_every_client_then_the_process_exits(
                server, stub, channel, worker, "vllm", CORE_DIED)
            print(f"worker SIGKILL: the sidecar exited {elapsed:.1f} s later")
    finally:
        server.kill()


async def test_the_plugin_follows_vllm_serve_when_the_engine_core_is_killed(model_dir):
    """Plugin mode: ``vllm serve`` owns the process. Its gRPC clients get the sidecar's one retryable
    error and NOT_SERVING at once; vLLM's own watchdog (every 5 s, ``terminate_if_errored``) then stops
    the server, the plugin's gRPC server with it, and ``vllm serve`` ends normally: status 0, which is
    vLLM's behaviour (docs/lifecycle.md: restart it whatever the status)."""
    from helpers import free_port

    http_port, grpc_port = free_port(), free_port()
    env = with_root({"VLLM_PLUGINS": "openengine", "OPENENGINE_GRPC_PORT": str(grpc_port),
                     "OPENENGINE_GRPC_HOST": "127.0.0.1", "OPENENGINE_PROGRESS_TIMEOUT_S": str(PROGRESS_TIMEOUT_S)})
    server = Launched([sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
                       "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(http_port),
                       "--enforce-eager", "--max-model-len", "512", "--dtype", "float32"], env)
    try:
        await server.wait_for(r"OpenEngine gRPC server .* ready on", 600)
        server.record_children()
        core = engine_process(server, "EngineCore")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            await eventually(lambda: ready(channel), timeout=60, interval=0.2)
            core.suspend()  # the Generate waits in the stopped core's queue: it cannot finish first
            call = long_generate(stub, "plugin-dies")
            await held(stub, "vllm", 1, timeout=PROGRESS_TIMEOUT_S)
            killed_at = time.monotonic()
            core.kill()
            one_retryable_error(await rest(call, 30))
            assert (await health(channel))[1] == NOT_SERVING
            code = await server.wait(60)
        elapsed = time.monotonic() - killed_at
        print(f"vllm serve with the plugin: engine core SIGKILL -> exit status {code} after {elapsed:.1f} s")
        assert code == 0 and elapsed < 5 + 20, (code, elapsed, server.tail())
        assert not server.leftovers(), server.leftovers()
    finally:
        server.kill()
