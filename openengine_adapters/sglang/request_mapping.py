"""A validated request (the backend seam's ``GenerateParams``) -> SGLang's ``GenerateReqInput`` keyword
arguments (0.5.x), one SGLang request per output sequence.

Pure: no engine is needed (the backend builds ``GenerateReqInput`` from what is returned here), so
these are unit-tested with tables of cases (tests/sglang/engine_free/test_sglang_mapping.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.guided_kwargs import choice_regex
from openengine_adapters.errors import invalid
from openengine_adapters.sampling import REAL_FIELDS, set_sampling
from openengine_adapters.types import CandidateMode, GuidedMode

# SGLang's stop-string limit (``SamplingParams.normalize``): more are refused there.
MAX_STOP_STRINGS = 32


def engine_rids(request_id: str, n: int, salt: str | None = None) -> list[str]:
    """SGLang request ids for the n outputs of one OpenEngine request.

    SGLang's scheduler aborts every request whose rid STARTS WITH the aborted rid, so these ids
    must never prefix one another nor any other request's: each starts with a fixed-length random
    salt shared only by this request, then the index closed by ``|`` (so ``-1|`` can never prefix
    ``-10|``), then the client's id for readability in SGLang's logs.
    """
    salt = salt or uuid.uuid4().hex
    return [f"oe{salt}-{i}|{request_id}" for i in range(n)]


def derived_seed(seed: int, index: int) -> int:
    """Output ``index``'s sampling seed: the request seed for index 0, a splitmix64 mix for the
    others (n identical seeds would give n identical samples), kept in SGLang's int64 range."""
    if index == 0:
        return seed if seed < 2**63 else seed - 2**64
    z = (seed + 0x9E3779B97F4A7C15 * index) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) >> 1


def guided_kwargs(g: be.Guided) -> dict[str, str]:
    """The SGLang sampling_params constraint: choice lowered to a regex and json_object to the
    schema ``{"type": "object"}``, as SGLang's own OpenAI layer does."""
    if g.mode == GuidedMode.JSON_SCHEMA:
        return {"json_schema": g.value}
    if g.mode == GuidedMode.REGEX:
        return {"regex": g.value}
    if g.mode == GuidedMode.EBNF_GRAMMAR:
        return {"ebnf": g.value}
    if g.mode == GuidedMode.STRUCTURAL_TAG:
        return {"structural_tag": g.value}
    if g.mode == GuidedMode.CHOICE:
        return {"regex": choice_regex(g.value)}
    if g.mode == GuidedMode.JSON_OBJECT:
        return {"json_schema": json.dumps({"type": "object"})}
    raise invalid(f"guided: unsupported mode {g.mode!r}")


# v0.1.0 GenerateRequest.extra keys this adapter applies: SGLang sampling parameters with no portable field
REQUEST_EXTRA = {
    "skip_special_tokens": be.ExtraKey("bool", "SGLang sampling_params.skip_special_tokens (default true)"),
    "spaces_between_special_tokens": be.ExtraKey(
        "bool", "SGLang sampling_params.spaces_between_special_tokens (default true)"),
}


def sampling_params(p: be.GenerateParams, index: int = 0) -> dict[str, Any]:
    """SGLang's ``sampling_params`` dict for output ``index`` of a validated request.

    Only options the client set are passed (presence), except ``max_new_tokens``, which is always
    explicit: SGLang's default is 128, while an absent OpenEngine max_tokens means "up to the
    context length" (None: SGLang bounds it by the context). ``n`` is always 1: the backend issues
    one SGLang request per output.
    """
    s, st = p.sampling, p.stopping
    sp: dict[str, Any] = {"max_new_tokens": st.max_tokens}
    sp.update(set_sampling(p, "sglang", REAL_FIELDS))  # top_k and seed are mapped by value below
    if s.top_k is not None:
        sp["top_k"] = s.top_k if s.top_k > 0 else -1  # OpenEngine 0/-1 = disabled; SGLang -1 = all
    if s.seed is not None:
        sp["sampling_seed"] = derived_seed(s.seed, index)
    if st.min_tokens is not None:
        sp["min_new_tokens"] = st.min_tokens
    if st.stop_texts:
        sp["stop"] = list(st.stop_texts)
    if st.stop_token_ids:
        # With ignore_eos SGLang does not stop on them (the adapter matches them, output_mapping)
        # but still masks them during min_new_tokens.
        sp["stop_token_ids"] = list(st.stop_token_ids)
    if st.ignore_eos is not None:
        sp["ignore_eos"] = st.ignore_eos
    if st.include_stop_in_output is not None:
        sp["no_stop_trim"] = st.include_stop_in_output
    if p.guided is not None:
        sp.update(guided_kwargs(p.guided))
    sp.update(p.extra)  # already checked against REQUEST_EXTRA (names are SGLang's)
    return sp


def top_logprobs_num(lp: be.LogprobRequest) -> int:
    """SGLang has one ``top_logprobs_num`` for prompt and output: the larger TOP_N asked (each side
    is cut back to its own n when translated)."""
    n = 0
    for want, sel in ((lp.prompt, lp.prompt_candidates), (lp.output, lp.output_candidates)):
        if want and sel is not None and sel.mode == CandidateMode.TOP_N:
            n = max(n, sel.top_n)
    return n


def request_kwargs(p: be.GenerateParams, rid: str, index: int = 0, *,
                   disagg: Mapping[str, Any] | None = None, low_priority_first: bool = False) -> dict[str, Any]:
    """``GenerateReqInput`` keyword arguments for output ``index`` (one SGLang request).
    ``low_priority_first``: SGLang runs with ``--schedule-low-priority-values-first``."""
    kw: dict[str, Any] = {"rid": rid, "stream": True,
                          "sampling_params": sampling_params(p, index)}
    if p.prompt is not None:
        kw["text"] = p.prompt
    else:
        kw["input_ids"] = list(p.token_ids)
    lp = p.logprobs
    if lp.prompt or lp.output:
        kw["return_logprob"] = True
        kw["return_text_in_logprobs"] = True
        # -1: no prompt logprobs. SGLang reports no logprob for the first position it returns, so
        # a start > 0 asks one position earlier and prompt_tokens() drops it.
        kw["logprob_start_len"] = max(0, (lp.prompt_start or 0) - 1) if lp.prompt else -1
        top = top_logprobs_num(lp)
        if top:
            kw["top_logprobs_num"] = top
        sel = lp.output_candidates
        if lp.output and sel is not None and sel.mode == CandidateMode.TOKEN_IDS:
            kw["token_ids_logprob"] = list(sel.token_ids)
    if p.lora_name:
        kw["lora_path"] = p.lora_name  # SGLang resolves the registered adapter name
    if p.priority is not None:  # OpenEngine: higher runs first, as SGLang's default
        kw["priority"] = -p.priority if low_priority_first else p.priority
    if p.cache_salt is not None:
        kw["cache_salt"] = p.cache_salt
    if p.data_parallel_rank is not None:
        kw["routed_dp_rank"] = p.data_parallel_rank
    if p.trace_headers:
        kw["external_trace_header"] = dict(p.trace_headers)  # used when SGLang runs with --enable-trace
    if disagg:
        kw.update(disagg)
    return kw


def kv_events_config(raw: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """SGLang's ``--kv-events-config`` JSON -> dict; ``None`` unless it configures a ZMQ publisher."""
    if not raw:
        return None
    cfg = json.loads(raw) if isinstance(raw, str) else dict(raw)
    if cfg.get("publisher", "null") != "zmq":
        return None
    cfg.setdefault("endpoint", "tcp://*:5557")
    return cfg

