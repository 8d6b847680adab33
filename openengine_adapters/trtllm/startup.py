"""Building ``tensorrt_llm.LLM`` and its backend from sidecar flags (shared by the CLI and tests).

``llm_kwargs`` is pure (flags + YAML -> keyword arguments) so it is tested without the engine;
``build_llm`` imports TensorRT-LLM lazily and turns the nested config dicts into its classes.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from openengine_adapters.types import ROLE_BY_NAME

ROLES = ROLE_BY_NAME
# nested LLM arguments given as dicts (YAML or flags) -> (module, class) built lazily
CONFIG_CLASSES = {
    "kv_cache_config": (("tensorrt_llm.llmapi", "KvCacheConfig"),),
    "cache_transceiver_config": (("tensorrt_llm.llmapi", "CacheTransceiverConfig"),),
    "lora_config": (("tensorrt_llm.lora_helper", "LoraConfig"), ("tensorrt_llm.lora_manager", "LoraConfig")),
}


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``; nested dicts merge (as trtllm-serve's --extra_llm_api_options)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def load_yaml(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    doc = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: --extra_llm_api_options must hold a YAML mapping")
    return doc


def llm_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """``tensorrt_llm.LLM`` keyword arguments from parsed flags, the YAML file merged last.

    The adapter turns on what its RPCs need unless the YAML says otherwise: iteration stats
    (GetLoad, runtime events), KV-cache events with block reuse (SubscribeKvEvents), and a KV
    cache transceiver for the PREFILL/DECODE roles, and no overlap scheduler on PREFILL.
    """
    kv: dict[str, Any] = {"free_gpu_memory_fraction": ns.kv_cache_free_gpu_memory_fraction,
                          "enable_block_reuse": True, "event_buffer_max_size": ns.kv_event_buffer_size}
    if ns.backend == "tensorrt":
        # tensorrt_llm.LLM is the PyTorch-backend LLM in 1.x; dropping the flag (as before) served a
        # PyTorch engine under a TensorRT-engine name. This adapter drives the PyTorch backend only.
        raise ValueError("--backend tensorrt is not supported: this adapter serves TensorRT-LLM's PyTorch "
                         "backend (tensorrt_llm.LLM); use --backend pytorch")
    kw: dict[str, Any] = {
        "model": ns.model,
        "backend": ns.backend,
        "tensor_parallel_size": ns.tp_size,
        "pipeline_parallel_size": ns.pp_size,
        "trust_remote_code": ns.trust_remote_code,
        "kv_cache_config": kv,
        "enable_iter_perf_stats": True,
    }
    if ns.tokenizer:
        kw["tokenizer"] = ns.tokenizer
    if ns.ep_size is not None:
        kw["moe_expert_parallel_size"] = ns.ep_size
    for name in ("max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width"):
        value = getattr(ns, name)
        if value is not None:
            kw[name] = value
    if ns.guided_decoding_backend:
        kw["guided_decoding_backend"] = ns.guided_decoding_backend
    if ns.enable_attention_dp:
        kw["enable_attention_dp"] = True
    if ns.enable_lora:
        lora: dict[str, Any] = {"max_lora_rank": ns.max_lora_rank, "max_loras": ns.max_loras,
                                "max_cpu_loras": ns.max_cpu_loras}
        if ns.lora_target_modules:
            lora["lora_target_modules"] = list(ns.lora_target_modules)
        kw["lora_config"] = lora
    if ns.role != "aggregated":
        kw["cache_transceiver_config"] = {"backend": ns.kv_transfer_backend}
    if ns.role == "prefill":
        # the PyTorch worker refuses context-only requests while the overlap scheduler runs
        # (executor/base_worker.py _enqueue_request)
        kw["disable_overlap_scheduler"] = True
    return deep_merge(kw, load_yaml(ns.extra_llm_api_options))


def _import(candidates):
    import importlib

    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


def build_llm(kwargs: Mapping[str, Any]):
    """Construct ``tensorrt_llm.LLM`` (blocking: loads or builds the engine)."""
    from tensorrt_llm import LLM

    kw = dict(kwargs)
    for key, candidates in CONFIG_CLASSES.items():
        if isinstance(kw.get(key), Mapping):
            cls = _import(candidates)
            if cls is not None:
                kw[key] = cls(**kw[key])
    return LLM(**kw)


async def start_backend(ns: argparse.Namespace):
    """The LLM from parsed flags, wrapped in a TrtllmBackend that owns it."""
    import tensorrt_llm

    from openengine_adapters.trtllm.backend import TrtllmBackend, TrtllmOptions

    llm = await asyncio.to_thread(build_llm, llm_kwargs(ns))
    try:
        options = TrtllmOptions(
            served_model_names=tuple(ns.served_model_name or ()), role=ROLES[ns.role],
            max_top_n=ns.max_logprobs, max_num_sequences=ns.max_num_sequences,
        )
        return TrtllmBackend(llm, options, version=getattr(tensorrt_llm, "__version__", ""), owns_engine=True)
    except BaseException:
        await asyncio.to_thread(llm.shutdown)
        raise
