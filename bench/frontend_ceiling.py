"""How many tokens per second one server front end can stream when the engine is never the limit.

The engine-backed benches (vllm_streaming.py, sglang_streaming.py) run a CPU engine that shares
two cores with the server and the client, so the engine decides throughput there. On a GPU host
a small model at high concurrency hands a Python front end tokens faster than it can send one
message each; this bench reproduces that side alone: our server over the test suite's fake engine
(``tests/fake_backend.py``; ``--step-ms 0``: each stream's next token is ready as soon as it is
asked for), the sidecar's event loop (uvloop), a separate client process, and the three ways of
running our server the engine benches use (``streaming.OURS``: defaults, coalescing off, always
grouping), measured in the same interleaved rounds.

  python bench/frontend_ceiling.py [--concurrency 16 64 256] [--rounds 3] [--seconds 4] [--step-ms 0]

tokens/s here is the front end's ceiling, and serving CPU per token what a token costs it.
"""

from __future__ import annotations

import time

from streaming import OURS, PROMPT_IDS, ROOT, Stream, Target, closer, parser, run, start_server

SERVER = """
import sys, uvloop
sys.path.insert(0, {tests!r})
from fake_backend import FakeBackend
from openengine_adapters.server import add_server_args, run, server_config_from_args
import argparse
p = argparse.ArgumentParser(); add_server_args(p)
uvloop.run(run(FakeBackend(), server_config_from_args(p.parse_args())))
"""


def fake_target(name: str, step_ms: float):
    async def make(flags: list[str], tokens: int) -> Target:
        import grpc

        from openengine_adapters.v1 import generation_pb2 as g
        from openengine_adapters.v1 import input_pb2, openengine_pb2_grpc

        proc, reader, ready = await start_server(
            ["-c", SERVER.format(tests=str(ROOT / "tests")), *OURS[name], "--host", "127.0.0.1", "--port", "0"],
            r"ready on .*:(\d+)")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{ready.group(1)}")
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        request = g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[i % 128 for i in PROMPT_IDS]),  # its vocabulary
                                    stopping=g.StoppingOptions(max_tokens=tokens, ignore_eos=True),
                                    metadata={"fake.step_delay_ms": str(step_ms)})

        async def one():
            s = Stream(time.perf_counter())
            async for resp in stub.Generate(request):
                if resp.HasField("token"):
                    s.got(len(resp.token.tokens))
            return s

        return Target(name, one, proc.pid, closer(proc, reader, channel))
    return make


RATIOS = (("ours", "ours-nocoal", "tps"), ("ours-grouped", "ours-nocoal", "tps"),
          ("ours", "ours-nocoal", "itl_p99_ms"), ("ours", "ours-nocoal", "cpu_us_per_token"))


async def main() -> None:
    p = parser(__doc__, dict.fromkeys(OURS))
    p.add_argument("--step-ms", type=float, default=0.0, help="the fake engine's pause before each token")
    p.set_defaults(concurrency=[16, 64, 256])
    args = p.parse_args()
    makers = {name: fake_target(name, args.step_ms) for name in OURS}
    await run(args, makers, {}, [], "the test suite's fake engine", RATIOS)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
