"""A validated request (the backend seam's ``GenerateParams``) -> vLLM's ``SamplingParams`` keyword
arguments and prompt.

Pure: no engine is needed (the backend builds vLLM's classes from what is returned here), so these
are unit-tested with tables of cases (tests/vllm/engine_free/test_vllm_mapping.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.sampling import common_sampling_kwargs
from openengine_adapters.types import CandidateMode

# vLLM caps explicit logprob_token_ids (SamplingParams.MAX_LOGPROB_TOKEN_IDS).
MAX_LOGPROB_TOKEN_IDS = 128


# v0.1.0 GenerateRequest.extra keys this adapter applies: vLLM SamplingParams fields with no portable field
REQUEST_EXTRA = {
    "skip_special_tokens": be.ExtraKey("bool", "vLLM SamplingParams.skip_special_tokens (default true)"),
    "spaces_between_special_tokens": be.ExtraKey(
        "bool", "vLLM SamplingParams.spaces_between_special_tokens (default true)"),
    "allowed_token_ids": be.ExtraKey("int_list", "vLLM SamplingParams.allowed_token_ids: sample only these ids"),
    "bad_words": be.ExtraKey("string_list", "vLLM SamplingParams.bad_words: words never generated"),
}


def sampling_kwargs(p: be.GenerateParams) -> dict[str, Any]:
    """SamplingParams keyword arguments for a validated request: the shared options, plus an
    explicit ``max_tokens`` (absent: None, so vLLM generates up to the context length), logprob
    selections, prefix-cache bypass and metadata."""
    lp = p.logprobs
    kw = common_sampling_kwargs(p, "vllm")
    kw["max_tokens"] = p.stopping.max_tokens
    if lp.output:
        sel = lp.output_candidates
        if sel is None:
            kw["logprobs"] = 0  # the sampled token's own logprob and rank only
        elif sel.mode == CandidateMode.TOP_N:
            kw["logprobs"] = sel.top_n
        elif sel.mode == CandidateMode.TOKEN_IDS:
            kw["logprob_token_ids"] = list(sel.token_ids)
        else:
            kw["logprobs"] = -1
    if lp.prompt:
        sel = lp.prompt_candidates
        if sel is None:
            kw["prompt_logprobs"] = 0
        elif sel.mode == CandidateMode.TOP_N:
            kw["prompt_logprobs"] = sel.top_n
        else:
            kw["prompt_logprobs"] = -1
    if p.bypass_prefix_cache is not None:
        kw["skip_reading_prefix_cache"] = p.bypass_prefix_cache
    if p.metadata:
        # visible to logits processors and plugins; vLLM itself ignores unknown extra_args
        kw["extra_args"] = {"openengine_metadata": dict(p.metadata)}
    kw.update(p.extra)  # already checked against REQUEST_EXTRA (names are SamplingParams fields)
    return kw


def prompt_input(p: be.GenerateParams, multi_modal_data: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """A TextPrompt / TokensPrompt dict (cache salt and media attached)."""
    prompt: dict[str, Any] = (
        {"prompt": p.prompt} if p.prompt is not None else {"prompt_token_ids": list(p.token_ids)}
    )
    if p.cache_salt is not None:
        prompt["cache_salt"] = p.cache_salt
    if multi_modal_data:
        prompt["multi_modal_data"] = dict(multi_modal_data)
        uuids = {}
        for m in p.media:
            uuids.setdefault(m.modality.name.lower(), []).append(m.uuid or None)
        if any(u for us in uuids.values() for u in us):
            prompt["multi_modal_uuids"] = uuids
    return prompt


def engine_priority(priority: int | None) -> int:
    """OpenEngine: higher runs first. vLLM's priority policy: lower runs first."""
    return 0 if priority is None else -priority

