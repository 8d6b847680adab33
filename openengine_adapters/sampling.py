"""The sampling table: each sampling field's range and the keyword each engine takes it as.

One table drives validation (``validation/generate.py`` refuses a value outside the range, naming
the field and the rule) and every engine's translation (``keyword(name, engine)``). Only options
the client set are passed (presence, not truthiness), so absent ones keep the engine's defaults
and an explicit 0 / False reaches the engine as such. Each adapter adds what differs
(max_tokens, logprobs, top_k's "all" value, per-output seeds...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.backend import GenerateParams

ENGINES = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class SamplingField:
    name: str                                   # GenerateRequest.sampling.<name>
    rule: str = ""                              # the range, as a refusal states it ("" = checked elsewhere)
    within: Callable[[float], bool] | None = None
    keywords: Mapping[str, str] = field(default_factory=dict)  # engine -> its keyword, where not ``name``

    def keyword(self, engine: str) -> str:
        return self.keywords.get(engine, self.name)


SAMPLING_FIELDS = (
    SamplingField("temperature", "must be >= 0", lambda v: v >= 0),
    SamplingField("top_p", "must be in (0, 1]", lambda v: 0.0 < v <= 1.0),
    SamplingField("min_p", "must be in [0, 1]", lambda v: 0.0 <= v <= 1.0),
    SamplingField("frequency_penalty", "must be in [-2, 2]", lambda v: -2.0 <= v <= 2.0),
    SamplingField("presence_penalty", "must be in [-2, 2]", lambda v: -2.0 <= v <= 2.0),
    SamplingField("repetition_penalty", "must be > 0", lambda v: v > 0),
    # integers, checked and mapped by value in validation and by each engine
    SamplingField("top_k"),
    SamplingField("seed", keywords={"sglang": "sampling_seed"}),
)
# the real-valued fields: one range each
REAL_FIELDS = tuple(f for f in SAMPLING_FIELDS if f.within is not None)


def set_sampling(p: GenerateParams, engine: str, fields=SAMPLING_FIELDS) -> dict[str, Any]:
    """The sampling fields the client set, under ``engine``'s keywords."""
    kw: dict[str, Any] = {}
    for f in fields:
        value = getattr(p.sampling, f.name)
        if value is not None:
            kw[f.keyword(engine)] = value
    return kw


def common_sampling_kwargs(p: GenerateParams, engine: str) -> dict[str, Any]:
    """``SamplingParams`` keywords vLLM and TensorRT-LLM share: the sampling table's fields plus
    ``n`` and the stop options."""
    s, st = p.sampling, p.stopping
    kw: dict[str, Any] = {"n": s.num_sequences, **set_sampling(p, engine)}
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
