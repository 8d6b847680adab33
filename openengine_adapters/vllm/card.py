"""What a vLLM engine advertises: its model card (logprob limits, guided modes, tasks).

A mixin of ``VllmBackend``: it reads the engine's ``VllmConfig`` and supported tasks.
"""

from __future__ import annotations

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card
from openengine_adapters.types import (
    CandidateMode,
    EmbeddingEncoding,
    EngineRole,
    Granularity,
    Modality,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)
from openengine_adapters.vllm import request_mapping


class VllmCard:
    """The model card of ``VllmBackend``."""

    @property
    def max_logprobs(self) -> int:
        return self.model_config.max_logprobs

    def _logprob_support(self, explicit_ids: bool) -> be.LogprobSupport:
        modes = [CandidateMode.TOP_N]
        if explicit_ids:
            modes.append(CandidateMode.TOKEN_IDS)
        if self.max_logprobs == -1:
            modes.append(CandidateMode.ALL)
        return be.LogprobSupport(True, tuple(modes), self.max_logprobs if self.max_logprobs > 0 else None,
                                 request_mapping.MAX_LOGPROB_TOKEN_IDS if explicit_ids else None)

    def _build_card(self) -> be.ModelCard:
        mc, sc, cc = self.model_config, self.config.scheduler_config, self.config.cache_config
        generates = "generate" in self.supported_tasks
        gen = None
        if generates:
            prefix = bool(cc.enable_prefix_caching)
            gen = be.GenerationSupport(
                prompt_logprobs=self._logprob_support(explicit_ids=False),
                output_logprobs=self._logprob_support(explicit_ids=True),
                guided_decoding=card.guided_support(card.ALL_GUIDED, self.config.structured_outputs_config.backend),
                max_num_sequences=sc.max_num_seqs,
                supports_priority=sc.policy == "priority",
                supports_stop_in_output=True,
                supports_cache_salt=prefix,
                supports_prefix_cache_bypass=prefix,
            )
        return be.ModelCard(
            model_id=mc.model,
            served_model_name=self.served_model_names[0],
            served_model_aliases=self.served_model_names[1:],
            max_context_length=mc.max_model_len,
            max_output_tokens=mc.max_model_len if generates else None,
            kv_block_size=cc.block_size,
            total_kv_blocks=cc.num_gpu_blocks or None,
            max_running_requests=sc.max_num_seqs,
            max_batched_tokens=sc.max_num_batched_tokens,
            tokenizer_modes=(mc.tokenizer_mode,),
            supports_text_input=not mc.skip_tokenizer_init,
            supports_token_ids_input=True,
            generation=gen,
            supports_lora=self.config.lora_config is not None,
            supports_multimodal=bool(mc.is_multimodal_model),
            media_modalities=(Modality.IMAGE,),  # media.py loads images only
            tasks=self._task_support() if self.role == EngineRole.AGGREGATED else None,
            extra={"dtype": str(mc.dtype).removeprefix("torch."), "kv_cache_dtype": str(cc.cache_dtype),
                   "max_logprobs": mc.max_logprobs, **({"quantization": mc.quantization} if mc.quantization else {})},
        )

    def _task_support(self) -> be.TaskSupport | None:
        tasks = self.supported_tasks
        lora = self.config.lora_config is not None
        priority = self.config.scheduler_config.policy == "priority"
        embed = classify = score = None
        if "embed" in tasks or "token_embed" in tasks:
            grans = tuple(g for g, t in ((Granularity.SEQUENCE, "embed"), (Granularity.TOKEN, "token_embed"))
                          if t in tasks)
            dim = getattr(self.model_config.hf_config, "hidden_size", None)
            embed = be.EmbedSupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=grans,
                encodings=(EmbeddingEncoding.DENSE,), dimension=dim,
                supports_priority=priority, supports_lora=lora, supports_normalization=True,
                supports_dimension_override=bool(self.model_config.is_matryoshka),
            )
        if "classify" in tasks:
            classify = be.ClassifySupport(
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.PROBABILITIES, ValueSemantics.LOGITS),
                supports_priority=priority, supports_lora=lora,
            )
        if self._num_labels() == 1 and "classify" in tasks:
            score = be.ScoreSupport(  # cross-encoder: one relevance logit per (query, document)
                supported=True, input_types=(TaskInputType.TEXT,), granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.RELEVANCE,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False,
                supports_priority=priority, supports_lora=lora, higher_is_better=True,
            )
        elif "embed" in tasks:
            score = be.ScoreSupport(  # bi-encoder: cosine similarity of the two embeddings
                supported=True, input_types=card.TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
                semantics=(ValueSemantics.SIMILARITY,), normalizations=(ScoreNormalization.NONE,),
                supports_label_token_scoring=False, supports_instruction=False,
                supports_priority=priority, supports_lora=lora, higher_is_better=True,
            )
        elif "generate" in tasks:
            score = card.label_score_support(priority=priority, lora=lora,
                                             max_label_token_ids=request_mapping.MAX_LOGPROB_TOKEN_IDS)
        if embed is classify is score is None:
            return None
        return be.TaskSupport(embed=embed, classify=classify, score=score)

    def _num_labels(self) -> int | None:
        return getattr(self.model_config.hf_config, "num_labels", None)
