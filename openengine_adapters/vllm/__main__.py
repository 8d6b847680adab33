"""``python -m openengine_adapters.vllm``: vLLM's own engine flags, unchanged, plus ours.

Without ``--model`` it serves a tiny demo Llama with RANDOM weights that it builds locally (no
download), so the whole protocol can be tried on a CPU machine in one command.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import uvloop  # a vLLM dependency

from openengine_adapters.server import add_server_args, run, server_config_from_args
from openengine_adapters.types import ROLE_BY_NAME
from openengine_adapters.vllm.engine import prepare_environment

DEMO_DIR = Path(os.environ.get("OPENENGINE_DEMO_MODEL_DIR",
                               Path.home() / ".cache" / "openengine-adapters" / "demo-llama"))


def build_parser():
    prepare_environment()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="python -m openengine_adapters.vllm",
        description="Serve a vLLM engine over the OpenEngine gRPC contract (openengine.v1). "
                    "Accepts vLLM's engine arguments unchanged.")
    AsyncEngineArgs.add_cli_args(parser)
    add_server_args(parser)
    parser.add_argument("--role", choices=sorted(ROLE_BY_NAME), default=None,
                        help="OpenEngine role; prefill/decode need --kv-transfer-config with a KV connector "
                             "(default: prefill for kv_role kv_producer, decode for kv_consumer, else aggregated)")
    parser.set_defaults(model=None)
    return parser


def demo_defaults(ns: argparse.Namespace) -> None:
    """No --model: build and serve the random-weight demo model, sized for a CPU."""
    from openengine_adapters.demo_model import build_tiny_llama

    path = build_tiny_llama(DEMO_DIR)
    ns.model = str(path)
    if ns.served_model_name is None:
        ns.served_model_name = ["demo-llama"]
    if ns.max_model_len is None:
        ns.max_model_len = 1024
    ns.enforce_eager = True  # a tiny model: compiling would take longer than serving it
    logging.getLogger(__name__).warning(
        "no --model given: serving the demo model at %s (RANDOM weights, output is gibberish)", path)


async def serve(ns: argparse.Namespace) -> None:
    from openengine_adapters.vllm.engine import start_backend

    backend = await start_backend(ns, ROLE_BY_NAME[ns.role] if ns.role else None)
    await run(backend, server_config_from_args(ns))


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ns = build_parser().parse_args(argv)
    if ns.model is None:
        demo_defaults(ns)
    uvloop.run(serve(ns))  # the loop vLLM's own servers run on, and so the plugin inside `vllm serve`


if __name__ == "__main__":
    main()
