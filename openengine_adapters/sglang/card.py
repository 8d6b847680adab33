"""What an SGLang engine advertises: its model card (generation limits, guided modes, tasks).

A mixin of ``SglangBackend``: it reads the engine's ``ServerArgs`` and the backend's options.
"""

from __future__ import annotations

from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.sglang import request_mapping
from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    Granularity,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)


def server_arg(server_args: Any, name: str, default: Any = None) -> Any:
    value = getattr(server_args, name, default)
    return default if value is None else value


class SglangCard:
    """The model card of ``SglangBackend``."""

    def _build_card(self) -> be.ModelCard:
        sa = self.server_args
        names = self.options.served_model_names or tuple(
            n for n in (server_arg(sa, "served_model_name"), server_arg(sa, "model_path")) if n)[:1] or ("model",)
        gen = None
        if self.is_generation:
            top = self.options.max_top_n
            gen = be.GenerationSupport(
                prompt_logprobs=be.LogprobSupport(True, (CandidateMode.TOP_N,), top),
                output_logprobs=be.LogprobSupport(True, (CandidateMode.TOP_N, CandidateMode.TOKEN_IDS), top),
                guided_decoding=card.guided_support(card.ALL_GUIDED if self.grammar_backend != "none" else None,
                                                    self.grammar_backend),
                max_num_sequences=self.options.max_num_sequences,  # a prefill's 1: messages.model.card_for_role
                supports_priority=self.priority_on,
                supports_stop_in_output=True,
                supports_cache_salt=self.radix,
                supports_prefix_cache_bypass=False,  # SGLang has no per-request switch
                max_stop_strings=request_mapping.MAX_STOP_STRINGS,
                ignored_options=() if self.deterministic else (be.IgnoredOption(
                    "seed", "SGLang honours a per-request seed only with --enable-deterministic-inference, which "
                    "this engine runs without"),),
            )
        tasks = None
        if self.is_generation and self.role == EngineRole.AGGREGATED:
            tasks = be.TaskSupport(score=card.label_score_support())
        elif self.role == EngineRole.AGGREGATED:
            tasks = self._pooling_tasks()
        model_path = str(server_arg(sa, "model_path", names[0]))
        return be.ModelCard(
            model_id=model_path, served_model_name=names[0], served_model_aliases=tuple(names[1:]),
            max_context_length=self.context_len,
            max_output_tokens=self.context_len if self.is_generation else None,
            kv_block_size=self.page_size,
            total_kv_blocks=self.max_total_tokens // self.page_size if self.max_total_tokens else None,
            max_running_requests=self.max_running,
            max_batched_tokens=server_arg(sa, "chunked_prefill_size")
            if (server_arg(sa, "chunked_prefill_size") or 0) > 0 else None,
            supports_text_input=self.tokenizer is not None, supports_token_ids_input=True,
            generation=gen, supports_lora=self.lora_on, supports_multimodal=False, tasks=tasks,
            extra={k: str(v) for k, v in (("dtype", server_arg(sa, "dtype")),
                                          ("kv_cache_dtype", server_arg(sa, "kv_cache_dtype")),
                                          ("quantization", server_arg(sa, "quantization"))) if v},
        )

    def _pooling_tasks(self) -> be.TaskSupport | None:
        """What an ``--is-embedding`` model offers (see ``pooling``): sequence embeddings (SGLang has
        no token-level ones), sequence classification, native cross-encoder scoring (one label)."""
        m = self.pooling
        if m.kind == "embed":
            return be.TaskSupport(embed=be.EmbedSupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                encodings=(EmbeddingEncoding.DENSE,), dimension=m.hidden_size, supports_priority=False,
                supports_lora=False, supports_normalization=True, supports_dimension_override=m.matryoshka))
        if m.kind != "classify" or m.num_labels < 1:
            return None
        classify = be.ClassifySupport(
            supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
            semantics=m.classify_semantics(), max_output_values_per_item=m.num_labels, supports_priority=False,
            supports_lora=False)
        score = None
        if m.cross_encoder:  # SGLang's rerank: the pair tokenized together, with token type ids
            score = be.ScoreSupport(
                supported=True, input_types=(TaskInputType.TEXT,), granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.RELEVANCE,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False, supports_priority=False,
                supports_lora=False, higher_is_better=True, max_output_values_per_candidate=1)
        return be.TaskSupport(classify=classify, score=score)
