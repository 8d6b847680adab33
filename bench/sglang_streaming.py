"""Streaming throughput, latency and serving CPU on SGLang, side by side on one engine configuration:

  limit        in-process ``Engine.async_generate(stream=True)``: no transport at all
  ours         ``python -m openengine_adapters.sglang`` over gRPC at its defaults (adaptive
               coalescing on, grouping only while its event loop is busy)
  ours-nocoal  the same with ``--coalesce-max-delay-ms 0``
  ours-grouped the same with ``--coalesce-loop-cpu 0``: always grouping
  sglang-http  SGLang's own HTTP server (``python -m sglang.launch_server``), ``/generate`` streamed

at 1, 16, 64 and 256 concurrent streams, then the ratios of ours to each. Run it in the `sglang`
test environment (the CPU engine needs its shims, as the nox session sets them up):

  PYTHONPATH=tests/sglang/shims SGLANG_USE_CPU_ENGINE=1 .nox/sglang/bin/python bench/sglang_streaming.py \
      [--size tiny|small] [--rounds 3] [--seconds 4] [--tokens 64] [--concurrency 1 16 64 256]

Measured as bench/vllm_streaming.py measures (its docstring): interleaved rounds, medians of
per-round ratios, TTFT and inter-token latency as the client sees them, tokens per message, and
serving CPU per token (the serving process's CPU plus the client's). SGLang's scheduler and
detokenizer are processes of their own in every target; like vLLM's engine core they are not the
serving layer and are not counted. SGLang's gRPC server is not included: it needs the CUDA build of
``sgl-kernel``.
"""

from __future__ import annotations

import json
import os
import time

from measuring import free_port
from streaming import PROMPT_IDS, Stream, Target, closer, model_dir, ours_makers, parser, run, start_server

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

CPU_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--disable-overlap-schedule", "--sampling-backend", "pytorch", "--grammar-backend", "none",
             "--skip-server-warmup", "--max-total-tokens", "32768", "--page-size", "16"]


def engine_flags(model: str, max_seqs: int, stream_interval: int) -> list[str]:
    return ["--model-path", model, *CPU_FLAGS, "--max-running-requests", str(max_seqs),
            "--stream-interval", str(stream_interval), "--random-seed", "0"]


def sampling(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}


async def limit_target(flags: list[str], tokens: int) -> Target:
    import argparse

    from sglang.srt.server_args import ServerArgs

    from openengine_adapters.sglang.startup import create_engine

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    engine = create_engine(ServerArgs.from_cli_args(p.parse_args(flags)))

    async def one():
        s, seen = Stream(time.perf_counter()), 0
        async for chunk in await engine.async_generate(input_ids=PROMPT_IDS, sampling_params=sampling(tokens),
                                                       stream=True):
            done = chunk["meta_info"]["completion_tokens"]  # cumulative
            s.got(done - seen)
            seen = done
        return s

    async def close():
        engine.shutdown()

    return Target("limit", one, close=close)


async def sglang_http_target(flags: list[str], tokens: int) -> Target:
    import aiohttp

    port = free_port()
    proc, reader, _ = await start_server(
        ["-m", "sglang.launch_server", *flags, "--host", "127.0.0.1", "--port", str(port)],
        r"(?i)(application startup complete|the server is fired up)")
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    body = {"input_ids": PROMPT_IDS, "sampling_params": sampling(tokens), "stream": True}
    url = f"http://127.0.0.1:{port}/generate"

    async def one():
        s, seen = Stream(time.perf_counter()), 0
        async with session.post(url, json=body) as resp:
            resp.raise_for_status()
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                done = json.loads(line[6:])["meta_info"]["completion_tokens"]
                s.got(done - seen)
                seen = done
        return s

    class _Session:
        async def close(self):
            await session.close()

    return Target("sglang-http", one, proc.pid, closer(proc, reader, _Session()))


MAKERS = {"limit": limit_target, **ours_makers("sglang"), "sglang-http": sglang_http_target}
RATIOS = (("ours", "limit", "tps"), ("ours", "sglang-http", "tps"), ("ours", "ours-nocoal", "tps"),
          ("ours", "ours-nocoal", "itl_p99_ms"), ("ours-grouped", "ours-nocoal", "tps"),
          ("ours-grouped", "ours-nocoal", "cpu_us_per_token"))


async def main() -> None:
    args = parser(__doc__, MAKERS).parse_args()
    model = model_dir(args)
    await run(args, MAKERS, {}, engine_flags(model, max(args.concurrency), args.stream_interval), model, RATIOS)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
