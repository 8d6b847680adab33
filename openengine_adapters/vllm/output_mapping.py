"""vLLM's ``RequestOutput`` deltas -> the backend seam's chunks: tokens, text, logprobs and the finish.

Pure: no engine is needed, so these are unit-tested with tables of cases
(tests/vllm/engine_free/test_vllm_mapping.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import CandidateMode, ErrorCode, FinishReason


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


class VllmOutputMapper:
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

