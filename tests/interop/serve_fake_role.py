"""tests/serve_fake.py with the fake engine's role and pace chosen on the command line: the interop
suite's fake targets (an aggregated server, and a prefill and a decode one for the handoff). The fake
is the one beside the ``openengine_adapters`` this process imports (conftest.SERVER_ROOT)."""

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import openengine_adapters  # noqa: E402

sys.path.insert(0, str(Path(openengine_adapters.__file__).resolve().parents[1] / "tests"))

from fake_backend import FakeBackend  # noqa: E402

from openengine_adapters.server import run
from openengine_adapters.server_config import add_server_args, server_config_from_args
from openengine_adapters.types import EngineRole  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    parser.add_argument("--fake-role", default="aggregated", choices=("aggregated", "prefill", "decode"))
    parser.add_argument("--fake-step-ms", type=float, default=0.0, help="the fake's time per token")
    args = parser.parse_args()
    backend = FakeBackend(role=EngineRole[args.fake_role.upper()], step_delay_s=args.fake_step_ms / 1000)
    asyncio.run(run(backend, server_config_from_args(args)))
