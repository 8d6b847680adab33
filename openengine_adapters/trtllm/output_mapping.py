"""TensorRT-LLM's streamed ``CompletionOutput``s -> the backend seam's chunks: tokens, text, logprobs
and the finish.

TensorRT-LLM streams CUMULATIVE ``CompletionOutput``s. With n > 1 each engine response updates
one sequence while the ``*_diff`` properties of the others keep returning their last diff, so
``TrtllmOutputMapper`` never reads ``*_diff``: it keeps its own per-index offsets into the
cumulative ``token_ids`` / ``text`` / ``logprobs`` lists.

Pure: no engine is needed, so these are unit-tested with tables of cases
(tests/trtllm/test_trtllm_mapping.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import ErrorCode, FinishReason


def token_logprob(position: Mapping[int, Any] | None, token_id: int | None,
                  sel: be.CandidateSelection | None) -> be.TokenLogprob | None:
    """One position of TensorRT-LLM logprobs (dict token_id -> Logprob(logprob, rank)).

    ``token_id`` None (prompt positions): the scored token may be absent from the top-k dict
    (TensorRT-LLM adds the SAMPLED token only), then its logprob/rank stay absent.
    """
    if position is None:
        return None
    out = be.TokenLogprob()
    chosen = position.get(token_id) if token_id is not None else None
    if chosen is not None:
        out.logprob = outputs.finite(chosen.logprob)
        out.rank = chosen.rank
    if sel is not None and sel.top_n > 0:
        out.candidates = outputs.top_candidates(position, sel.top_n, finite_only=True)
    return out


def finish(reason: str | None, stop_reason: int | str | None, token_ids: Sequence[int],
           eos_token_id: int | None) -> tuple[FinishReason | None, be.StopMatch | None, str]:
    """CompletionOutput finish_reason/stop_reason -> (reason, stop match, message).

    ``stop_reason`` is the matched stop string (str) or stop token id (int); None on "stop"
    means the model's end token.
    """
    return outputs.finish(reason, stop_reason, token_ids, eos_token_id, engine_reasons=ENGINE_FINISH_REASONS)


# TensorRT-LLM's endings besides stop and length (executor/result.py)
ENGINE_FINISH_REASONS = {
    "cancelled": (FinishReason.CANCELLED, "cancelled in the engine"),
    "timeout": (FinishReason.CANCELLED, "timed out in the engine (allotted time exceeded)"),
}


class _Index(outputs.OutputCursor):
    """One sequence's cursor, with its incremental detokenization window."""

    __slots__ = ("decoded", "prefix", "read")

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.decoded = ""  # the text of token_ids[:read], decoded here
        self.prefix = 0    # incremental decoding window: token_ids[prefix:read] was the last chunk
        self.read = 0


class TrtllmOutputMapper:
    """Turns one request's cumulative RequestOutputs into delta GenerationChunks.

    Text is decoded here from each output's token ids, incrementally (the engine runs with
    ``detokenize=False``): TensorRT-LLM's own detokenizer re-appends a stale diff to every output a
    response did not update when n > 1, and keeps text it appended for stop-word tokens it then
    truncates (``executor/result.py`` ``DetokenizedGenerationResultBase._handle_response``).

    Stop strings: TensorRT-LLM streams the tokens of a multi-token stop string before the match
    completes, then truncates the final output. Unless ``include_stop_in_output``, text that may
    be the start of a stop string and the last ``stop_token_holdback`` tokens are held back until
    the match is ruled out, so nothing is emitted and later retracted. With n > 1 TensorRT-LLM sets
    a finish reason (and truncates the stop word) only on the sequence of the request's final
    response; the others' are inferred here from their tokens, stop words included.
    """

    __slots__ = ("params", "eos_token_id", "stop_token_holdback", "max_tokens", "_first", "_idx", "_stops",
                 "_sel", "_decode", "_stop_ids")

    def __init__(self, params: be.GenerateParams, eos_token_id: int | None, stop_token_holdback: int = 0,
                 decode=None, stop_ids: Mapping[str, Sequence[int]] | None = None) -> None:
        self.params = params
        self.eos_token_id = eos_token_id
        st = params.stopping
        self._stops = st.stop_texts if st.stop_texts and not st.include_stop_in_output else ()
        self.stop_token_holdback = stop_token_holdback if self._stops else 0
        self.max_tokens: int | None = None  # the max_tokens in force, for the fallback below
        self._first = True
        self._idx = [_Index(i) for i in range(params.sampling.num_sequences)]
        self._sel = params.logprobs.output_candidates
        self._decode = decode  # token ids -> text; None: take the engine's text
        self._stop_ids = {k: list(v) for k, v in (stop_ids or {}).items() if v}

    def chunk(self, out) -> be.GenerationChunk:
        chunk = be.GenerationChunk()
        if self._first:
            self._first = False
            prompt_ids = out.prompt_token_ids or ()
            chunk.prompt_tokens = len(prompt_ids)
            if self.params.logprobs.prompt:
                plp = out.outputs[0].prompt_logprobs if out.outputs else None
                chunk.prompt = self.prompt(prompt_ids, plp)
        cached = getattr(out, "cached_tokens", None)
        if cached is not None:
            chunk.cached_prompt_tokens = cached
        for comp in out.outputs:
            delta = self._delta(comp, bool(out.finished))
            if delta is not None:
                chunk.outputs.append(delta)
        return chunk

    def _inferred_finish(self, ids: Sequence[int]) -> tuple[FinishReason, be.StopMatch | None, str, Sequence[int]]:
        """The request is final but this sequence carries no finish reason (TensorRT-LLM sets
        reasons only on the response that completes the request): infer it from its tokens, as
        ``executor/result.py`` ``_handle_sequence`` would have (stop words matched on the token
        suffix and truncated unless included). Returns the sequence's token ids as they stand."""
        hit = self._stop_word(ids)
        if hit is not None:
            return hit
        if self.max_tokens is not None and len(ids) >= self.max_tokens:
            return FinishReason.LENGTH, None, "", ids
        last = ids[-1] if ids else None
        if last is not None and last in self.params.stopping.stop_token_ids:
            return FinishReason.STOP, be.StopMatch(stop_token_id=last), "", ids
        if self.eos_token_id is not None:
            return FinishReason.STOP, be.StopMatch(eos_token_id=self.eos_token_id), "finish reason inferred", ids
        raise EngineFailure(ErrorCode.INTERNAL, f"engine ended sequence {len(self._idx)} without a finish reason")

    def _stop_word(self, ids: Sequence[int]):
        """A sequence whose tokens end with a stop word has stopped (TensorRT-LLM matches stop
        strings as token ids), whether or not the engine said so on this response."""
        if len(ids) < (self.params.stopping.min_tokens or 0):
            return None
        for text, sids in self._stop_ids.items():
            if len(ids) >= len(sids) and list(ids[len(ids) - len(sids):]) == sids:
                kept = ids if self.params.stopping.include_stop_in_output else ids[:len(ids) - len(sids)]
                return FinishReason.STOP, be.StopMatch(stop_text=text), "", kept
        return None

    def _text(self, st: _Index, ids: Sequence[int], comp, finished: bool) -> str:
        """The text of ``ids`` (decoded incrementally; once in full if the engine truncated them)."""
        if self._decode is None:
            return comp.text or ""
        if len(ids) < st.read:  # stop words truncated at the finish
            st.decoded, st.prefix, st.read = self._decode(list(ids)), len(ids), len(ids)
        elif len(ids) > st.read:
            before = self._decode(list(ids[st.prefix:st.read]))
            after = self._decode(list(ids[st.prefix:]))
            if finished or not after.endswith("\ufffd"):  # an incomplete character waits for its bytes
                st.decoded += after[len(before):]
                st.prefix, st.read = st.read, len(ids)
        return st.decoded

    def _delta(self, comp, final: bool = False) -> be.OutputDelta | None:
        index = comp.index
        if not 0 <= index < len(self._idx):
            raise EngineFailure(ErrorCode.INTERNAL, f"engine produced sequence index {index}")
        st = self._idx[index]
        if st.done:
            return None
        ids = comp.token_ids or []
        reason, stop, message = finish(comp.finish_reason, comp.stop_reason, ids, self.eos_token_id)
        if reason is None and comp.finish_reason not in (None, "not_finished"):
            raise EngineFailure(ErrorCode.INTERNAL, message)
        if reason is None and self._stop_ids:
            hit = self._stop_word(ids)
            if hit is not None:
                reason, stop, message, ids = hit
        if reason is None and final:
            reason, stop, message, ids = self._inferred_finish(ids)
        text = self._text(st, ids, comp, reason is not None)
        if reason == FinishReason.STOP and stop.stop_text is not None and self._stops \
                and text.endswith(stop.stop_text):
            text = text[:len(text) - len(stop.stop_text)]  # defensive: some versions keep it in the text

        def logprobs(start: int, end: int) -> tuple[list[be.TokenLogprob], list[str]]:
            lps = comp.logprobs or []
            return ([token_logprob(lps[i] if i < len(lps) else None, ids[i], self._sel) or be.TokenLogprob()
                     for i in range(start, end)], [""] * (end - start))

        return st.advance(ids, text, reason, stop, message, stops=self._stops, id_holdback=self.stop_token_holdback,
                          logprobs=logprobs if self.params.logprobs.output else None)

    def prompt(self, prompt_ids: Sequence[int], prompt_logprobs) -> list[be.PromptToken]:
        """PromptTokens from TensorRT-LLM prompt logprobs.

        TensorRT-LLM computes them from the context logits: entry ``i`` is the next-token
        distribution after prompt position ``i``, so it scores prompt token ``i + 1`` (top-k
        only; the prompt token itself is present only when it is in the top k).
        """
        start = self.params.logprobs.prompt_start or 0
        sel = self.params.logprobs.prompt_candidates
        lps = prompt_logprobs or []
        tokens = []
        for i in range(start, len(prompt_ids)):
            tid = prompt_ids[i]
            pos = lps[i - 1] if 0 < i <= len(lps) else None
            tokens.append(be.PromptToken(tid, "", token_logprob(pos, tid, sel) if pos is not None else None))
        return tokens

    def unfinished(self) -> list[int]:
        return [i for i, st in enumerate(self._idx) if not st.done]

