"""The Generate stream contract as a reusable checker for any adapter's tests.

``check_generate_stream(request, responses)`` asserts every ordering rule of the spec on one
complete stream and returns a summary (text and tokens per index, finishes, usage, error) so a
test can go on to assert values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openengine_adapters.v1 import generation_pb2


@dataclass
class StreamSummary:
    text: dict[int, str] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    tokens: dict[int, list[generation_pb2.TokenInfo]] = field(default_factory=dict)
    finished: dict[int, generation_pb2.GenerationFinished] = field(default_factory=dict)
    prompt: generation_pb2.PromptOutput | None = None
    prefill_ready: generation_pb2.PrefillReady | None = None
    error: object | None = None
    usage: generation_pb2.Usage | None = None
    messages: int = 0


def check_generate_stream(request: generation_pb2.GenerateRequest,
                          responses: list[generation_pb2.GenerateResponse],
                          prefill: bool = False) -> StreamSummary:
    n = request.sampling.num_sequences if request.sampling.HasField("num_sequences") else 1
    want_prompt = request.response.return_prompt_logprobs
    candidates = request.response.output_candidates
    s = StreamSummary(messages=len(responses))
    assert responses, "a stream has at least its terminal event"
    terminal_seen = False
    for pos, r in enumerate(responses):
        last = pos == len(responses) - 1
        assert not terminal_seen, f"event after the terminal event at position {pos}"
        if request.request_id:
            assert r.request_id == request.request_id, "every response echoes the request_id"
        kind = r.WhichOneof("event")
        assert kind is not None, "every response carries an event"
        if r.HasField("usage"):
            assert last, f"usage on a non-final response ({kind} at {pos})"
        if kind == "prompt":
            assert want_prompt, "PromptOutput sent although prompt logprobs were not requested"
            assert s.prompt is None, "PromptOutput emitted more than once"
            s.prompt = r.prompt
            start = request.response.prompt_logprob_start
            if r.prompt.tokens and not start:
                first = r.prompt.tokens[0]
                assert not first.HasField("logprob") and not first.HasField("rank") \
                    and not first.candidates, "first prompt token must be bare"
        elif kind == "token":
            t = r.token
            assert t.HasField("output_index"), "TokenOutput.output_index must be present"
            i = t.output_index
            assert 0 <= i < n, f"output_index {i} out of range"
            assert i not in s.finished, f"TokenOutput for finished index {i}"
            assert not prefill, "a prefill stream emits no TokenOutput"
            s.text[i] = s.text.get(i, "") + t.text
            s.token_ids.setdefault(i, []).extend(x.token_id for x in t.tokens)
            s.tokens.setdefault(i, []).extend(t.tokens)
            if request.response.return_output_logprobs:
                for info in t.tokens:
                    assert info.HasField("logprob"), "output logprob requested but missing"
                    if candidates.WhichOneof("selection") == "top_n":
                        assert len(info.candidates) == candidates.top_n
                    elif candidates.WhichOneof("selection") == "token_ids":
                        assert [c.token_id for c in info.candidates] == list(candidates.token_ids.ids)
        elif kind == "finished":
            f = r.finished
            assert f.HasField("output_index"), "GenerationFinished.output_index must be present"
            i = f.output_index
            assert 0 <= i < n and i not in s.finished, f"duplicate or bad finish for index {i}"
            assert f.reason != generation_pb2.FINISH_REASON_UNSPECIFIED, "finish reason unset"
            if f.reason == generation_pb2.FINISH_REASON_STOP:
                assert f.stop_match.WhichOneof("match") is not None, "STOP without stop_match"
            s.finished[i] = f
            if len(s.finished) == n:
                terminal_seen = True
                assert r.HasField("usage"), "the last GenerationFinished carries usage"
        elif kind == "prefill_ready":
            assert prefill, "PrefillReady on a non-prefill stream"
            s.prefill_ready = r.prefill_ready
            terminal_seen = True
            assert r.HasField("usage"), "PrefillReady carries usage"
        elif kind == "error":
            s.error = r.error
            terminal_seen = True
            assert r.HasField("usage"), "the terminal EngineError carries usage"
            e = r.error
            assert e.code != 0, "EngineError.code must be set"
            if not e.retryable:
                assert not e.HasField("retry_after_ms"), "retry_after_ms only for retryable errors"
    assert terminal_seen, "stream ended without a terminal event"
    s.usage = responses[-1].usage
    u = s.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens == sum(len(v) for v in s.token_ids.values()), \
        "usage.completion_tokens equals the tokens streamed"
    if u.HasField("cached_prompt_tokens"):
        assert u.cached_prompt_tokens <= u.prompt_tokens
    if u.HasField("reasoning_tokens"):
        assert u.reasoning_tokens <= u.completion_tokens
    return s
