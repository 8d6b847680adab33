"""Compare what a running server advertises in GetModelInfo with adapters/<engine>/manifest.json
(shared by the real-engine suites: tests/vllm, tests/sglang)."""

from __future__ import annotations

import json
from pathlib import Path

from openengine_adapters.v1 import model_pb2, tasks_pb2

MANIFESTS = Path(__file__).resolve().parents[1] / "adapters"


def manifest(engine: str) -> dict:
    return json.loads((MANIFESTS / engine / "manifest.json").read_text())


M = model_pb2
TOP_N, TOKEN_IDS, ALL = (M.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, M.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
                         M.CANDIDATE_TOKEN_SELECTION_MODE_ALL)


def _prompt(i):
    return set(i.generation.prompt_logprobs.candidate_selection_modes)


def _output(i):
    return set(i.generation.output_logprobs.candidate_selection_modes)


PREDICATES = {
    "generate.text_input": lambda i: i.supports_text_input,
    "generate.token_ids_input": lambda i: i.supports_token_ids_input,
    "generate.num_sequences": lambda i: i.generation.max_num_sequences > 1,
    "generate.prompt_logprobs.top_n": lambda i: TOP_N in _prompt(i),
    "generate.prompt_logprobs.token_ids": lambda i: TOKEN_IDS in _prompt(i),
    "generate.prompt_logprobs.all": lambda i: ALL in _prompt(i),
    "generate.output_logprobs.top_n": lambda i: TOP_N in _output(i),
    "generate.output_logprobs.token_ids": lambda i: TOKEN_IDS in _output(i),
    "generate.output_logprobs.all": lambda i: ALL in _output(i),
    "generate.priority": lambda i: i.generation.supports_priority,
    "generate.cache_salt": lambda i: i.generation.supports_cache_salt,
    "generate.bypass_prefix_cache": lambda i: i.generation.supports_prefix_cache_bypass,
    "generate.lora": lambda i: i.supports_lora,
    "generate.media": lambda i: i.supports_multimodal,
    "embed.sequence": lambda i: i.tasks.embed.supported
        and tasks_pb2.TASK_OUTPUT_GRANULARITY_SEQUENCE in i.tasks.embed.granularities,
    "embed.token": lambda i: tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN in i.tasks.embed.granularities,
    "embed.sparse": lambda i: tasks_pb2.EMBEDDING_ENCODING_SPARSE in i.tasks.embed.encodings,
    "classify.sequence": lambda i: i.tasks.classify.supported,
    "score.label_tokens": lambda i: i.tasks.score.supports_label_token_scoring,
    "score.instruction": lambda i: i.tasks.score.supports_instruction,
    "lora.lifecycle": lambda i: i.supports_lora,
}
for _mode in ("json_schema", "regex", "ebnf_grammar", "structural_tag", "choice", "json_object"):
    PREDICATES[f"generate.guided.{_mode}"] = (
        lambda i, m=getattr(M, f"GUIDED_DECODING_MODE_{_mode.upper()}"): m in i.generation.guided_decoding.modes)


def check_manifest(info: model_pb2.ModelInfo, conditions_met: set[str], engine: str = "vllm") -> int:
    """Assert every checkable manifest row against the advertisement; return rows checked."""
    checked = 0
    for row in manifest(engine)["features"]:
        key, status = row["key"], row["status"]
        predicate = PREDICATES.get(key)
        if predicate is None or (key.startswith("generate.") and not info.HasField("generation")):
            continue
        expected = status == "supported" or (status == "conditional" and key in conditions_met)
        assert bool(predicate(info)) == expected, f"{key}: manifest says {status}, server advertises {not expected}"
        checked += 1
    return checked
