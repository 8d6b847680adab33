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
                                   [--json bench/results/frontend-ceiling.json]

tokens/s here is the front end's ceiling, and serving CPU per token what a token costs it.
"""

from __future__ import annotations

from streaming import OURS, ROOT, Target, openengine_target, parser, run

SERVER = """
import sys, uvloop
sys.path.insert(0, {tests!r})
from fake_backend import FakeBackend
from openengine_adapters.server import run
from openengine_adapters.server_config import add_server_args, server_config_from_args
import argparse
p = argparse.ArgumentParser(); add_server_args(p)
uvloop.run(run(FakeBackend(), server_config_from_args(p.parse_args())))
"""


def fake_target(name: str, step_ms: float):
    async def make(flags: list[str], tokens: int) -> Target:
        server = ["-c", SERVER.format(tests=str(ROOT / "tests"))]
        return await openengine_target("fake", flags, tokens, name, server=server,
                                       metadata={"fake.step_delay_ms": str(step_ms)}, vocabulary=128)
    return make


RATIOS = (("ours", "ours-nocoal", "tps"), ("ours-grouped", "ours-nocoal", "tps"),
          ("ours", "ours-nocoal", "itl_p99_ms"), ("ours", "ours-nocoal", "cpu_us_per_token"))


async def main() -> None:
    p = parser(__doc__, dict.fromkeys(OURS))
    p.add_argument("--step-ms", type=float, default=0.0, help="the fake engine's pause before each token")
    p.set_defaults(concurrency=[16, 64, 256])
    args = p.parse_args()
    makers = {name: fake_target(name, args.step_ms) for name in OURS}
    await run(args, makers, {}, [], "the test suite's fake engine", RATIOS, {"size": None, "step_ms": args.step_ms})


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
