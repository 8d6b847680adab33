"""``python -m openengine_adapters.sglang``: SGLang's own server flags, unchanged, plus ours.

SGLang's ``--host``/``--port`` name its HTTP server, which this sidecar does not run: here they are
the OpenEngine gRPC server's (``add_server_args``). Everything else is SGLang's ``ServerArgs``
(``--model-path``, ``--disaggregation-mode``, ``--kv-events-config``, ``--enable-lora`` ...).

Without ``--model-path`` it serves a tiny demo Llama with RANDOM weights that it builds locally
(no download), so the protocol can be tried on a CPU machine in one command.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from openengine_adapters.server import add_server_args, run, server_config_from_args

DEMO_DIR = Path(os.environ.get("OPENENGINE_DEMO_MODEL_DIR",
                               Path.home() / ".cache" / "openengine-adapters" / "demo-llama"))
# SGLang's own defaults for the two flags this sidecar takes over.
SGLANG_HTTP_DEFAULTS = {"host": "127.0.0.1", "port": 30000}


def build_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog="python -m openengine_adapters.sglang", conflict_handler="resolve",
        description="Serve an SGLang engine over the OpenEngine gRPC contract (openengine.v1). "
                    "Accepts SGLang's server arguments unchanged (--host/--port are the gRPC server's).")
    ServerArgs.add_cli_args(parser)
    add_server_args(parser)  # resolves --host/--port to ours
    group = parser.add_argument_group("OpenEngine SGLang adapter")
    group.add_argument("--openengine-max-top-n", type=int, default=20, help="largest top-n logprob candidates")
    group.add_argument("--openengine-max-num-sequences", type=int, default=16,
                       help="largest num_sequences (each output is one SGLang request)")
    group.add_argument("--openengine-runtime-event-poll-s", type=float, default=0.05,
                       help="get_loads poll period behind SubscribeRuntimeEvents (BATCH/QUEUE); 0 turns them off")
    for action in parser._actions:
        if action.dest == "model_path":
            action.required = False
            action.default = None
    return parser


def server_args_from(ns: argparse.Namespace):
    """SGLang's ``ServerArgs`` from the parsed flags (its HTTP host/port left at SGLang's defaults)."""
    from sglang.srt.server_args import ServerArgs

    sg = argparse.Namespace(**vars(ns))
    for name, value in SGLANG_HTTP_DEFAULTS.items():
        setattr(sg, name, value)
    return ServerArgs.from_cli_args(sg)


def demo_defaults(ns: argparse.Namespace) -> None:
    """No --model-path: build and serve the random-weight demo model, sized for a CPU."""
    from openengine_adapters.demo_model import build_tiny_llama

    path = build_tiny_llama(DEMO_DIR)
    ns.model_path = str(path)
    if ns.served_model_name is None:
        ns.served_model_name = "demo-llama"
    logging.getLogger(__name__).warning(
        "no --model-path given: serving the demo model at %s (RANDOM weights, output is gibberish)", path)


async def serve(ns: argparse.Namespace, server_args) -> None:
    from openengine_adapters.sglang.backend import SglangOptions
    from openengine_adapters.sglang.engine import create_engine, start_backend

    config = server_config_from_args(ns)
    names = (server_args.served_model_name,) if server_args.served_model_name else ()
    options = SglangOptions(served_model_names=names, max_top_n=ns.openengine_max_top_n,
                            max_num_sequences=ns.openengine_max_num_sequences,
                            advertise_host=ns.advertise_host,
                            runtime_event_poll_s=ns.openengine_runtime_event_poll_s)
    engine = create_engine(server_args)  # on this loop's thread: the tokenizer manager binds to it
    await run(start_backend(engine, options), config)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.pop("OPENENGINE_GRPC_PORT", None)  # the plugin must not start a second server in here
    ns = build_parser().parse_args(argv)
    if ns.model_path is None:
        demo_defaults(ns)
    asyncio.run(serve(ns, server_args_from(ns)))


if __name__ == "__main__":
    main()
