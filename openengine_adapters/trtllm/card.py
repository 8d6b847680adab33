"""What a TensorRT-LLM engine advertises: its model card (context length, guided modes per grammar
backend, label-token scoring), read from the ``LLM``'s arguments.

A mixin of ``TrtllmBackend``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.types import CandidateMode, EngineRole, GuidedMode

# the guides each grammar backend builds (tensorrt_llm/grpc/openengine/capabilities.py
# GUIDE_SUPPORT_BY_BACKEND: llguidance has no structural-tag matcher); choice is lowered to a regex
GUIDED_BY_BACKEND = {
    "xgrammar": tuple(GuidedMode)[1:],
    "llguidance": tuple(m for m in tuple(GuidedMode)[1:] if m != GuidedMode.STRUCTURAL_TAG),
}


def model_max_positions(llm) -> int | None:
    """The context length of the model's own config (``max_position_embeddings``): what the PyTorch
    worker uses when ``max_seq_len`` is not set. ``LLM.args.max_seq_len`` stays None then (the
    worker keeps its deduced value: ``executor/base_worker.py`` ``setup_engine``), so the adapter
    reads the checkpoint's config.json (``LLM._hf_model_dir``)."""
    model_dir = getattr(llm, "_hf_model_dir", None)
    if not model_dir:
        return None
    try:
        with open(os.path.join(str(model_dir), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    for doc in (config, config.get("text_config") or {}):
        value = doc.get("max_position_embeddings") if isinstance(doc, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def llm_arg(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


class TrtllmCard:
    """The model card of ``TrtllmBackend``."""

    def _build_card(self) -> be.ModelCard:
        names = self.options.served_model_names or (str(llm_arg(self.args, "model", default="model")),)
        top = be.LogprobSupport(True, (CandidateMode.TOP_N,), self.options.max_top_n)
        n_max = self.options.max_num_sequences or self.max_batch_size or 8
        output = top
        if self.role == EngineRole.PREFILL and "first_gen_log_probs" not in self._disagg_fields():
            # a prefill's output logprobs are the decode's first token's (v0.1.0 lets a prefill carry the
            # decode leg's options): without DisaggregatedParams.first_gen_log_probs (1.2) they cannot
            # travel in the handoff, as TensorRT-LLM's server carries them (grpc/openengine/disagg.py)
            output = be.LogprobSupport(False)
        gen = be.GenerationSupport(
            prompt_logprobs=top, output_logprobs=output,
            guided_decoding=card.guided_support(GUIDED_BY_BACKEND.get(self.guided_backend), self.guided_backend),
            max_num_sequences=n_max,
            supports_priority=False, supports_stop_in_output=True,
            supports_cache_salt=self.block_reuse and "cache_salt" in self._accepts,
            supports_prefix_cache_bypass=False,
            ignored_options=self.ignored_sampling,
        )
        tasks = None
        if self.role == EngineRole.AGGREGATED:
            tasks = be.TaskSupport(score=card.label_score_support(lora=self.lora_on))
        kv = llm_arg(self.args, "kv_cache_config")
        return be.ModelCard(
            model_id=str(llm_arg(self.args, "model", default=names[0])),
            served_model_name=names[0], served_model_aliases=tuple(names[1:]),
            # at least one prompt token: the whole window is never output
            max_context_length=self.max_context, max_output_tokens=self.max_context - 1 if self.max_context else None,
            kv_block_size=llm_arg(kv, "tokens_per_block") or llm_arg(self.args, "tokens_per_block"),
            max_running_requests=self.max_batch_size,
            max_batched_tokens=llm_arg(self.args, "max_num_tokens"),
            supports_text_input=self.tokenizer is not None, supports_token_ids_input=True,
            generation=gen, supports_lora=self.lora_on, supports_multimodal=False, tasks=tasks,
        )
