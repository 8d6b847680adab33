"""The sidecar CLI: trtllm-serve-style flags and the YAML file -> LLM keyword arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openengine_adapters.trtllm.__main__ import build_parser, parse_args
from openengine_adapters.trtllm.startup import build_llm, deep_merge, llm_kwargs
from openengine_adapters.types import Feature

MANIFEST = json.loads((Path(__file__).resolve().parents[2] / "adapters" / "trtllm" / "manifest.json").read_text())


def test_positional_model_and_defaults():
    ns = parse_args(["meta/llama", "--port", "0"])
    kw = llm_kwargs(ns)
    assert kw["model"] == "meta/llama" and kw["backend"] == "pytorch" and kw["tensor_parallel_size"] == 1
    assert kw["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                                     "event_buffer_max_size": 1024}
    assert kw["enable_iter_perf_stats"] is True
    assert "cache_transceiver_config" not in kw and "lora_config" not in kw and "max_batch_size" not in kw
    assert ns.port == 0 and ns.role == "aggregated"


def test_flags_and_yaml_merge(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("kv_cache_config:\n  free_gpu_memory_fraction: 0.5\n  tokens_per_block: 64\n"
                     "enable_attention_dp: true\ncuda_graph_config:\n  max_batch_size: 8\n")
    ns = parse_args(["--model", "m", "--backend", "pytorch", "--tp_size", "2", "--pp_size", "1",
                     "--max_batch_size", "16", "--max_num_tokens", "4096", "--max_seq_len", "2048",
                     "--kv_cache_free_gpu_memory_fraction", "0.8", "--extra_llm_api_options", str(extra),
                     "--role", "prefill", "--kv_transfer_backend", "UCX", "--enable_lora", "--max_loras", "2",
                     "--guided_decoding_backend", "xgrammar", "--host", "127.0.0.1", "--max-in-flight", "5"])
    kw = llm_kwargs(ns)
    assert kw["tensor_parallel_size"] == 2 and kw["max_batch_size"] == 16 and kw["max_num_tokens"] == 4096
    assert kw["max_seq_len"] == 2048 and kw["guided_decoding_backend"] == "xgrammar"
    assert kw["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": True,
                                     "event_buffer_max_size": 1024, "tokens_per_block": 64}
    assert kw["enable_attention_dp"] is True and kw["cuda_graph_config"] == {"max_batch_size": 8}
    assert kw["cache_transceiver_config"] == {"backend": "UCX"}
    assert kw["lora_config"]["max_loras"] == 2
    assert ns.max_in_flight == 5 and ns.host == "127.0.0.1"


def test_tensorrt_backend_refused_and_model_required():
    """tensorrt_llm.LLM builds the PyTorch backend; --backend tensorrt used to be dropped silently."""
    with pytest.raises(ValueError, match="--backend tensorrt is not supported"):
        llm_kwargs(parse_args(["m", "--backend", "tensorrt"]))
    with pytest.raises(SystemExit):
        parse_args([])
    with pytest.raises(SystemExit):
        parse_args(["a", "--model", "b"])
    assert build_parser().prog.endswith("trtllm")


def test_deep_merge():
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 3}, "e": 4}) == {"a": {"b": 3, "c": 2}, "d": 1,
                                                                                       "e": 4}


def test_build_llm_converts_nested_configs(tensorrt_llm):
    llm = build_llm({"model": "m", "kv_cache_config": {"free_gpu_memory_fraction": 0.5},
                     "cache_transceiver_config": {"backend": "UCX"}})
    assert isinstance(llm.init_kwargs["kv_cache_config"], tensorrt_llm.KvCacheConfig)
    assert llm.init_kwargs["cache_transceiver_config"].backend == "UCX"


def test_package_imports_without_tensorrt_llm():
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorrt_llm'] = None; import openengine_adapters.trtllm.backend, "
            "openengine_adapters.trtllm.__main__, openengine_adapters.trtllm.startup")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


async def test_manifest_matches_advertisement(trt):
    from openengine_adapters.v1 import model_pb2

    info = await trt.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="fake-model"))
    rows = {r["key"]: r for r in MANIFEST["features"]}
    gen = info.generation
    m = model_pb2
    top, ids, all_ = (m.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, m.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
                      m.CANDIDATE_TOKEN_SELECTION_MODE_ALL)
    checks = {
        "generate.prompt_logprobs.top_n": top in gen.prompt_logprobs.candidate_selection_modes,
        "generate.prompt_logprobs.token_ids": ids in gen.prompt_logprobs.candidate_selection_modes,
        "generate.prompt_logprobs.all": all_ in gen.prompt_logprobs.candidate_selection_modes,
        "generate.output_logprobs.top_n": top in gen.output_logprobs.candidate_selection_modes,
        "generate.output_logprobs.token_ids": ids in gen.output_logprobs.candidate_selection_modes,
        "generate.output_logprobs.all": all_ in gen.output_logprobs.candidate_selection_modes,
        "generate.priority": gen.supports_priority,
        "generate.bypass_prefix_cache": gen.supports_prefix_cache_bypass,
        "generate.media": info.supports_multimodal,
        "score.label_tokens": info.tasks.score.supports_label_token_scoring,
        "score.instruction": info.tasks.score.supports_instruction,
        "kv_event_sources": Feature.KV_EVENT_SOURCES in trt.backend.features,
        "kv_events": Feature.KV_EVENTS in trt.backend.features,
        "embed": info.tasks.HasField("embed"),
    }
    for key, advertised in checks.items():
        status = rows[key]["status"]
        assert advertised == (status != "rejected"), f"{key}: manifest {status}, advertised {advertised}"
    assert MANIFEST["tested_versions"] == ">=1.2,<1.3"
