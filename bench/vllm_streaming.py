"""Streaming throughput, latency and serving CPU, side by side on one engine configuration:

  limit        in-process ``AsyncLLM.generate`` (DELTA outputs): no transport at all
  ours         ``python -m openengine_adapters.vllm`` over gRPC (openengine.v1 Generate) at its
               defaults: adaptive coalescing on, grouping only while its event loop is busy
  ours-nocoal  the same with ``--coalesce-max-delay-ms 0``: one message per engine delta
  ours-grouped the same with ``--coalesce-loop-cpu 0``: always grouping (every stream sends
               at the policy's ticks, 20 ms apart), to show what grouping itself buys and costs
  vllm-grpc    vLLM's own gRPC server (``python -m vllm.entrypoints.launchers.grpc_server``,
               needs ``pip install smg-grpc-servicer``)
  vllm-http    vLLM's OpenAI-compatible HTTP server, ``/v1/completions`` streamed as SSE (what most
               users run today)

at 1, 16, 64 and 256 concurrent streams, then the ratios of ours to each.

  python bench/vllm_streaming.py [--size tiny|small | --model DIR] [--rounds 3] [--seconds 4]
                                 [--tokens 64] [--concurrency 1 16 64 256] [--stream-interval N]
                                 [--skip TARGET ...]

How it measures, and why:
- All engines are started first (idle vLLM engines take no CPU), then measured in interleaved
  rounds: every round runs each (streams, target) window once, the targets in a rotating order.
  On a small shared machine throughput drifts by 20% from one minute to the next; a ratio taken
  from two windows seconds apart, and its median over rounds, does not.
- Every window keeps ``streams`` requests in flight (a finished one is replaced at once), all
  with the same token-id prompt and ``max_tokens`` (ignore_eos), so the engines do identical work.
- Latency as the client sees it: TTFT (request sent -> first token) and inter-token latency (the
  gap between two messages that carry tokens, as vLLM's own serving benchmark counts it), p50 and
  p99 over every request of the window; tokens per message says how the stream was grouped.
- Serving CPU per token: CPU time of the process that serves the stream (the server's front-end
  process; the bench process itself for the limit) plus the client's, over the window, per token
  received. vLLM's engine-core and worker processes busy-poll, so their CPU says nothing; this
  figure is what a serving layer costs, and the one that decides throughput when the front end,
  the client and the engine share few cores (see the README's "Performance" section).
- ``--size tiny`` (default) is a random 2-layer Llama whose forward pass costs almost nothing: it
  measures the serving layers alone. ``--size small`` (8 layers, hidden 512, ~30M parameters) makes
  the engine's own step the larger cost, as a real model does. Both are built locally.
- ``--stream-interval N`` (vLLM's own engine flag, applied to all) sends a stream's tokens every N
  engine steps: fewer messages per token, at a fixed cost in latency.
- The event loop is uvloop, as in vLLM's own servers, for the limit and the clients alike.
- ``--smoke``: one short round at 1 and 4 streams, the limit and ours only (CI runs it so the
  bench cannot rot); its figures mean nothing.
"""

from __future__ import annotations

import asyncio
import os
import time

from measuring import free_port
from streaming import PROMPT_IDS, Stream, Target, closer, model_dir, ours_makers, parser, run, start_server

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def engine_flags(model: str, max_seqs: int, stream_interval: int) -> list[str]:
    return ["--model", model, "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512",
            "--dtype", "float32", "--max-num-seqs", str(max_seqs), "--seed", "0",
            "--stream-interval", str(stream_interval)]


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
        s = Stream(time.perf_counter())
        async for out in engine.generate({"prompt_token_ids": PROMPT_IDS}, params, f"limit-{next(counter)}"):
            s.got(sum(len(o.token_ids) for o in out.outputs))
        return s

    async def close():
        engine.shutdown()

    return Target("limit", one, close=close)


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
        s = Stream(time.perf_counter())
        async for resp in stub.Generate(request):
            s.got(len(resp.chunk.token_ids) if resp.HasField("chunk") else 0)
        return s

    return Target("vllm-grpc", one, proc.pid, closer(proc, reader, channel))


async def vllm_http_target(flags: list[str], tokens: int) -> Target:
    """vLLM's OpenAI server: ``/v1/completions`` with ``stream: true`` (SSE), token ids returned."""
    import json

    import aiohttp

    port = free_port()
    proc, reader, _ = await start_server(
        ["-m", "vllm.entrypoints.launchers.api_server.entry", *flags, "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "m", "--disable-uvicorn-access-log"], r"Application startup complete")
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    body = {"model": "m", "prompt": PROMPT_IDS, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    url = f"http://127.0.0.1:{port}/v1/completions"

    async def one():
        s = Stream(time.perf_counter())
        async with session.post(url, json=body) as resp:
            resp.raise_for_status()
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                ids = choice.get("token_ids")
                s.got(len(ids) if ids is not None else int(bool(choice.get("text"))))
        return s

    class _Session:
        async def close(self):
            await session.close()

    return Target("vllm-http", one, proc.pid, closer(proc, reader, _Session()))


MAKERS = {"limit": limit_target, **ours_makers("vllm"),
          "vllm-grpc": vllm_grpc_target, "vllm-http": vllm_http_target}
OPTIONAL = {"vllm-grpc": "pip install smg-grpc-servicer"}
RATIOS = (("ours", "limit", "tps"), ("ours", "vllm-grpc", "tps"), ("ours", "vllm-http", "tps"),
          ("ours", "ours-nocoal", "tps"), ("ours", "ours-nocoal", "itl_p99_ms"), ("ours-grouped", "ours-nocoal", "tps"),
          ("ours-grouped", "ours-nocoal", "cpu_us_per_token"))


async def main() -> None:
    args = parser(__doc__, MAKERS).parse_args()
    model = model_dir(args)
    await run(args, MAKERS, OPTIONAL, engine_flags(model, max(args.concurrency), args.stream_interval), model, RATIOS)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
