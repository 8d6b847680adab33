"""Pure translations between the backend seam and vLLM's native types.

No engine is needed to run these: they take and return plain objects (vLLM's own classes are
imported lazily where one must be built), so they are unit-tested with tables of cases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.errors import EngineFailure
from openengine_adapters.sampling import common_sampling_kwargs
from openengine_adapters.types import CandidateMode, ErrorCode, FinishReason

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


def token_logprob(position: Mapping[int, Any] | None, token_id: int,
                  sel: be.CandidateSelection | None) -> tuple[be.TokenLogprob | None, str]:
    """One position of vLLM logprobs -> (our TokenLogprob, the token's text).

    vLLM returns the top-N entries plus the chosen token with its true vocabulary rank. With
    explicit ``logprob_token_ids`` the ranks vLLM reports are list positions, so candidate ranks
    are omitted; the chosen token's own rank is kept only when it is a true vocabulary rank.
    """
    if position is None:
        return None, ""
    chosen = position.get(token_id)
    text = chosen.decoded_token or "" if chosen is not None else ""
    out = be.TokenLogprob()
    explicit = sel is not None and sel.mode == CandidateMode.TOKEN_IDS
    if chosen is not None:
        out.logprob = outputs.finite(chosen.logprob)
        if not explicit:
            out.rank = chosen.rank
    if sel is None:
        return out, text
    if sel.mode == CandidateMode.TOKEN_IDS:
        for tid in sel.token_ids:
            entry = position.get(tid)
            if entry is not None:
                out.candidates.append(be.Candidate(tid, entry.logprob, entry.decoded_token or ""))
        return out, text
    top_n = sel.top_n if sel.mode == CandidateMode.TOP_N else None  # ALL: every ranked entry
    out.candidates = outputs.top_candidates(position, top_n, text=lambda e: e.decoded_token or "")
    return out, text


def finish(reason: str | None, stop_reason: int | str | None, token_ids: Sequence[int],
           eos_token_id: int | None) -> tuple[FinishReason | None, be.StopMatch | None, str]:
    """vLLM finish_reason/stop_reason -> (reason, stop match, message); vLLM keeps the end token
    in the output, so it names the end token that stopped."""
    return outputs.finish(reason, stop_reason, token_ids, eos_token_id, eos_in_output=True)


class OutputTranslator:
    """Turns one request's DELTA RequestOutputs into GenerationChunks.

    vLLM delivers deltas per output index; this keeps only what the stream needs across chunks
    (whether prompt data was already taken) and copies nothing else.
    """

    __slots__ = ("params", "eos_token_id", "first", "error_code")

    def __init__(self, params: be.GenerateParams, eos_token_id: int | None) -> None:
        self.params = params
        self.eos_token_id = eos_token_id
        self.first = True
        self.error_code = ErrorCode.INTERNAL  # what an "error" finish means (a decode: KV transfer)

    def chunk(self, out) -> be.GenerationChunk:
        chunk = be.GenerationChunk()
        if self.first:
            self.first = False
            prompt_ids = out.prompt_token_ids or ()
            chunk.prompt_tokens = len(prompt_ids)
            if self.params.logprobs.prompt:
                chunk.prompt = self._prompt(prompt_ids, out.prompt_logprobs)
        if out.num_cached_tokens is not None:
            chunk.cached_prompt_tokens = out.num_cached_tokens
        want_lp = self.params.logprobs.output
        sel = self.params.logprobs.output_candidates
        for comp in out.outputs:
            ids = comp.token_ids
            delta = be.OutputDelta(index=comp.index, token_ids=ids, text=comp.text)
            if want_lp and comp.logprobs is not None:
                lps, names = [], []
                for pos, tid in zip(comp.logprobs, ids, strict=False):
                    lp, name = token_logprob(pos, tid, sel)
                    lps.append(lp or be.TokenLogprob())
                    names.append(name)
                delta.logprobs, delta.tokens = lps, names
            reason, stop, message = finish(comp.finish_reason, comp.stop_reason, ids,
                                           self.eos_token_id)
            if comp.finish_reason is not None and reason is None:
                raise EngineFailure(self.error_code if comp.finish_reason == "error" else ErrorCode.INTERNAL,
                                    message)
            delta.finish_reason, delta.stop, delta.finish_message = reason, stop, message
            chunk.outputs.append(delta)
        return chunk

    def _prompt(self, prompt_ids: Sequence[int], prompt_logprobs) -> list[be.PromptToken]:
        start = self.params.logprobs.prompt_start or 0
        sel = self.params.logprobs.prompt_candidates
        tokens = []
        for i in range(start, len(prompt_ids)):
            tid = prompt_ids[i]
            pos = prompt_logprobs[i] if prompt_logprobs is not None and i < len(prompt_logprobs) else None
            lp, name = token_logprob(pos, tid, sel)
            tokens.append(be.PromptToken(tid, name, lp))
        return tokens
