"""``python -m openengine_adapters.trtllm``: serve a ``tensorrt_llm.LLM`` over OpenEngine gRPC.

TensorRT-LLM has no plugin entry point in ``trtllm-serve``, so this sidecar builds the LLM
itself; its engine flags follow ``trtllm-serve`` (same names, same ``--extra_llm_api_options``
YAML file, merged last), plus ``--role`` and the shared OpenEngine server flags.
"""

from __future__ import annotations

import argparse
import importlib.util

from openengine_adapters import launcher
from openengine_adapters.server_config import add_server_args
from openengine_adapters.trtllm.startup import ROLES

PROG = "python -m openengine_adapters.trtllm"
OUR_GROUPS = ("OpenEngine server", "OpenEngine adapter", "OpenEngine security")


def engine_version() -> str | None:
    """The installed TensorRT-LLM's version: its distribution's, else the module's own (no metadata)."""
    version = launcher.distribution_version("tensorrt_llm", "tensorrt-llm")
    if version is None and importlib.util.find_spec("tensorrt_llm") is not None:
        import tensorrt_llm

        version = getattr(tensorrt_llm, "__version__", None) or "(version unknown)"
    return version


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, usage=f"{PROG} [OpenEngine flags] [trtllm-serve flags] MODEL",
                                formatter_class=launcher.HelpFormatter,
                                description="Serve a TensorRT-LLM engine over the OpenEngine gRPC contract "
                                            "(openengine.v1). Engine flags follow trtllm-serve.")
    p._optionals.title = "TensorRT-LLM engine (trtllm-serve's flags)"
    p.add_argument("model_path", nargs="?", default=None, help="model name, HF checkpoint or engine directory")
    p.add_argument("--model", dest="model_flag", default=None, help="same as the positional model")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--backend", default="pytorch", choices=["pytorch", "tensorrt", "_autodeploy"])
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--ep_size", type=int, default=None)
    p.add_argument("--max_batch_size", type=int, default=None)
    p.add_argument("--max_num_tokens", type=int, default=None)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--max_beam_width", type=int, default=None)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
    p.add_argument("--trust_remote_code", action="store_true")
    p.add_argument("--extra_llm_api_options", default=None, help="YAML file of extra LLM arguments (merged last)")
    p.add_argument("--guided_decoding_backend", default=None, choices=["xgrammar", "llguidance"])
    p.add_argument("--enable_attention_dp", action="store_true")
    g = p.add_argument_group("LoRA (lazy registry: adapters load on first use)")
    g.add_argument("--enable_lora", action="store_true")
    g.add_argument("--max_lora_rank", type=int, default=64)
    g.add_argument("--max_loras", type=int, default=4)
    g.add_argument("--max_cpu_loras", type=int, default=8)
    g.add_argument("--lora_target_modules", nargs="*", default=None)
    o = p.add_argument_group("OpenEngine adapter")
    o.add_argument("--role", default="aggregated", choices=sorted(ROLES))
    o.add_argument("--kv_transfer_backend", default="DEFAULT",
                   help="cache_transceiver_config.backend for the prefill/decode roles (UCX, NIXL, MPI, DEFAULT)")
    o.add_argument("--kv_event_buffer_size", type=int, default=1024,
                   help="engine KV event buffer (0 disables SubscribeKvEvents)")
    o.add_argument("--served_model_name", nargs="*", default=None)
    o.add_argument("--max_logprobs", type=int, default=20, help="top-k cap for prompt and output logprobs")
    o.add_argument("--max_num_sequences", type=int, default=None, help="cap on num_sequences (n)")
    launcher.add_version_flag(o, "tensorrt_llm", engine_version())
    add_server_args(p)
    launcher.ours_first(p, OUR_GROUPS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.model_path and ns.model_flag and ns.model_path != ns.model_flag:
        parser.error("the positional model and --model differ")
    ns.model = ns.model_flag or ns.model_path
    if not ns.model:
        parser.error("a model is required (positional or --model)")
    return ns


class TrtllmLauncher(launcher.EngineLauncher):
    engine, display, prog = "tensorrt_llm", "TensorRT-LLM", PROG

    engine_version = staticmethod(engine_version)

    def early_args(self) -> argparse.Namespace:
        self.ns = parse_args(self.argv)  # engine-free: every flag error before the port check
        launcher.check_model_path(self.ns.model, "model")
        return self.ns

    def parse(self) -> argparse.Namespace:
        return self.ns

    async def start_backend(self, ns: argparse.Namespace):
        from openengine_adapters.trtllm.startup import start_backend

        return await start_backend(ns)


def main(argv: list[str] | None = None) -> None:
    TrtllmLauncher().main(argv)


if __name__ == "__main__":
    main()
