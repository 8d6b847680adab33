"""Serve the fake engine with one mutant applied (``--mutant none``: unmutated), as its own process.

    python tests/mutants/serve_mutant.py --mutant NAME [--target aggregated|prefill|decode|task-only]
                                         [server flags: --port 0 --max-in-flight 4 ...]
"""

import argparse
import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import catalog  # noqa: E402

from openengine_adapters.server import run  # noqa: E402
from openengine_adapters.server_config import add_server_args, server_config_from_args  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mutant", required=True, help="a name from tests/mutants/catalog.py, or 'none'")
    parser.add_argument("--target", default="aggregated", choices=("aggregated", "prefill", "decode", "task-only"))
    add_server_args(parser)
    args = parser.parse_args()
    if args.mutant != "none":
        catalog.apply(args.mutant)
    asyncio.run(run(catalog.build_backend(args.target), server_config_from_args(args)))
