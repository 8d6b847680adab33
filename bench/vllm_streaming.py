"""Streaming throughput, time-to-first-token and serving CPU, side by side on one engine configuration:

  limit  in-process ``AsyncLLM.generate`` (DELTA outputs): no transport at all
  ours   ``python -m openengine_adapters.vllm`` over gRPC (openengine.v1 Generate)
  vllm   vLLM's own gRPC server (``python -m vllm.entrypoints.launchers.grpc_server``,
         needs ``pip install smg-grpc-servicer``)

at 1, 16 and 64 concurrent streams, then the ratios ours/limit and ours/vllm.

  python bench/vllm_streaming.py [--size tiny|small | --model DIR] [--rounds 3] [--seconds 4]
                                 [--tokens 64] [--concurrency 1 16 64] [--stream-interval N]

How it measures, and why:
- All three engines are started first (idle vLLM engines take no CPU), then measured in
  interleaved rounds: every round runs each (streams, target) window once, the targets in a
  rotating order. On a small shared machine throughput drifts by 20% from one minute to the
  next; a ratio taken from two windows seconds apart, and its median over rounds, does not.
- Every window keeps ``streams`` requests in flight (a finished one is replaced at once), all
  with the same token-id prompt and ``max_tokens`` (ignore_eos), so the engines do identical work.
- Serving CPU per token: CPU time of the process that serves the stream (the server's front-end
  process; the bench process itself for the limit) plus the client's, over the window, per token
  received. vLLM's engine-core and worker processes busy-poll, so their CPU says nothing; this
  figure is what a serving layer costs, and the one that decides throughput when the front end,
  the client and the engine share few cores (see the README's "Performance" section).
- ``--size tiny`` (default) is a random 2-layer Llama whose forward pass costs almost nothing: it
  measures the serving layers alone. ``--size small`` (8 layers, hidden 512, ~30M parameters) makes
  the engine's own step the larger cost, as a real model does. Both are built locally.
- ``--stream-interval N`` (vLLM's own engine flag, applied to all three) sends a stream's tokens
  every N engine steps: fewer messages per token.
- The event loop is uvloop, as in vLLM's own servers, for the limit and the clients alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from measuring import free_port, process_cpu_s

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPT_IDS = [1, 275, 340, 88, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311]
SIZES = {  # build_tiny_llama keyword arguments
    "tiny": {},
    "small": {"vocab_size": 8192, "hidden_size": 512, "layers": 8, "heads": 8, "kv_heads": 8},
}


def engine_flags(model: str, max_seqs: int, stream_interval: int) -> list[str]:
    return ["--model", model, "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512",
            "--dtype", "float32", "--max-num-seqs", str(max_seqs), "--seed", "0",
            "--stream-interval", str(stream_interval)]


@dataclass
class Window:
    tps: float
    ttft_ms: float
    cpu_us_per_token: float


@dataclass
class Target:
    """One way of streaming from the engine: ``one()`` runs one request and returns
    (ttft seconds, tokens); ``server_pid`` is the process whose CPU serves it (None: this one)."""
    name: str
    one: object
    server_pid: int | None = None
    close: object = None
    windows: dict[int, list[Window]] = field(default_factory=dict)


async def measure(target: Target, concurrency: int, seconds: float) -> Window:
    """Keep ``concurrency`` streams in flight for ``seconds`` (plus the stragglers' ends)."""
    await asyncio.gather(*(target.one() for _ in range(min(concurrency, 4))))  # warm-up
    results: list[tuple[float, int]] = []
    cpu0 = time.process_time()
    server0 = process_cpu_s(target.server_pid) if target.server_pid else 0.0
    start = time.perf_counter()

    async def worker():
        while time.perf_counter() - start < seconds:
            results.append(await target.one())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if target.server_pid:
        cpu += process_cpu_s(target.server_pid) - server0
    tokens = sum(n for _, n in results)
    return Window(tokens / elapsed, statistics.median(t for t, _ in results) * 1000, cpu / tokens * 1e6)


# --------------------------------------------------------------------------- targets

async def limit_target(flags: list[str], tokens: int) -> Target:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    ns = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(flags)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(ns))
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    counter = iter(range(10**9))

    async def one():
        start, first, n = time.perf_counter(), None, 0
        async for out in engine.generate({"prompt_token_ids": PROMPT_IDS}, params, f"limit-{next(counter)}"):
            if first is None:
                first = time.perf_counter() - start
            n += sum(len(o.token_ids) for o in out.outputs)
        return first, n

    async def close():
        engine.shutdown()

    return Target("limit", one, close=close)


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


def closer(proc, reader, channel):
    async def close():
        await channel.close()
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
        reader.cancel()
    return close


async def ours_target(flags: list[str], tokens: int) -> Target:
    import grpc

    from openengine_adapters.v1 import generation_pb2 as g
    from openengine_adapters.v1 import input_pb2, openengine_pb2_grpc

    proc, reader, ready = await start_server(  # port 0: the engine's own sockets may take a pre-picked port
        ["-m", "openengine_adapters.vllm", *flags, "--host", "127.0.0.1", "--port", "0"],
        r"ready on .*:(\d+)")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{ready.group(1)}")
    stub = openengine_pb2_grpc.OpenEngineStub(channel)
    request = g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=PROMPT_IDS),
                                sampling=g.SamplingParams(temperature=0.0),
                                stopping=g.StoppingOptions(max_tokens=tokens, ignore_eos=True))

    async def one():
        start, first, n = time.perf_counter(), None, 0
        async for resp in stub.Generate(request):
            if resp.HasField("token"):
                if first is None:
                    first = time.perf_counter() - start
                n += len(resp.token.tokens)
        return first, n

    return Target("ours", one, proc.pid, closer(proc, reader, channel))


async def vllm_grpc_target(flags: list[str], tokens: int) -> Target:
    import grpc
    from smg_grpc_proto import vllm_engine_pb2 as v
    from smg_grpc_proto import vllm_engine_pb2_grpc

    port = free_port()
    proc, reader, _ = await start_server(
        ["-m", "vllm.entrypoints.launchers.grpc_server", *flags, "--host", "127.0.0.1", "--port", str(port)],
        r"(?i)(server started|listening|ready|serving)", env={"SMG_VLLM_SERVICER_WARMUP": "off"})
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    for _ in range(600):  # the log line may come before the port accepts calls
        try:
            await stub.HealthCheck(v.HealthCheckRequest(), timeout=1)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.2)
    counter = iter(range(10**9))

    async def one():
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

    return Target("vllm-grpc", one, proc.pid, closer(proc, reader, channel))


# --------------------------------------------------------------------------- report

def report(targets: list[Target], levels: list[int], rounds: int, model: str, tokens: int,
           stream_interval: int) -> None:
    print(f"\nmodel {model}; streams of {tokens} tokens, prompt {len(PROMPT_IDS)} tokens, "
          f"stream interval {stream_interval}; medians over {rounds} interleaved rounds\n")
    print(f"{'target':<10} {'streams':>7} {'tokens/s':>10} {'TTFT p50 ms':>12} {'serving CPU us/token':>21}")
    for t in targets:
        for c in levels:
            w = t.windows[c]
            tps, ttft, cpu = (statistics.median(getattr(x, a) for x in w)
                              for a in ("tps", "ttft_ms", "cpu_us_per_token"))
            print(f"{t.name:<10} {c:>7} {tps:>10.1f} {ttft:>12.1f} {cpu:>21.1f}")
    by = {t.name: t for t in targets}

    def paired(a: str, b: str, c: int, attr: str) -> str:
        if a not in by or b not in by:
            return "-"
        pairs = zip(by[a].windows[c], by[b].windows[c], strict=True)
        ratios = sorted(getattr(x, attr) / getattr(y, attr) for x, y in pairs)
        return f"{statistics.median(ratios):.3f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"

    print("\nratios: median of the per-round ratios [lowest-highest]")
    print(f"{'streams':>7} {'ours/limit tok/s':>22} {'ours/vllm-grpc tok/s':>22} {'TTFT ours/vllm-grpc':>22} "
          f"{'CPU/token ours/vllm-grpc':>25}")
    for c in levels:
        print(f"{c:>7} {paired('ours', 'limit', c, 'tps'):>22} {paired('ours', 'vllm-grpc', c, 'tps'):>22} "
              f"{paired('ours', 'vllm-grpc', c, 'ttft_ms'):>22} "
              f"{paired('ours', 'vllm-grpc', c, 'cpu_us_per_token'):>25}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory (default: built from --size)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one measuring window")
    parser.add_argument("--skip", nargs="*", default=[], choices=["limit", "ours", "vllm"])
    parser.add_argument("--stream-interval", type=int, default=1)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from openengine_adapters.demo_model import build_tiny_llama

        model = str(build_tiny_llama(Path(tempfile.gettempdir()) / f"openengine-bench-llama-{args.size}",
                                     **SIZES[args.size]))
    flags = engine_flags(model, max(args.concurrency), args.stream_interval)
    makers = {"limit": limit_target, "ours": ours_target, "vllm": vllm_grpc_target}
    targets: list[Target] = []
    try:
        for key, make in makers.items():
            if key in args.skip:
                continue
            try:
                targets.append(await make(flags, args.tokens))
            except ImportError:
                if key != "vllm":
                    raise
                print("vLLM gRPC server skipped: pip install smg-grpc-servicer", file=sys.stderr)
        for r in range(args.rounds):
            for c in args.concurrency:
                for i in range(len(targets)):
                    t = targets[(i + r) % len(targets)]
                    t.windows.setdefault(c, []).append(await measure(t, c, args.seconds))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for t in targets:
            if t.close is not None:
                await t.close()
    report(targets, args.concurrency, args.rounds, model, args.tokens, args.stream_interval)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
