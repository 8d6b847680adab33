"""Streaming throughput and time-to-first-token, side by side on one engine configuration:

  limit  in-process ``AsyncLLM.generate`` (DELTA outputs): no transport at all
  ours   ``python -m openengine_adapters.vllm`` over gRPC (openengine.v1 Generate)
  vllm   vLLM's own gRPC server (``python -m vllm.entrypoints.launchers.grpc_server``,
         needs ``pip install smg-grpc-servicer``)

at 1, 16 and 64 concurrent streams (kept in flight for a few seconds each), then the ratios
ours/limit and ours/vllm. Servers run as
child processes of this one, one at a time, with the same model and engine flags; every client
sends the same token-id prompt and asks for the same number of tokens (ignore_eos), so the
engines do identical work.

  python bench/vllm_streaming.py [--model DIR] [--tokens 64] [--concurrency 1 16 64] [--stream-interval N]

``--stream-interval N`` (vLLM's own engine flag, applied to all three) sends a stream's tokens
every N engine steps: fewer messages per token, the lever when many streams share few cores.

Without --model the demo model (tiny random Llama) is built and used: this then measures the
serving layers, since the model itself costs almost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPT_IDS = [1, 275, 340, 88, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311]


STREAM_INTERVAL = 1  # vLLM's --stream-interval, the same for all three (set from the command line)


def engine_flags(model: str, max_seqs: int) -> list[str]:
    return ["--model", model, "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512",
            "--dtype", "float32", "--max-num-seqs", str(max_seqs), "--seed", "0",
            "--stream-interval", str(STREAM_INTERVAL)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Result:
    def __init__(self, name: str, concurrency: int, elapsed: float, tokens: int, ttfts: list[float]):
        self.name, self.concurrency, self.elapsed, self.tokens = name, concurrency, elapsed, tokens
        self.ttft_ms = statistics.median(ttfts) * 1000

    @property
    def tps(self) -> float:
        return self.tokens / self.elapsed


MIN_SECONDS = 4.0


async def measure(name: str, concurrency: int, one) -> Result:
    """Keep ``concurrency`` streams of ``one(i) -> (ttft, tokens)`` in flight (each finished stream
    is replaced at once) for at least MIN_SECONDS; tokens/s over the whole window."""
    await asyncio.gather(*(one(-1 - i) for i in range(min(concurrency, 4))))  # warm-up
    results: list[tuple[float, int]] = []
    start = time.perf_counter()

    async def worker(i):
        while time.perf_counter() - start < MIN_SECONDS:
            results.append(await one(i))

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    return Result(name, concurrency, elapsed, sum(r[1] for r in results), [r[0] for r in results])


# --------------------------------------------------------------------------- limit: in process

async def bench_limit(model: str, levels: list[int], tokens: int) -> list[Result]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    ns = argparse.Namespace()
    parser = _vllm_parser()
    ns = parser.parse_args(engine_flags(model, max(levels)))
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(ns))
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    counter = iter(range(10**9))

    async def one(i):
        start, first, n = time.perf_counter(), None, 0
        async for out in engine.generate({"prompt_token_ids": PROMPT_IDS}, params, f"limit-{next(counter)}"):
            if first is None:
                first = time.perf_counter() - start
            n += sum(len(o.token_ids) for o in out.outputs)
        return first, n

    try:
        return [await measure("limit", c, one) for c in levels]
    finally:
        engine.shutdown()


def _vllm_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())


# --------------------------------------------------------------------------- servers

async def start_server(argv: list[str], ready: str, env: dict | None = None):
    """Start a server child process; return (process, output reader, the ready line's match)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    tail = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 600)).decode(errors="replace")
        if not line:
            raise RuntimeError("server exited:\n" + "".join(tail[-30:]))
        tail.append(line)
        if match := re.search(ready, line):
            break

    async def drain():
        while await proc.stdout.readline():
            pass

    return proc, asyncio.ensure_future(drain()), match


async def stop_server(proc, reader) -> None:
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 60)
    except TimeoutError:
        proc.kill()
    reader.cancel()


async def bench_ours(model: str, levels: list[int], tokens: int) -> list[Result]:
    import grpc

    from openengine_adapters.v1 import generation_pb2 as g
    from openengine_adapters.v1 import input_pb2, openengine_pb2_grpc

    proc, reader, ready = await start_server(  # port 0: the engine's own sockets may take a pre-picked port
        ["-m", "openengine_adapters.vllm", *engine_flags(model, max(levels)), "--host", "127.0.0.1",
         "--port", "0"], r"ready on .*:(\d+)")
    port = int(ready.group(1))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = openengine_pb2_grpc.OpenEngineStub(channel)
    request = g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=PROMPT_IDS),
                                sampling=g.SamplingParams(temperature=0.0),
                                stopping=g.StoppingOptions(max_tokens=tokens, ignore_eos=True))

    async def one(i):
        start, first, n = time.perf_counter(), None, 0
        async for resp in stub.Generate(request):
            if resp.HasField("token"):
                if first is None:
                    first = time.perf_counter() - start
                n += len(resp.token.tokens)
        return first, n

    try:
        return [await measure("ours", c, one) for c in levels]
    finally:
        await channel.close()
        await stop_server(proc, reader)


async def bench_vllm_grpc(model: str, levels: list[int], tokens: int) -> list[Result]:
    import grpc
    from smg_grpc_proto import vllm_engine_pb2 as v
    from smg_grpc_proto import vllm_engine_pb2_grpc

    port = free_port()
    proc, reader, _ = await start_server(
        ["-m", "vllm.entrypoints.launchers.grpc_server", *engine_flags(model, max(levels)),
         "--host", "127.0.0.1", "--port", str(port)], r"(?i)(server started|listening|ready|serving)",
        env={"SMG_VLLM_SERVICER_WARMUP": "off"})
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    for _ in range(600):  # the log line may come before the port accepts calls
        try:
            await stub.HealthCheck(v.HealthCheckRequest(), timeout=1)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.2)
    counter = iter(range(10**9))

    async def one(i):
        request = v.GenerateRequest(
            request_id=f"vllm-{next(counter)}", tokenized=v.TokenizedInput(input_ids=PROMPT_IDS),
            sampling_params=v.SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True), stream=True)
        start, first, n = time.perf_counter(), None, 0
        async for resp in stub.Generate(request):
            got = len(resp.chunk.token_ids) if resp.HasField("chunk") else 0
            if got and first is None:
                first = time.perf_counter() - start
            n += got
        return first, n

    try:
        return [await measure("vllm-grpc", c, one) for c in levels]
    finally:
        await channel.close()
        await stop_server(proc, reader)


# --------------------------------------------------------------------------- report

def report(results: dict[str, list[Result]], tokens: int) -> None:
    print(f"\nstreams of {tokens} tokens, prompt {len(PROMPT_IDS)} tokens, stream interval {STREAM_INTERVAL}\n")
    print(f"{'server':<10} {'streams':>7} {'tokens/s':>10} {'TTFT p50 ms':>12}")
    for rows in results.values():
        for r in rows:
            print(f"{r.name:<10} {r.concurrency:>7} {r.tps:>10.1f} {r.ttft_ms:>12.1f}")
    print(f"\n{'streams':>7} {'ours/limit tok/s':>17} {'ours/vllm-grpc tok/s':>21} {'TTFT ours/vllm-grpc':>20}")
    by = {name: {r.concurrency: r for r in rows} for name, rows in results.items()}
    for c, ours in by.get("ours", {}).items():
        limit, theirs = by.get("limit", {}).get(c), by.get("vllm-grpc", {}).get(c)
        a = f"{ours.tps / limit.tps:.3f}" if limit else "-"
        b = f"{ours.tps / theirs.tps:.3f}" if theirs else "-"
        t = f"{ours.ttft_ms / theirs.ttft_ms:.3f}" if theirs else "-"
        print(f"{c:>7} {a:>17} {b:>21} {t:>20}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--skip", nargs="*", default=[], choices=["limit", "ours", "vllm"])
    parser.add_argument("--stream-interval", type=int, default=1)
    args = parser.parse_args()
    global STREAM_INTERVAL
    STREAM_INTERVAL = args.stream_interval
    model = args.model
    if model is None:
        from openengine_adapters.demo_model import build_tiny_llama

        model = str(build_tiny_llama(Path(tempfile.gettempdir()) / "openengine-bench-llama"))
    results: dict[str, list[Result]] = {}
    if "limit" not in args.skip:
        results["limit"] = await bench_limit(model, args.concurrency, args.tokens)
    if "ours" not in args.skip:
        results["ours"] = await bench_ours(model, args.concurrency, args.tokens)
    if "vllm" not in args.skip:
        try:
            results["vllm-grpc"] = await bench_vllm_grpc(model, args.concurrency, args.tokens)
        except ImportError:
            print("vLLM gRPC server skipped: pip install smg-grpc-servicer", file=sys.stderr)
    report(results, args.tokens)


if __name__ == "__main__":
    asyncio.run(main())
