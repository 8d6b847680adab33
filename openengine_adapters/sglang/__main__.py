"""``python -m openengine_adapters.sglang``: SGLang's own server flags, unchanged, plus ours.

SGLang's ``--host``/``--port`` name its HTTP server, which this sidecar does not run: here they are
the OpenEngine gRPC server's (``add_server_args``). Everything else is SGLang's ``ServerArgs``
(``--model-path``, ``--disaggregation-mode``, ``--kv-events-config``, ``--enable-lora`` ...).

Without ``--model-path`` it serves a tiny demo Llama with RANDOM weights that it builds locally
(no download), so the protocol can be tried on a CPU machine in one command; its KV cache is
capped (``--max-total-tokens``) so that it fits next to other work. Any flag given wins.

SGLang's KV-event publisher is on by default, on a private loopback endpoint, so
``SubscribeKvEvents`` works out of the box (``--no-kv-events`` turns it off; an explicit
``--kv-events-config`` replaces it and is advertised by ``GetKvEventSources``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from openengine_adapters import launcher
from openengine_adapters.server_config import add_server_args

PROG = "python -m openengine_adapters.sglang"
DEMO_DIR = Path(os.environ.get("OPENENGINE_DEMO_MODEL_DIR",
                               Path.home() / ".cache" / "openengine-adapters" / "demo-llama"))
# SGLang's own defaults for the two flags this sidecar takes over.
SGLANG_HTTP_DEFAULTS = {"host": "127.0.0.1", "port": 30000}
DEMO_MAX_TOTAL_TOKENS = 16384  # SGLang would fill most of the free memory with KV cache (15 GB here)
OUR_GROUPS = ("OpenEngine server", "OpenEngine SGLang adapter", "OpenEngine security")


def engine_version() -> str | None:
    return launcher.distribution_version("sglang")


def add_adapter_args(parser: argparse.ArgumentParser) -> None:
    """This adapter's own flags (no SGLang import: the documentation's reference is generated from them)."""
    group = parser.add_argument_group("OpenEngine SGLang adapter")
    group.add_argument("--openengine-max-top-n", type=int, default=20, help="largest top-n logprob candidates")
    group.add_argument("--openengine-max-num-sequences", type=int, default=16,
                       help="largest num_sequences (each output is one SGLang request)")
    group.add_argument("--openengine-runtime-event-poll-s", type=float, default=0.05,
                       help="get_loads poll period behind SubscribeRuntimeEvents (BATCH/QUEUE); 0 turns them off")
    group.add_argument("--kv-events", action=argparse.BooleanOptionalAction, default=True,
                       help="turn SGLang's KV-event publisher on, on a private loopback endpoint, so "
                            "SubscribeKvEvents works (it is not advertised by GetKvEventSources; an explicit "
                            "--kv-events-config replaces it and is advertised)")
    launcher.add_version_flag(group, "sglang", engine_version())


def build_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog=PROG, conflict_handler="resolve", usage=f"{PROG} [OpenEngine flags] [SGLang server flags]",
        formatter_class=launcher.HelpFormatter,
        description="Serve an SGLang engine over the OpenEngine gRPC contract (openengine.v1). Accepts SGLang's "
                    "server arguments unchanged (--host/--port are the gRPC server's). Without --model-path this "
                    "serves a tiny demo Llama with RANDOM weights (built under $OPENENGINE_DEMO_MODEL_DIR, default "
                    "~/.cache/openengine-adapters/demo-llama; no download) on port 50051 with "
                    f"--max-total-tokens {DEMO_MAX_TOTAL_TOKENS} (SGLang would otherwise fill most of the free "
                    "memory with KV cache); any flag given wins.")
    ServerArgs.add_cli_args(parser)
    parser._optionals.title = "SGLang server arguments (SGLang's own, unchanged)"
    add_server_args(parser)  # resolves --host/--port to ours
    add_adapter_args(parser)
    for action in parser._actions:
        if action.dest == "model_path":
            action.required = False
            action.default = None
            action.help = "model name or path (default: a tiny random-weight demo model, see above)"
    launcher.ours_first(parser, OUR_GROUPS)
    return parser


def server_args_from(ns: argparse.Namespace):
    """SGLang's ``ServerArgs`` from the parsed flags (its HTTP host/port left at SGLang's defaults)."""
    from sglang.srt.server_args import ServerArgs

    sg = argparse.Namespace(**vars(ns))
    for name, value in SGLANG_HTTP_DEFAULTS.items():
        setattr(sg, name, value)
    return ServerArgs.from_cli_args(sg)


def demo_defaults(ns: argparse.Namespace, argv: list[str]) -> None:
    """No --model-path: build and serve the random-weight demo model, sized for a small shared machine."""
    from openengine_adapters.demo_model import build_tiny_llama

    path = build_tiny_llama(DEMO_DIR)
    ns.model_path = str(path)
    if ns.served_model_name is None:
        ns.served_model_name = "demo-llama"
    if not launcher.flag_given(argv, "--max-total-tokens", "--mem-fraction-static"):
        ns.max_total_tokens = DEMO_MAX_TOTAL_TOKENS
    logging.getLogger(__name__).warning(
        "no --model-path given: serving the demo model at %s (RANDOM weights, output is gibberish)", path)


def default_kv_events(ns: argparse.Namespace, argv: list[str]) -> bool:
    """SGLang's ZMQ KV-event publisher on a private loopback endpoint, unless configured or refused.
    True when it was turned on here (then it is not advertised)."""
    if not ns.kv_events or ns.kv_events_config or launcher.flag_given(argv, "--kv-events-config") \
            or getattr(ns, "disable_radix_cache", False):
        return False
    endpoint, replay = launcher.private_endpoints(ranks=max(1, getattr(ns, "dp_size", 1) or 1))
    ns.kv_events_config = json.dumps({"publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay,
                                      "topic": "kv"})
    return True


class SglangLauncher(launcher.EngineLauncher):
    engine, display, prog, model_flag = "sglang", "SGLang", PROG, "--model-path"
    advertise_kv_events = True
    server_args = None

    engine_version = staticmethod(engine_version)
    add_adapter_args = staticmethod(add_adapter_args)
    build_parser = staticmethod(build_parser)

    def first(self) -> None:
        os.environ.pop("OPENENGINE_GRPC_PORT", None)  # the plugin must not start a second server in here

    def prepare(self, ns: argparse.Namespace) -> None:
        if ns.model_path is None:
            demo_defaults(ns, self.argv)
        self.advertise_kv_events = not default_kv_events(ns, self.argv)
        self.server_args = server_args_from(ns)

    async def start_backend(self, ns: argparse.Namespace):
        from openengine_adapters.sglang.backend import SglangOptions
        from openengine_adapters.sglang.startup import create_engine, start_backend

        sa = self.server_args
        options = SglangOptions(served_model_names=(sa.served_model_name,) if sa.served_model_name else (),
                                max_top_n=ns.openengine_max_top_n,
                                max_num_sequences=ns.openengine_max_num_sequences,
                                advertise_host=ns.advertise_host,
                                runtime_event_poll_s=ns.openengine_runtime_event_poll_s,
                                advertise_kv_events=self.advertise_kv_events)
        engine = create_engine(sa)  # on this loop's thread: the tokenizer manager binds to it
        return start_backend(engine, options)

    def server_config(self, ns: argparse.Namespace):
        config = super().server_config(ns)
        if not ns.enable_trace:  # SGLang's --otlp-traces-endpoint has a default: --enable-trace turns both on
            config = config.model_copy(update={"otlp_traces_endpoint": None})
        return config


def main(argv: list[str] | None = None) -> None:
    SglangLauncher().main(argv)


if __name__ == "__main__":
    main()
