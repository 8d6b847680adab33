"""What every check gets: the channel, the discovered identity and model, and request helpers."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
from dataclasses import dataclass, field

import grpc

from conformance.registry import CheckFailed, Skip, expect
from openengine_adapters.security.channel import open_channel
from openengine_adapters.v1 import (
    engine_pb2,
    error_pb2,
    generation_pb2,
    model_pb2,
    observability_pb2,
    openengine_pb2_grpc,
)
from openengine_adapters.wire.v0_1.stub import V01Stub

G = generation_pb2
PROMPT = "The quick brown fox jumps over the lazy dog"
ROLE_NAMES = {v: k.removeprefix("ENGINE_ROLE_") for k, v in engine_pb2.EngineRole.items()}


@dataclass
class Options:
    contract: str = "revision-1"  # or "v0.1.0": the surface the suite speaks (openengine_adapters.wire)
    destructive: bool = False
    expect_admission_limit: int | None = None
    long_metadata: dict[str, str] = field(default_factory=dict)
    # opt-in engine hooks for test engines (each enables checks a plain run skips; see registry.ENABLE)
    fail_metadata: dict[str, str] = field(default_factory=dict)  # makes an accepted request fail mid-stream
    serial_metadata: dict[str, str] = field(default_factory=dict)  # requests carrying it run one at a time
    lora_dir: str | None = None  # an absolute directory the target loads as a LoRA adapter
    check_timeout_s: float = 60.0
    settle_timeout_s: float = 5.0
    # transport and credentials (openengine_adapters.security.channel.open_channel)
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    token: str | None = None


@dataclass
class Baseline:
    """A greedy run of PROMPT with ignore_eos: the known output that stop checks derive from."""

    text: str
    token_ids: list[int]


@dataclass
class Stream:
    """One complete Generate stream, checked against every ordering rule."""

    responses: list
    text: dict[int, str] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    tokens: dict[int, list] = field(default_factory=dict)
    deltas: dict[int, list[str]] = field(default_factory=dict)
    finished: dict[int, object] = field(default_factory=dict)
    prompt: object | None = None
    prefill_ready: object | None = None
    error: object | None = None
    usage: object | None = None

    def only(self) -> tuple[str, list[int], object]:
        expect(self.error is None, f"stream ended with an EngineError: {self.error}")
        return self.text.get(0, ""), self.token_ids.get(0, []), self.finished.get(0)


def _n(req) -> int:
    return req.sampling.num_sequences if req.sampling.HasField("num_sequences") else 1


def _token_strings(s: Stream, req) -> None:
    """"Each prompt or output token is represented by one TokenInfo, so its ID, text, score, rank, and
    candidates cannot become positionally misaligned": a token id names one string wherever the stream
    spells it (a TokenInfo and the candidate entries that carry the same id)."""
    seen: dict[int, str] = {}

    def note(token_id: int, text: str, where: str) -> None:
        if not text:
            return
        prev = seen.setdefault(token_id, text)
        expect(prev == text, f"token id {token_id} is spelled {prev!r} and {text!r} ({where}): a TokenInfo's "
               "token must be its own id's string")

    infos = list(s.prompt.tokens) if s.prompt is not None else []
    for tokens in s.tokens.values():
        infos.extend(tokens)
    for info in infos:
        for c in info.candidates:
            note(c.token_id, c.token, "candidate")
    for info in infos:
        note(info.token_id, info.token, "TokenInfo")


def _stop_match(f, req, i: int) -> None:
    """"When FinishReason is STOP, stop_match identifies the matched caller stop token, stop string, or
    model EOS token": a caller stop it names must be one the caller asked for."""
    m = f.stop_match.WhichOneof("match")
    conds = req.stopping.conditions
    if m == "stop_text":
        texts = [c.stop_text for c in conds if c.WhichOneof("condition") == "stop_text"]
        expect(f.stop_match.stop_text in texts, f"stop_match.stop_text {f.stop_match.stop_text!r} (index {i}) is "
               f"not a requested stop string {texts}")
    elif m == "stop_token_id":
        ids = [c.stop_token_id for c in conds if c.WhichOneof("condition") == "stop_token_id"]
        expect(f.stop_match.stop_token_id in ids, f"stop_match.stop_token_id {f.stop_match.stop_token_id} (index "
               f"{i}) is not a requested stop token {ids} (a model EOS is eos_token_id)")


def check_stream(req, responses, prefill: bool = False) -> Stream:
    """Assert the Generate event-ordering rules of the spec on one complete stream."""
    n = _n(req)
    s = Stream(responses)
    expect(responses, "the stream ended without any event (an accepted request ends with a terminal event)")
    terminal = False
    sel = req.response.output_candidates.WhichOneof("selection")
    for pos, r in enumerate(responses):
        last = pos == len(responses) - 1
        kind = r.WhichOneof("event")
        expect(not terminal, f"event {kind!r} at position {pos} follows the terminal event")
        expect(r.request_id == req.request_id,
               f"response {pos} request_id {r.request_id!r} != request's {req.request_id!r}")
        expect(kind is not None, f"response {pos} carries no event")
        if r.HasField("usage"):
            expect(last, f"usage set on a non-final response ({kind} at position {pos})")
        if kind == "prompt":
            expect(req.response.return_prompt_logprobs, "PromptOutput sent although prompt logprobs were not asked")
            expect(s.prompt is None, "PromptOutput emitted more than once")
            s.prompt = r.prompt
            if r.prompt.tokens and not req.response.prompt_logprob_start:
                first = r.prompt.tokens[0]
                expect(not first.HasField("logprob") and not first.HasField("rank") and not first.candidates,
                       "the first prompt token must be bare (no logprob, rank or candidates)")
        elif kind == "token":
            t = r.token
            expect(not prefill, "a prefill stream emitted a TokenOutput")
            expect(t.HasField("output_index"), f"TokenOutput at position {pos} has no output_index")
            i = t.output_index
            expect(i < n, f"output_index {i} out of range 0..{n - 1}")
            expect(i not in s.finished, f"TokenOutput for index {i} after its GenerationFinished")
            s.text[i] = s.text.get(i, "") + t.text
            s.deltas.setdefault(i, []).append(t.text)
            s.token_ids.setdefault(i, []).extend(x.token_id for x in t.tokens)
            s.tokens.setdefault(i, []).extend(t.tokens)
            if req.response.return_output_logprobs:
                for info in t.tokens:
                    expect(info.HasField("logprob"), "output logprobs were asked but a token has no logprob")
                    if sel == "top_n":
                        expect(len(info.candidates) == req.response.output_candidates.top_n,
                               f"{len(info.candidates)} candidates, top_n asked "
                               f"{req.response.output_candidates.top_n}")
                    elif sel == "token_ids":
                        got = [c.token_id for c in info.candidates]
                        expect(got == list(req.response.output_candidates.token_ids.ids),
                               f"candidate ids {got} != asked {list(req.response.output_candidates.token_ids.ids)}")
            else:
                for info in t.tokens:
                    expect(not info.HasField("logprob") and not info.candidates,
                           "output logprobs/candidates returned although not asked")
        elif kind == "finished":
            f = r.finished
            expect(not prefill, "a prefill stream emitted GenerationFinished")
            expect(f.HasField("output_index"), f"GenerationFinished at position {pos} has no output_index")
            i = f.output_index
            expect(i < n, f"finish output_index {i} out of range 0..{n - 1}")
            expect(i not in s.finished, f"a second GenerationFinished for index {i}")
            expect(f.reason != G.FINISH_REASON_UNSPECIFIED, f"finish reason UNSPECIFIED for index {i}")
            if f.reason == G.FINISH_REASON_STOP:
                expect(f.stop_match.WhichOneof("match") is not None, f"reason STOP without stop_match (index {i})")
                _stop_match(f, req, i)
            s.finished[i] = f
            if len(s.finished) == n:
                terminal = True
                expect(r.HasField("usage"), "the last GenerationFinished carries no usage")
        elif kind == "prefill_ready":
            expect(prefill, "PrefillReady on a non-prefill stream")
            s.prefill_ready = r.prefill_ready
            terminal = True
            expect(r.HasField("usage"), "PrefillReady carries no usage")
        elif kind == "error":
            s.error = r.error
            terminal = True
            expect(r.HasField("usage"), "the terminal EngineError carries no usage")
            expect(r.error.code != 0, "EngineError.code is UNSPECIFIED")
            if not r.error.retryable:
                expect(not r.error.HasField("retry_after_ms"), "retry_after_ms on a non-retryable error")
    expect(terminal, "the stream ended without its terminal event "
           f"({len(s.finished)} of {n} outputs finished, no EngineError)")
    s.usage = u = responses[-1].usage
    expect(u.total_tokens == u.prompt_tokens + u.completion_tokens,
           f"usage.total_tokens {u.total_tokens} != prompt {u.prompt_tokens} + completion {u.completion_tokens}")
    streamed = sum(len(v) for v in s.token_ids.values())
    expect(u.completion_tokens == streamed,
           f"usage.completion_tokens {u.completion_tokens} != {streamed} tokens streamed")
    if u.HasField("cached_prompt_tokens"):
        expect(u.cached_prompt_tokens <= u.prompt_tokens, "cached_prompt_tokens exceeds prompt_tokens")
    if u.HasField("reasoning_tokens"):
        expect(u.reasoning_tokens <= u.completion_tokens, "reasoning_tokens exceeds completion_tokens")
    for i, deltas in s.deltas.items():
        nonempty = [d for d in deltas if d]
        if len(nonempty) >= 3 and all(nonempty[k].startswith(nonempty[k - 1]) and
                                      len(nonempty[k]) > len(nonempty[k - 1]) for k in range(1, len(nonempty))):
            raise CheckFailed(f"TokenOutput.text looks cumulative for index {i}: {nonempty[:4]!r}")
    _token_strings(s, req)
    return s


class Ctx:
    """Shared state of one suite run against one target."""

    def __init__(self, target: str, model: str | None, options: Options) -> None:
        self.target = target
        self.requested_model = model
        self.options = options
        self.channel: grpc.aio.Channel | None = None
        self.stub: openengine_pb2_grpc.OpenEngineStub | None = None
        self.engine_info: engine_pb2.EngineInfo | None = None
        self.model_info: model_pb2.ModelInfo | None = None
        self.model = model or ""
        self.model_info_error: str | None = None
        self._ids = itertools.count(1)
        self._run = os.urandom(3).hex()
        self._baseline: Baseline | None = None
        self._seed_supported: bool | None = None

    async def open(self) -> None:
        o = self.options
        self.channel = open_channel(self.target, tls=o.tls, ca_file=o.tls_ca_file, cert_file=o.tls_cert_file,
                                    key_file=o.tls_key_file, token=o.token)
        # v0.1.0: the same revision-1-typed calls on Inference + Control (RPCs it lacks: NotOnSurface)
        self.stub = (V01Stub(self.channel) if self.options.contract == "v0.1.0"
                     else openengine_pb2_grpc.OpenEngineStub(self.channel))
        self.engine_info = await self.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=30)
        if not self.model:
            self.model = self.engine_info.supported_models[0] if self.engine_info.supported_models else ""
        try:
            self.model_info = await self.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=self.model),
                                                           timeout=30)
        except grpc.aio.AioRpcError as exc:
            self.model_info_error = f"GetModelInfo({self.model!r}) failed: {exc.code().name} {exc.details()}"

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()

    # discovery helpers -------------------------------------------------------------
    @property
    def role(self) -> int:
        return self.engine_info.role

    @property
    def role_name(self) -> str:
        return ROLE_NAMES.get(self.role, str(self.role))

    def mi(self) -> model_pb2.ModelInfo:
        if self.model_info is None:
            raise CheckFailed(self.model_info_error or "no model info")
        return self.model_info

    def gen_caps(self) -> model_pb2.GenerationCapabilities:
        return self.mi().generation

    @staticmethod
    def reported(msg, name: str, what: str) -> None:
        """Called when the target refused an option whose capability ``msg.name`` is unreported:
        "Discovery response scalars use proto3 optional presence. An absent value means the engine
        cannot report the value" -- an engine that enforces the capability knows it, so it reports an
        explicit false rather than leaving it out."""
        expect(msg.HasField(name), f"{what} is refused, yet {name} is absent (unreported): a capability the "
               "server enforces is known, so it must be reported as an explicit false")

    def require_generation(self) -> None:
        """Skip unless the role runs normal (aggregated) generation and the model takes text or ids."""
        if self.role == engine_pb2.ENGINE_ROLE_PREFILL:
            raise Skip("role PREFILL does not perform normal generation")
        if self.role == engine_pb2.ENGINE_ROLE_DECODE:
            raise Skip("role DECODE needs a KV session from a prefill engine")
        mi = self.mi()
        if not (mi.supports_text_input or mi.supports_token_ids_input):
            raise Skip("the model advertises neither text nor token-id input")
        if not self.generates():
            raise Skip("the model advertises no generation capabilities (a pooling/task-only model)")

    def generates(self) -> bool:
        """A model generates unless it omits GenerationCapabilities while advertising non-generative tasks
        (v0.1.0 has no tasks in ModelInfo: there a model without GenerationCapabilities does not generate)."""
        mi = self.mi()
        if self.options.contract == "v0.1.0":
            return mi.HasField("generation")
        return mi.HasField("generation") or not mi.HasField("tasks")

    def rid(self, tag: str) -> str:
        return f"conf-{self._run}-{tag}-{next(self._ids)}"

    def request(self, tag: str, max_tokens: int | None = 8, **kw) -> generation_pb2.GenerateRequest:
        """A GenerateRequest for this model; the prompt is text, or token ids if text is not supported."""
        req = G.GenerateRequest(request_id=self.rid(tag), model=self.model, **kw)
        if req.WhichOneof("input") is None:
            if self.mi().supports_text_input or not self.mi().supports_token_ids_input:
                req.prompt = PROMPT
            else:
                req.token_ids.ids.extend(self.prompt_ids())
        prefill = self.engine_info is not None and self.role == engine_pb2.ENGINE_ROLE_PREFILL
        if max_tokens is not None and not prefill and not req.stopping.HasField("max_tokens"):
            req.stopping.max_tokens = max_tokens
        return req

    def can_send_traffic(self) -> bool:
        """Whether plain prompt requests can be sent (to provoke events): any role but DECODE."""
        mi = self.model_info
        return (self.role != engine_pb2.ENGINE_ROLE_DECODE and mi is not None and self.generates()
                and (mi.supports_text_input or mi.supports_token_ids_input))

    def prompt_ids(self) -> list[int]:
        return [1, 2, 3, 4, 5, 6, 7, 8]

    def long_request(self, tag: str, **kw) -> generation_pb2.GenerateRequest:
        """A request that keeps running for a while (many tokens, EOS ignored)."""
        mi = self.mi()
        budget = 256
        if mi.HasField("max_output_tokens"):
            budget = min(budget, mi.max_output_tokens)
        if mi.HasField("max_context_length"):
            budget = min(budget, max(1, mi.max_context_length - 64))
        req = self.request(tag, max_tokens=budget, **kw)
        req.stopping.ignore_eos = True
        for k, v in self.options.long_metadata.items():
            req.metadata[k] = v
        return req

    # calls -------------------------------------------------------------------------
    async def generate(self, req, timeout: float | None = None) -> list:
        return [r async for r in self.stub.Generate(req, timeout=timeout or self.options.check_timeout_s)]

    async def run(self, req, prefill: bool = False) -> Stream:
        """Generate, expecting acceptance, and check the stream contract."""
        try:
            responses = await self.generate(req)
        except grpc.aio.AioRpcError as exc:
            raise CheckFailed(f"Generate was rejected: {exc.code().name}: {exc.details()}") from None
        return check_stream(req, responses, prefill=prefill)

    async def rejected(self, call, *codes: grpc.StatusCode, what: str = "the request") -> grpc.aio.AioRpcError:
        """Await a unary call or drain a stream; it must fail with one of ``codes`` before any event."""
        events = []
        try:
            if hasattr(call, "__aiter__"):
                async for r in call:
                    events.append(r)
            else:
                events.append(await call)
        except grpc.aio.AioRpcError as exc:
            names = "/".join(c.name for c in codes)
            expect(exc.code() in codes, f"{what}: expected {names}, got {exc.code().name}: {exc.details()}")
            stream_events = [e for e in events if e is not None]
            expect(not stream_events, f"{what}: {len(stream_events)} event(s) sent before the rejection")
            check_error_trailer(exc, what)
            return exc
        names = "/".join(c.name for c in codes)
        summary = events[-1] if len(events) == 1 else f"{len(events)} events"
        raise CheckFailed(f"{what}: expected {names}, the call succeeded ({_short(summary)})")

    async def gen_rejected(self, req, *codes, what: str | None = None):
        codes = codes or (grpc.StatusCode.INVALID_ARGUMENT,)
        return await self.rejected(self.stub.Generate(req, timeout=self.options.check_timeout_s), *codes,
                                   what=what or "Generate")

    async def baseline(self) -> Baseline:
        """Greedy PROMPT with ignore_eos and 16 tokens (cached): stop strings/ids derive from it."""
        if self._baseline is None:
            req = self.request("baseline", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
            req.stopping.ignore_eos = True
            text, ids, fin = (await self.run(req)).only()
            expect(fin.reason == G.FINISH_REASON_LENGTH, "greedy baseline with ignore_eos did not end with LENGTH")
            self._baseline = Baseline(text, ids)
        return self._baseline

    async def seed_supported(self) -> bool:
        """Whether the target takes ``sampling.seed``. The schema has no seed capability, so a target
        that cannot honour a seed must refuse it before acceptance with INVALID_ARGUMENT naming the
        field (SGLang without deterministic inference); probed once, and that refusal is checked."""
        if self._seed_supported is None:
            req = self.request("seedprobe", max_tokens=1, sampling=G.SamplingParams(temperature=1.0, seed=1))
            try:
                await self.generate(req)
                self._seed_supported = True
            except grpc.aio.AioRpcError as exc:
                expect(exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "seed" in (exc.details() or ""),
                       f"a seeded request failed with {exc.code().name}: {exc.details()} (an unsupported seed "
                       "must be INVALID_ARGUMENT naming sampling.seed)")
                self._seed_supported = False
        return self._seed_supported

    async def seed(self, value: int) -> dict:
        """``{"seed": value}`` when the target takes seeds, else ``{}`` (for checks that only use a seed
        to make sampling reproducible)."""
        return {"seed": value} if await self.seed_supported() else {}

    async def running_requests(self) -> int | None:
        load = await self.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=10)
        return load.running_requests if load.HasField("running_requests") else None

    async def wait_idle(self, what: str) -> None:
        """When the target reports running_requests, it must return to 0 within the settle timeout."""
        deadline = asyncio.get_running_loop().time() + self.options.settle_timeout_s
        while True:
            n = await self.running_requests()
            if n is None or n == 0:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise CheckFailed(f"GetLoad.running_requests is still {n} "
                                  f"{self.options.settle_timeout_s:g}s after {what}")
            await asyncio.sleep(0.1)


ERROR_TRAILER = "openengine-error-bin"
C = grpc.StatusCode
E = error_pb2.ErrorCode
# the EngineError codes that name the same failure as a status (the spec's ErrorCode beside gRPC's)
TRAILER_CODES = {
    C.INVALID_ARGUMENT: {E.ERROR_CODE_INVALID_ARGUMENT, E.ERROR_CODE_UNSUPPORTED_FEATURE},
    C.NOT_FOUND: {E.ERROR_CODE_MODEL_NOT_FOUND, E.ERROR_CODE_REQUEST_NOT_FOUND, E.ERROR_CODE_KV_SESSION_NOT_FOUND},
    C.RESOURCE_EXHAUSTED: {E.ERROR_CODE_OVERLOADED},
    C.FAILED_PRECONDITION: {E.ERROR_CODE_ROLE_MISMATCH, E.ERROR_CODE_UNSUPPORTED_FEATURE,
                            E.ERROR_CODE_INVALID_ARGUMENT},
}


def error_trailer(exc: grpc.aio.AioRpcError) -> error_pb2.EngineError | None:
    values = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
    if not values:
        return None
    expect(len(values) == 1, f"{len(values)} {ERROR_TRAILER} trailers")
    try:
        return error_pb2.EngineError.FromString(values[0])
    except Exception as e:  # noqa: BLE001 - any decode failure is the violation
        raise CheckFailed(f"the {ERROR_TRAILER} trailer is not a serialized EngineError ({e})") from None


def check_error_trailer(exc: grpc.aio.AioRpcError, what: str) -> None:
    """A rejection's machine-readable twin, where the server sends one (``openengine-error-bin``): an
    EngineError whose code is not UNSPECIFIED and names the same failure as the status, with
    retry_after_ms only on a retryable error."""
    err = error_trailer(exc)
    if err is None:
        return
    expect(err.code != E.ERROR_CODE_UNSPECIFIED, f"{what}: the {ERROR_TRAILER} EngineError has code UNSPECIFIED")
    allowed = TRAILER_CODES.get(exc.code())
    expect(allowed is None or err.code in allowed,
           f"{what}: status {exc.code().name} but the {ERROR_TRAILER} EngineError code is "
           f"{E.Name(err.code) if err.code in E.values() else err.code}")
    expect(err.retryable or not err.HasField("retry_after_ms"),
           f"{what}: retry_after_ms on a non-retryable {ERROR_TRAILER} EngineError")


def _short(obj) -> str:
    text = str(obj).replace("\n", " ")
    return text if len(text) < 160 else text[:157] + "..."


def finite(values) -> bool:
    return all(math.isfinite(v) for v in values)


def json_prefix_ok(text: str) -> bool:
    """True if ``text`` is a prefix of some JSON object document."""
    t = text.lstrip()
    if not t:
        return True
    if not t.startswith("{"):
        return False
    fills = ["", "0", '"', '":0', ":0", '"":0', "ue", "rue", "e", "lse", "alse", "ull", "ll", "l", "0}"]
    for fill in fills:
        cand = t + fill
        closer = _closer(cand)
        if closer is None:
            continue
        try:
            json.loads(cand + closer)
            return True
        except ValueError:
            continue
    return False


def _closer(text: str) -> str | None:
    stack, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
    return ('"' if in_str else "") + "".join(reversed(stack))
