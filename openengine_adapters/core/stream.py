"""Generate stream assembly: backend chunks -> GenerateResponse events in contract order.

Enforces, whatever the backend does: PromptOutput at most once and only when asked (first prompt
token bare); TokenOutput deltas with output_index always present; exactly one GenerationFinished
per index and nothing for an index after it; Usage cumulative over all outputs and only on the
final response; PrefillReady terminal for a prefill; one terminal EngineError and nothing after.
A backend that breaks these rules ends the stream with an INTERNAL EngineError.

This is the per-token path: one TokenOutput per output per engine step, no logging, no copies of
token lists beyond the message itself.
"""

from __future__ import annotations

from google.protobuf import json_format

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.messages.kv import kv_session_ref
from openengine_adapters.types import ErrorCode, FinishReason
from openengine_adapters.v1 import error_pb2, generation_pb2

GenerateResponse = generation_pb2.GenerateResponse


def engine_error(failure: EngineFailure) -> error_pb2.EngineError:
    err = error_pb2.EngineError(code=int(failure.code), message=failure.message,
                                retryable=failure.retryable)
    if failure.retryable and failure.retry_after_ms is not None:
        err.retry_after_ms = failure.retry_after_ms
    if failure.details:
        json_format.ParseDict(failure.details, err.details)
    return err


def _fill_token_info(info: generation_pb2.TokenInfo, token_id: int, token: str,
                     lp: be.TokenLogprob | None) -> None:
    """Fill a TokenInfo in place (added to its parent first: no message copies)."""
    info.token_id = token_id
    if token:
        info.token = token
    if lp is not None:
        if lp.logprob is not None:
            info.logprob = lp.logprob
        if lp.rank is not None:
            info.rank = lp.rank
        for c in lp.candidates:
            cand = info.candidates.add(token_id=c.token_id, logprob=c.logprob, token=c.token)
            if c.rank is not None:
                cand.rank = c.rank


class GenerateStream:
    """Assembles one request's responses. Not thread-safe; one per Generate call."""

    __slots__ = ("request_id", "num_outputs", "prefill", "want_prompt", "prompt_start", "bare_first_prompt_token",
                 "_finished", "_remaining", "_completion", "_prompt_tokens", "_cached",
                 "_reasoning", "_prompt_sent", "done")

    def __init__(self, params: be.GenerateParams, prefill: bool) -> None:
        self.request_id = params.request_id
        self.num_outputs = params.sampling.num_sequences
        self.prefill = prefill
        self.want_prompt = params.logprobs.prompt
        self.prompt_start = params.logprobs.prompt_start
        self.bare_first_prompt_token = not params.logprobs.prompt_start
        self._finished = [False] * self.num_outputs
        self._remaining = self.num_outputs
        self._completion = 0
        self._prompt_tokens = len(params.token_ids) if params.token_ids is not None else 0
        self._cached: int | None = None
        self._reasoning: int | None = None
        self._prompt_sent = False
        self.done = False

    # -- usage ----------------------------------------------------------------
    def usage(self) -> generation_pb2.Usage:
        u = generation_pb2.Usage(
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion,
            total_tokens=self._prompt_tokens + self._completion,
        )
        if self._cached is not None:
            u.cached_prompt_tokens = min(self._cached, self._prompt_tokens)
        if self._reasoning is not None:
            u.reasoning_tokens = min(self._reasoning, self._completion)
        return u

    # -- events ---------------------------------------------------------------
    def feed(self, chunk: be.GenerationChunk) -> list[GenerateResponse]:
        """Responses for one backend chunk (possibly none)."""
        if self.done:
            raise EngineFailure(ErrorCode.INTERNAL, "engine produced output after the request ended")
        if chunk.prompt_tokens is not None:
            self._prompt_tokens = chunk.prompt_tokens
        if chunk.cached_prompt_tokens is not None:
            self._cached = chunk.cached_prompt_tokens
        if chunk.reasoning_tokens is not None:
            self._reasoning = chunk.reasoning_tokens
        out: list[GenerateResponse] = []
        if chunk.prompt is not None and self.want_prompt and not self._prompt_sent:
            if not chunk.prompt:  # a text prompt no longer than prompt_logprob_start: no PromptOutput to send
                raise EngineFailure(ErrorCode.INVALID_ARGUMENT, (
                    f"response.prompt_logprob_start: {self.prompt_start} is not a prompt position (prompt has "
                    f"{self._prompt_tokens} tokens)") if self.prompt_start else "the engine reported an empty prompt")
            out.append(self._prompt_output(chunk.prompt))
        if self.prefill:
            if chunk.prefill_ready is not None:
                self.done = True
                out.append(GenerateResponse(
                    request_id=self.request_id,
                    prefill_ready=generation_pb2.PrefillReady(
                        kv_session=kv_session_ref(chunk.prefill_ready)),
                    usage=self.usage(),
                ))
            return out
        completion = self._completion
        try:
            for delta in chunk.outputs:
                self._output(delta, out)
        except EngineFailure:
            self._completion = completion  # usage counts only what was streamed
            raise
        return out

    def _prompt_output(self, tokens: list[be.PromptToken]) -> GenerateResponse:
        self._prompt_sent = True
        resp = GenerateResponse(request_id=self.request_id)
        infos = resp.prompt.tokens
        for i, t in enumerate(tokens):
            lp = None if (i == 0 and self.bare_first_prompt_token) else t.logprob
            _fill_token_info(infos.add(), t.token_id, t.token, lp)
        return resp

    def _output(self, d: be.OutputDelta, out: list[GenerateResponse]) -> None:
        index = d.index
        if not 0 <= index < self.num_outputs:
            raise EngineFailure(ErrorCode.INTERNAL, f"engine produced output_index {index} "
                                f"outside 0..{self.num_outputs - 1}")
        if self._finished[index]:
            raise EngineFailure(ErrorCode.INTERNAL,
                                f"engine produced output for finished output_index {index}")
        ids = d.token_ids
        if ids or d.text:
            resp = GenerateResponse(request_id=self.request_id)
            tok = resp.token  # built in place: no copy of the per-token messages
            tok.output_index = index
            tok.text = d.text
            infos = tok.tokens
            if d.logprobs is None and d.tokens is None:
                for t in ids:
                    infos.add(token_id=t)
            else:
                names = d.tokens or ("",) * len(ids)
                lps = d.logprobs or (None,) * len(ids)
                if len(names) != len(ids) or len(lps) != len(ids):
                    raise EngineFailure(ErrorCode.INTERNAL,
                                        "engine token strings/logprobs are not aligned with token ids")
                for t, name, lp in zip(ids, names, lps, strict=True):
                    _fill_token_info(infos.add(), t, name, lp)
            self._completion += len(ids)
            out.append(resp)
        if d.finish_reason is not None:
            out.append(self._finish(index, d.finish_reason, d.stop, d.finish_message))

    def _finish(self, index: int, reason: FinishReason, stop: be.StopMatch | None,
                message: str = "") -> GenerateResponse:
        self._finished[index] = True
        self._remaining -= 1
        resp = GenerateResponse(request_id=self.request_id)
        fin = resp.finished
        fin.output_index = index
        fin.reason = int(reason)
        if message:
            fin.message = message
        if reason == FinishReason.STOP:
            if stop is None:
                raise EngineFailure(ErrorCode.INTERNAL, "engine finished with STOP but no stop match")
            if stop.stop_text is not None:
                fin.stop_match.stop_text = stop.stop_text
            elif stop.stop_token_id is not None:
                fin.stop_match.stop_token_id = stop.stop_token_id
            elif stop.eos_token_id is not None:
                fin.stop_match.eos_token_id = stop.eos_token_id
            else:
                raise EngineFailure(ErrorCode.INTERNAL, "engine finished with an empty stop match")
        if self._remaining == 0:
            self.done = True
            resp.usage.CopyFrom(self.usage())
        return resp

    # -- endings --------------------------------------------------------------
    def cancel_remaining(self, message: str) -> list[GenerateResponse]:
        """CANCELLED finishes for every unfinished output (Abort): the last carries usage."""
        if self.done:
            return []
        if self.prefill:
            return [self.error(EngineFailure(ErrorCode.CANCELLED, message))]
        return [self._finish(i, FinishReason.CANCELLED, None, message)
                for i in range(self.num_outputs) if not self._finished[i]]

    def error(self, failure: EngineFailure) -> GenerateResponse:
        """The terminal EngineError, with usage so far."""
        self.done = True
        return GenerateResponse(request_id=self.request_id, error=engine_error(failure),
                                usage=self.usage())

    def incomplete(self) -> EngineFailure:
        what = "before PrefillReady" if self.prefill else (
            f"with {self._remaining} of {self.num_outputs} outputs unfinished")
        return EngineFailure(ErrorCode.INTERNAL, f"engine stream ended {what}")
