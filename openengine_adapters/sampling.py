"""Sampling and stopping options as engine keyword arguments.

vLLM's and TensorRT-LLM's ``SamplingParams`` share these names. Only options the client set are
passed (presence, not truthiness), so absent ones keep the engine's defaults and an explicit
0 / False reaches the engine as such. Each adapter adds what differs (max_tokens, logprobs, ...).
"""

from __future__ import annotations

from typing import Any

from openengine_adapters.backend import GenerateParams

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
             "repetition_penalty", "seed")


def common_sampling_kwargs(p: GenerateParams) -> dict[str, Any]:
    s, st = p.sampling, p.stopping
    kw: dict[str, Any] = {"n": s.num_sequences}
    for name in _SAMPLING:
        value = getattr(s, name)
        if value is not None:
            kw[name] = value
    if st.min_tokens is not None:
        kw["min_tokens"] = st.min_tokens
    if st.stop_texts:
        kw["stop"] = list(st.stop_texts)
    if st.stop_token_ids:
        kw["stop_token_ids"] = list(st.stop_token_ids)
    if st.ignore_eos is not None:
        kw["ignore_eos"] = st.ignore_eos
    if st.include_stop_in_output is not None:
        kw["include_stop_str_in_output"] = st.include_stop_in_output
    return kw
