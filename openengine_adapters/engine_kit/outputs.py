"""Engine outputs -> OutputDeltas: finish stamping, logprob values, cumulative-to-delta slicing.

vLLM streams deltas; SGLang and TensorRT-LLM stream CUMULATIVE outputs (every update carries the
whole token ids / text so far). ``OutputCursor`` keeps one output's offsets into them and cuts the
next delta, holding back text that may be the start of a stop string (and, for engines that
stream a stop string's tokens before the match completes, the last tokens) until the match is
ruled out, so nothing is emitted that the engine later retracts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.stop_text import stop_prefix_len
from openengine_adapters.types import FinishReason


def finite(x: Any) -> float | None:
    """A logprob as the contract carries it: absent when the engine reports -inf / nan / none."""
    return float(x) if x is not None and math.isfinite(x) else None


def top_candidates(position: Mapping[int, Any], top_n: int | None, *, text: Callable[[Any], str] = lambda e: "",
                   finite_only: bool = False) -> list[be.Candidate]:
    """The ranked candidates of one position given as ``{token_id: entry with .logprob, .rank}``
    (vLLM's and TensorRT-LLM's shape): by rank then id, those ranked within ``top_n`` (all ranked
    ones when None), dropping entries with no rank and, with ``finite_only``, -inf fillers."""
    ranked = sorted(((e.rank, tid, e) for tid, e in position.items() if e.rank is not None),
                    key=lambda t: (t[0], t[1]))
    return [be.Candidate(tid, e.logprob, text(e), rank) for rank, tid, e in ranked
            if (top_n is None or rank <= top_n) and (not finite_only or math.isfinite(e.logprob))]


def finish(reason: str | None, matched: int | str | None, token_ids: Sequence[int], eos_token_id: int | None,
           *, eos_in_output: bool = False,
           engine_reasons: Mapping[str, tuple[FinishReason, str]] | None = None,
           ) -> tuple[FinishReason | None, be.StopMatch | None, str]:
    """An engine's finish reason -> (reason, stop match, message); ``message`` alone: a failure.

    ``"stop"`` with ``matched`` the stop string (str), the stop token id (int), or None for the
    model's end token: its id is the last output token where the engine keeps it in the output
    (``eos_in_output``), else the tokenizer's. ``engine_reasons``: the engine's other endings.
    """
    if reason is None or reason == "not_finished":
        return None, None, ""
    if reason == "stop":
        if isinstance(matched, str):
            return FinishReason.STOP, be.StopMatch(stop_text=matched), ""
        if isinstance(matched, int) and not isinstance(matched, bool):
            return FinishReason.STOP, be.StopMatch(stop_token_id=matched), ""
        last = token_ids[-1] if token_ids else None
        eos = (last if last is not None else eos_token_id) if eos_in_output else \
            (eos_token_id if eos_token_id is not None else last)
        return FinishReason.STOP, be.StopMatch(eos_token_id=eos if eos is not None else 0), ""
    if reason == "length":
        return FinishReason.LENGTH, None, ""
    if engine_reasons and reason in engine_reasons:
        final, message = engine_reasons[reason]
        return final, None, message
    return None, None, f"engine finished with {reason!r}"


class OutputCursor:
    """One output's offsets into the engine's cumulative token ids and text."""

    __slots__ = ("index", "ids", "text", "done")

    def __init__(self, index: int) -> None:
        self.index = index
        self.ids = 0       # tokens (and logprob positions) already emitted
        self.text = 0      # characters already emitted
        self.done = False  # finished for the client

    def advance(self, ids: Sequence[int], text: str, reason: FinishReason | None, stop: be.StopMatch | None,
                message: str = "", *, stops: Sequence[str] = (), id_holdback: int = 0,
                logprobs: Callable[[int, int], tuple[list[be.TokenLogprob], list[str]]] | None = None,
                ) -> be.OutputDelta | None:
        """The delta from the last call to this cumulative state; ``None`` when nothing is new.

        ``stops``: stop strings to hold back a possible prefix of (empty when the client wants the
        stop string in the output); ``id_holdback``: tokens held back with it while unfinished.
        ``logprobs(start, end)``: the logprobs and token texts of positions [start, end).
        """
        if reason is None and stops:
            id_end = max(self.ids, len(ids) - id_holdback)
            text_end = max(self.text, len(text) - stop_prefix_len(text, stops))
        else:
            id_end, text_end = len(ids), len(text)
        new_ids = list(ids[self.ids:id_end])  # copied now: an engine may extend its list later
        new_text = text[self.text:text_end] if text_end > self.text else ""
        delta = be.OutputDelta(index=self.index, token_ids=new_ids, text=new_text)
        if logprobs is not None and new_ids:
            delta.logprobs, delta.tokens = logprobs(self.ids, id_end)
        self.ids = max(self.ids, id_end)
        self.text = max(self.text, text_end)
        if reason is not None:
            self.done = True
            delta.finish_reason, delta.stop, delta.finish_message = reason, stop, message
        elif not new_ids and not new_text:
            return None
        return delta
