"""SGLang's streamed outputs -> the backend seam's chunks: tokens, text, logprobs, prompt tokens and
the finish.

SGLang streams CUMULATIVE chunks (``incremental_streaming_output`` off, its default): every
chunk carries the whole ``output_ids`` / ``text`` / logprob lists so far, and intermediate chunks
may alias SGLang's live lists. ``SglangOutputMapper.delta`` therefore slices what is new at once,
with its own per-output offsets, before the caller awaits anything.

Pure: no engine is needed, so these are unit-tested with tables of cases
(tests/sglang/engine_free/test_sglang_mapping.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import CandidateMode, ErrorCode, FinishReason


def finish(reason: Mapping[str, Any] | None, eos_token_id: int | None, last_token: int | None
           ) -> tuple[FinishReason | None, be.StopMatch | None, str, bool]:
    """SGLang ``meta_info.finish_reason`` -> (reason, stop match, message, aborted).

    ``{"type": "stop", "matched": <token id | str>}``; ``matched`` absent/None means the model's
    EOS. ``{"type": "length"}``. ``{"type": "abort", "status_code": ...}``: ``aborted`` is True;
    an abort with an HTTP error status is a request failure (its message).
    """
    if reason is None:
        return None, None, "", False
    kind = reason.get("type")
    if kind == "abort":
        return None, None, str(reason.get("message") or "aborted"), True
    if kind not in ("stop", "length"):
        return None, None, f"engine finished with {reason!r}", False
    matched = reason.get("matched")
    if eos_token_id is not None and matched == eos_token_id and not isinstance(matched, bool):
        matched = None  # SGLang names the model's end token by its id
    return (*outputs.finish(kind, matched, () if last_token is None else (last_token,), eos_token_id), False)


def abort_failure(reason: Mapping[str, Any]) -> EngineFailure | None:
    """An SGLang abort that is a failure, not a cancellation: one carrying an HTTP error status
    (the scheduler refusing the request, e.g. a prompt beyond the KV budget) or a PD transfer
    failure. ``None`` for a plain abort (ours, or a client's)."""
    status = reason.get("status_code")
    message = str(reason.get("message") or "aborted by SGLang")
    if status is None:
        return None
    code = ErrorCode.INVALID_ARGUMENT if status == 400 else ErrorCode.INTERNAL
    if "transfer" in message.lower() or "bootstrap" in message.lower():
        code = ErrorCode.KV_TRANSFER_FAILED
    return EngineFailure(code, f"SGLang aborted the request: {message}")


def _candidates(entries: Sequence[Any] | None, limit: int | None, ranked: bool) -> list[be.Candidate]:
    """SGLang ``(logprob, token_id, text)`` triples -> Candidates (``ranked``: list order is the
    vocabulary rank, true for top-n lists sorted by SGLang)."""
    out: list[be.Candidate] = []
    if not entries:
        return out
    for i, entry in enumerate(entries[:limit] if limit is not None else entries):
        lp, tid = entry[0], entry[1]
        if lp is None or not math.isfinite(lp):
            continue
        text = entry[2] if len(entry) > 2 and entry[2] is not None else ""
        out.append(be.Candidate(int(tid), float(lp), text, i + 1 if ranked else None))
    return out


def token_logprob(token: Sequence[Any] | None, top: Sequence[Any] | None, by_id: Sequence[Any] | None,
                  sel: be.CandidateSelection | None) -> tuple[be.TokenLogprob, str]:
    """One position: SGLang's ``(logprob, id, text)`` of the token, its top list and its explicit
    id list -> (TokenLogprob, the token's text). SGLang reports no vocabulary rank for the token
    itself: it is the rank in the top list when there, else absent."""
    out = be.TokenLogprob()
    text = ""
    tid = None
    if token is not None:
        out.logprob = outputs.finite(token[0])
        tid = token[1]
        text = token[2] if len(token) > 2 and token[2] is not None else ""
    if top and tid is not None:
        for i, entry in enumerate(top):
            if entry[1] == tid:
                out.rank = i + 1
                break
    if sel is not None:
        if sel.mode == CandidateMode.TOP_N:
            out.candidates = _candidates(top, sel.top_n, ranked=True)
        elif sel.mode == CandidateMode.TOKEN_IDS:
            out.candidates = _candidates(by_id, None, ranked=False)
    return out, text


class SglangOutputMapper:
    """Turns the cumulative chunks of one SGLang request (output ``index`` of an OpenEngine
    request) into ``OutputDelta``s, with its own offsets into ``output_ids`` / ``text`` / logprobs.

    Stop strings: SGLang streams text that may be the start of a stop string before the match
    completes, then trims it from the final text. Unless ``include_stop_in_output``, text that may
    be a stop-string prefix is held back until the match is ruled out, so nothing is emitted and
    later retracted (token ids are not held back: SGLang keeps the stop string's tokens in
    ``output_ids``).
    """

    __slots__ = ("params", "eos_token_id", "cursor", "engine_done", "aborted", "decode",
                 "_stops", "_stop_ids", "_sel", "_want_lp")

    def __init__(self, params: be.GenerateParams, index: int, eos_token_id: int | None,
                 decode: Callable[[Sequence[int]], str] | None = None) -> None:
        self.params = params
        self.eos_token_id = eos_token_id
        self.decode = decode
        self.cursor = outputs.OutputCursor(index)
        self.engine_done = False   # SGLang ended the request (else it must be aborted)
        self.aborted: Mapping[str, Any] | None = None
        st = params.stopping
        # stop token ids SGLang does not match (it ignores them with ignore_eos): matched here
        self._stop_ids = frozenset(st.stop_token_ids) if st.stop_token_ids and st.ignore_eos else frozenset()
        self._stops = st.stop_texts if st.stop_texts and not st.include_stop_in_output else ()
        self._sel = params.logprobs.output_candidates
        self._want_lp = params.logprobs.output

    def delta(self, out: Mapping[str, Any]) -> be.OutputDelta | None:
        """The new part of one cumulative chunk; ``None`` when nothing new (or an abort: then
        ``aborted`` holds SGLang's finish reason)."""
        if self.cursor.done:
            return None
        meta = out["meta_info"]
        ids = out.get("output_ids") or ()
        text = out.get("text") or ""
        reason, stop, message, aborted = finish(meta.get("finish_reason"), self.eos_token_id,
                                                ids[-1] if ids else None)
        if meta.get("finish_reason") is not None:
            self.engine_done = True
        if aborted:
            self.cursor.done = True
            self.aborted = meta["finish_reason"]
            return None
        if reason is None and message:
            raise EngineFailure(ErrorCode.INTERNAL, message)
        if self._stop_ids:
            # as SGLang's own matching: no stop before min_tokens tokens
            for pos in range(max(self.cursor.ids, self.params.stopping.min_tokens or 0), len(ids)):
                if ids[pos] in self._stop_ids:
                    keep = pos + 1 if self.params.stopping.include_stop_in_output else pos
                    ids, text = ids[:pos + 1], self._decode(ids[:keep], text)
                    reason, stop, message = FinishReason.STOP, be.StopMatch(stop_token_id=ids[pos]), ""
                    break
        # token ids are not held back: SGLang keeps the stop string's tokens in output_ids
        return self.cursor.advance(ids, text, reason, stop, message, stops=self._stops,
                                   logprobs=(lambda a, b: self._logprobs(meta, a, b)) if self._want_lp else None)

    @property
    def done(self) -> bool:
        return self.cursor.done

    def _decode(self, ids: Sequence[int], text: str) -> str:
        if self.decode is None:
            raise EngineFailure(ErrorCode.INTERNAL, "no tokenizer to cut the text at an adapter-matched stop token")
        return self.decode(list(ids))

    def _logprobs(self, meta: Mapping[str, Any], start: int, end: int) -> tuple[list[be.TokenLogprob], list[str]]:
        tokens = meta.get("output_token_logprobs") or ()
        tops = meta.get("output_top_logprobs") or ()
        by_id = meta.get("output_token_ids_logprobs") or ()
        lps, names = [], []
        for i in range(start, end):
            lp, name = token_logprob(tokens[i] if i < len(tokens) else None, tops[i] if i < len(tops) else None,
                                     by_id[i] if i < len(by_id) else None, self._sel)
            lps.append(lp)
            names.append(name)
        return lps, names


def prompt_tokens(params: be.GenerateParams, meta: Mapping[str, Any]) -> list[be.PromptToken]:
    """PromptTokens from SGLang's ``input_token_logprobs`` (from ``logprob_start_len``; the first
    prompt token has a None logprob) and ``input_top_logprobs`` (None at the first token)."""
    sel = params.logprobs.prompt_candidates
    tokens = meta.get("input_token_logprobs") or ()
    tops = meta.get("input_top_logprobs") or ()
    start = params.logprobs.prompt_start or 0
    if start > 0:  # request_kwargs asked one position earlier: SGLang leaves its first one unscored
        tokens, tops = tokens[1:], tops[1:]
    out = []
    for i, entry in enumerate(tokens):
        top = tops[i] if i < len(tops) else None
        first = start + i == 0
        lp, text = token_logprob(entry, None if first else top, None, None if first else sel)
        if first:
            lp.logprob, lp.rank = None, None
        out.append(be.PromptToken(int(entry[1]), text, lp))
    return out

