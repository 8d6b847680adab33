"""What one streamed gRPC message costs in Python, with no engine and no service logic at all.

A bare grpc.aio server (uvloop, as vLLM's servers run) streams one small GenerateResponse per
"engine step" (a ticker every --step-ms) to each of --streams concurrent Generate calls of
--tokens messages; the grpc.aio client counts them. It prints messages/s and the CPU time per
message of the server process and of the client: the floor under any Python gRPC front end that
sends a token per message, ours and vLLM's own alike. Compare it with the serving CPU per token
that ``bench/vllm_streaming.py`` reports for the in-process limit.

  python bench/grpc_floor.py [--streams 1 16 64] [--tokens 64] [--step-ms 3] [--seconds 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from measuring import free_port, process_cpu_s, write_results  # noqa: E402

from openengine_adapters.v1 import generation_pb2, openengine_pb2_grpc  # noqa: E402

REQUEST_ID = "oe-0123456789abcdef0123456789abcdef"


class Ticking(openengine_pb2_grpc.OpenEngineServicer):
    """Generate yields one token message per tick, like a DELTA stream at one token per step."""

    def __init__(self, step_s: float, tokens: int) -> None:
        self.step_s, self.tokens = step_s, tokens
        self.tick = asyncio.Event()

    async def run_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            tick, self.tick = self.tick, asyncio.Event()
            tick.set()

    async def Generate(self, request, context):
        for i in range(self.tokens):
            await self.tick.wait()
            resp = generation_pb2.GenerateResponse(request_id=REQUEST_ID)
            resp.token.output_index = 0
            resp.token.text = " tok"
            resp.token.tokens.add(token_id=i)
            yield resp


async def serve(port: int, step_s: float, tokens: int) -> None:
    server = grpc.aio.server()
    servicer = Ticking(step_s, tokens)
    openengine_pb2_grpc.add_OpenEngineServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ticker = asyncio.ensure_future(servicer.run_ticker())
    print("ready", flush=True)
    try:
        await server.wait_for_termination()
    finally:
        ticker.cancel()


async def measure(port: int, server_pid: int, streams: int, seconds: float) -> dict:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = openengine_pb2_grpc.OpenEngineStub(channel)
    request = generation_pb2.GenerateRequest(prompt="x")
    messages = 0

    async def one():
        nonlocal messages
        async for _ in stub.Generate(request):
            messages += 1

    async def worker(until: float):
        while time.perf_counter() < until:
            await one()

    await asyncio.gather(*(one() for _ in range(streams)))  # warm-up: one call each
    messages = 0
    server0, client0, start = process_cpu_s(server_pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(streams)))
    elapsed = time.perf_counter() - start
    server_us = (process_cpu_s(server_pid) - server0) / messages * 1e6
    client_us = (time.process_time() - client0) / messages * 1e6
    await channel.close()
    print(f"{streams} streams: {messages / elapsed:.0f} messages/s; CPU per message: server {server_us:.1f} us, "
          f"client {client_us:.1f} us")
    return {"streams": streams, "messages_per_s": messages / elapsed, "server_cpu_us_per_message": server_us,
            "client_cpu_us_per_message": client_us}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--json", metavar="PATH", help="also write the figures, the machine, the versions, the "
                        "command and the date as JSON (bench/plot.py floor draws it)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child: serve on this port
    args = parser.parse_args()
    if args.serve:
        await serve(args.serve, args.step_ms / 1000, args.tokens)
        return
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", str(port), "--step-ms", str(args.step_ms), "--tokens", str(args.tokens),
        stdout=asyncio.subprocess.PIPE)
    try:
        await asyncio.wait_for(proc.stdout.readline(), 30)
        rows = [await measure(port, proc.pid, streams, args.seconds) for streams in args.streams]
    finally:
        proc.terminate()
        await proc.wait()
    if args.json:
        settings = {"streams": args.streams, "tokens": args.tokens, "step_ms": args.step_ms, "seconds": args.seconds}
        write_results(args.json, "floor", settings, {"rows": rows})


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
