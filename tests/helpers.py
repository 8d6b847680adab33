"""Small helpers for calling the service in tests."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pathlib
import random
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
from launch_helpers import port_is_free, start_server

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ServerConfig
from openengine_adapters.v1 import error_pb2, generation_pb2, openengine_pb2_grpc


def _ephemeral_floor() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free right now, chosen below the kernel's ephemeral range: a port the kernel
    hands out for ``bind(0)`` can be handed out again to the engine (vLLM's ``get_open_port``,
    torch.distributed) in the seconds before our child binds it; one below the range is only taken
    by someone asking for it by number."""
    floor = _ephemeral_floor()
    low = max(1024, floor - 12000)
    for _ in range(200):
        port = random.randrange(low, floor)
        if port_is_free(port):
            return port
    raise RuntimeError(f"no free loopback port in {low}-{floor - 1}")


def gen_request(prompt: str = "hi", **kw) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(prompt=prompt, **kw)


async def collect(stub, request, timeout: float = 10.0) -> list[generation_pb2.GenerateResponse]:
    return [r async for r in stub.Generate(request, timeout=timeout)]


def rejection(exc: grpc.aio.AioRpcError) -> error_pb2.EngineError | None:
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_TRAILER:
            return error_pb2.EngineError.FromString(value)
    return None


async def expect_status(call, code: grpc.StatusCode, *fragments: str) -> grpc.aio.AioRpcError:
    """Await a unary call or drain a stream; assert it fails with ``code`` before any event."""
    events = []
    try:
        if hasattr(call, "__aiter__"):
            async for r in call:
                events.append(r)
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, f"expected {code}, got {exc.code()}: {exc.details()}"
        for frag in fragments:
            assert frag in exc.details(), f"{frag!r} not in {exc.details()!r}"
        assert not events, f"events were sent before the rejection: {events}"
        return exc
    raise AssertionError(f"expected {code}, the call succeeded with {events}")


async def outcome(call) -> tuple[grpc.StatusCode, grpc.aio.AioRpcError | None]:
    """Await a unary call or drain a stream; its final status and, when not OK, the error."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc
    return grpc.StatusCode.OK, None


def refused_stream_requests() -> Iterator:
    """The requests to send on a bidi stream the server is expected to refuse (reflection when off
    or unauthenticated): none. The refusal comes from the method and metadata alone, and a request
    written after the server has ended the call makes grpc.aio report INTERNAL "Failed execute_batch"
    instead of the server's status, about one call in ten here (grpc/grpc#36066)."""
    return iter(())


async def read_rest(call) -> list:
    """The remaining responses of a stream already read with ``call.read()``."""
    out = []
    while (r := await call.read()) is not grpc.aio.EOF:
        out.append(r)
    return out


class Harness:
    def __init__(self, server: OpenEngineServer, channel: grpc.aio.Channel, fake):
        self.server = server
        self.service = server.service
        self.channel = channel
        self.stub = openengine_pb2_grpc.OpenEngineStub(channel)
        self.fake = fake
        self.target = f"127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def serve_backend(backend, config: dict | None = None, harness=None, grace_s: float = 0.5):
    """An OpenEngine server on loopback around ``backend``; yields ``harness(server, channel, backend)``."""
    cfg = ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1",
                       drain_grace_s=1.0, **(config or {}))
    server = await OpenEngineServer(backend, cfg).start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield (harness or Harness)(server, channel, backend)
    finally:
        await channel.close()
        await server.stop(grace_s)


V0_1_CLIENT = pathlib.Path(__file__).with_name("v0_1_client.py")


def v0_1_client_argv(target: str, *extra: str) -> list[str]:
    """The unmodified v0.1.0 client (tests/v0_1_client.py) as a separate process against ``target``."""
    return [sys.executable, str(V0_1_CLIENT), "--target", target, *extra]


async def run_v0_1_client(target: str, *extra: str, timeout: float = 300.0) -> str:
    """Run the unmodified v0.1.0 client against ``target``; assert it passed; return its output."""
    # a thread, not asyncio's subprocess API: SGLang installs uvloop's loop policy, whose child
    # watcher asyncio.create_subprocess_exec cannot use
    run = await asyncio.to_thread(subprocess.run, v0_1_client_argv(target, *extra), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert run.returncode == 0 and " 0 failed" in run.stdout, run.stdout
    return run.stdout


async def v0_1_conformance(target: str, model: str, **kw):
    """The conformance suite on the v0.1.0 surface (run it before a destructive revision-1 run: that
    one ends with Drain); returns the report after asserting no check failed."""
    from conformance import run_suite_async

    report = await run_suite_async(target, model, contract="v0.1.0", **kw)
    print(report.table())
    failures = {r.name: r.reason for r in report.failures()}
    assert not failures, "v0.1.0 conformance failures:\n" + "\n".join(f"{k}: {v}" for k, v in failures.items())
    assert report.get("v0_1.server_info").status == "pass"
    return report


SERVE_FAKE = pathlib.Path(__file__).with_name("serve_fake.py")


async def start_fake(*args: str) -> tuple[asyncio.subprocess.Process, int, list[str]]:
    """tests/serve_fake.py as a process; returns it, its port and the log lines before 'ready'."""
    proc, port, lines = await start_server(
        [sys.executable, str(SERVE_FAKE), "--host", "127.0.0.1", "--port", "0", "--drain-grace-s", "0.5", *args],
        line_timeout=30)
    return proc, port, lines[:-1]


async def stop_fake(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)


async def fake_fails_to_start(*args: str) -> str:
    """serve_fake with ``args`` must exit non-zero before it is ready; returns what it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SERVE_FAKE), "--host", "127.0.0.1", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(SERVE_FAKE.parent.parent)})
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode != 0, out.decode()
    return out.decode()


async def eventually(check, timeout: float = 20.0, interval: float = 0.02,
                     message: str = "condition not reached in time") -> float:
    """Poll ``check`` (a function, sync or async, truthy once the condition holds) until it holds;
    fail the test after ``timeout`` seconds. Returns the seconds it took. The one poll-until helper."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return loop.time() - start
        assert loop.time() - start < timeout, message
        await asyncio.sleep(interval)
