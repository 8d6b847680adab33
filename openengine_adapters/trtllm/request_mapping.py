"""A validated request (the backend seam's ``GenerateParams``) -> TensorRT-LLM's ``SamplingParams``
keyword arguments and prompt (LLM API 1.2.x).

Pure: no engine is needed (the backend builds TensorRT-LLM's classes from what is returned here), so
these are unit-tested with tables of cases (tests/trtllm/test_trtllm_mapping.py).
"""

from __future__ import annotations

from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.sampling import common_sampling_kwargs


def logprob_count(sel: be.CandidateSelection | None) -> int:
    """TensorRT-LLM's top-k ``logprobs``/``prompt_logprobs`` count for a TOP_N selection.

    Never 0: some 1.x versions treat 0 as "off". With k >= 1 the sampled token is always
    reported with its true vocabulary rank; candidates beyond ``top_n`` are filtered out.
    """
    return max(1, sel.top_n if sel is not None else 0)


# What an absent temperature / top_p / top_k mean: sampling at temperature 1 over the whole
# vocabulary, as vLLM and TensorRT-LLM's own OpenEngine server (request_mapping.py
# sampling_params_from_request) do. Left unset, TensorRT-LLM would decode greedily
# (SamplingParams.params_imply_greedy_decoding) and refuse num_sequences > 1.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def sampling_kwargs(p: be.GenerateParams) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for a validated request: the shared options, absent
    sampling knobs at ``SAMPLING_DEFAULTS``, top_k -1 mapped to 0 and top-k logprob counts.
    ``max_tokens`` is None when the client gave none: TensorRT-LLM's worker then deduces the room left
    in its own max_seq_len (``executor/base_worker.py`` ``_deduce_max_tokens``), which the LLM object
    does not expose unless the user set it (``validation.generate.check_room`` refuses what it would
    clamp)."""
    lp = p.logprobs
    kw = common_sampling_kwargs(p, "trtllm")
    kw["max_tokens"] = p.stopping.max_tokens
    if p.sampling.top_k is not None:
        kw["top_k"] = max(p.sampling.top_k, 0)  # OpenEngine -1/0 = disabled; TensorRT-LLM 0 = all tokens
    for name, value in SAMPLING_DEFAULTS.items():
        kw.setdefault(name, value)
    if lp.output:
        kw["logprobs"] = logprob_count(lp.output_candidates)
    if lp.prompt:
        kw["prompt_logprobs"] = logprob_count(lp.prompt_candidates)
    return kw


def prompt_input(p: be.GenerateParams) -> str | dict[str, Any]:
    """``inputs`` of ``generate_async``: the text, or a token-ids prompt."""
    return p.prompt if p.prompt is not None else {"prompt_token_ids": list(p.token_ids)}

