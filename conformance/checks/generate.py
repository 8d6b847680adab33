"""Generate: the stream contract, stopping, logprobs, options and malformed input."""

from __future__ import annotations

import asyncio

import grpc

from conformance.context import G, error_trailer
from conformance.registry import CheckFailed, Skip, check, expect
from openengine_adapters.v1 import engine_pb2, error_pb2, input_pb2, kv_pb2, model_pb2

C = grpc.StatusCode
MODES = model_pb2.CandidateTokenSelectionMode


@check("generate.stream_contract", "role AGGREGATED")
async def stream_contract(ctx):
    """Greedy request: request_id echoed, output_index present (incl. 0), one finish, usage only on the
    final message with total = prompt + completion = streamed tokens, deltas not cumulative. Every stream
    the suite reads is held to the same rules (context.check_stream), including "When FinishReason is STOP,
    stop_match identifies the matched caller stop token, stop string, or model EOS token" (a caller stop
    it names was requested) and one string per token id across TokenInfo and candidates."""
    ctx.require_generation()
    req = ctx.request("basic", max_tokens=8, sampling=G.SamplingParams(temperature=0.0))
    s = await ctx.run(req)
    text, ids, fin = s.only()
    expect(fin is not None and len(s.finished) == 1, "expected exactly one GenerationFinished (index 0)")
    expect(1 <= len(ids) <= 8, f"{len(ids)} tokens for max_tokens 8")
    expect(s.usage.prompt_tokens > 0, "usage.prompt_tokens is 0 for a non-empty prompt")
    expect(s.prompt is None, "PromptOutput without prompt logprobs")


@check("generate.prefill_ready", "role PREFILL")
async def prefill_ready(ctx):
    """A PREFILL engine ends a prompt-only request with PrefillReady (usage attached) and no tokens."""
    if ctx.role != engine_pb2.ENGINE_ROLE_PREFILL:
        raise Skip(f"role {ctx.role_name} is not PREFILL")
    req = ctx.request("prefill", max_tokens=None)
    s = await ctx.run(req, prefill=True)
    expect(s.error is None, f"prefill failed: {s.error}")
    expect(s.prefill_ready is not None and s.prefill_ready.kv_session.session_id,
           "PrefillReady carries no kv_session.session_id")
    for ep in s.prefill_ready.kv_session.endpoints:
        expect(ep.host not in ("", "*", "0.0.0.0", "::", "[::]"), f"kv_session endpoint host {ep.host!r}")


@check("generate.prefill_card_matches_role", "role PREFILL")
async def prefill_card_matches_role(ctx):
    """A PREFILL engine's ModelInfo does not advertise what its role refuses (more than one sequence or
    output token; on revision 1 also output logprobs and guided decoding), and it refuses those requests
    before acceptance. On v0.1.0 a prefill takes the decode leg's output logprobs and guided decoding, as
    Dynamo's sidecars send them (no v0.1.0 text forbids them): where advertised they end in PrefillReady."""
    if ctx.role != engine_pb2.ENGINE_ROLE_PREFILL:
        raise Skip(f"role {ctx.role_name} is not PREFILL")
    mi = ctx.mi()
    gen = mi.generation
    v0_1 = ctx.options.contract == "v0.1.0"
    if not v0_1:
        expect(not gen.output_logprobs.supported, "a PREFILL engine advertises output logprobs")
        expect(not gen.guided_decoding.supported, "a PREFILL engine advertises guided decoding")
    expect(not gen.HasField("max_num_sequences") or gen.max_num_sequences <= 1,
           f"a PREFILL engine advertises max_num_sequences {gen.max_num_sequences}")
    expect(not mi.HasField("max_output_tokens") or mi.max_output_tokens <= 1,
           f"a PREFILL engine advertises max_output_tokens {mi.max_output_tokens}")
    codes = [c for c in C if c != C.OK]
    lp = ctx.request("pf-lp", max_tokens=None)
    lp.response.return_output_logprobs = True
    guided = ctx.request("pf-guided", max_tokens=None, guided=G.GuidedDecoding(json_object=G.JsonObjectConstraint()))
    seqs = ctx.request("pf-n", max_tokens=None, sampling=G.SamplingParams(num_sequences=2))
    tokens = ctx.request("pf-tokens", max_tokens=None)
    tokens.stopping.max_tokens = 2
    refused = [(seqs, "num_sequences 2"), (tokens, "max_tokens 2")]
    for req, what, advertised in ((lp, "output logprobs", gen.output_logprobs.supported),
                                  (guided, "guided decoding", model_pb2.GUIDED_DECODING_MODE_JSON_OBJECT in
                                   gen.guided_decoding.modes and gen.guided_decoding.supported)):
        if not v0_1:
            refused.append((req, what))
        elif advertised:
            s = await ctx.run(req, prefill=True)
            expect(s.error is None and s.prefill_ready is not None,
                   f"{what} on a PREFILL engine (v0.1.0) did not end in PrefillReady: {s.error}")
    for req, what in refused:
        await ctx.gen_rejected(req, *codes, what=f"{what} on a PREFILL engine")


@check("generate.decode_requires_session", "role DECODE")
async def decode_requires_session(ctx):
    """Revision 1: a DECODE engine refuses a request without kv.session before acceptance (non-OK status).
    v0.1.0: it serves it locally (conditional disaggregation, as TensorRT-LLM's server and Dynamo's
    TensorRT-LLM sidecar use it: short prompts skip the prefill worker)."""
    if ctx.role != engine_pb2.ENGINE_ROLE_DECODE:
        raise Skip(f"role {ctx.role_name} is not DECODE")
    codes = [c for c in C if c != C.OK]
    if ctx.options.contract == "v0.1.0":
        from google.protobuf import json_format

        from openengine_adapters.v0_1 import openengine_pb2_grpc, server_pb2

        info = await openengine_pb2_grpc.ControlStub(ctx.channel).GetServerInfo(
            server_pb2.GetServerInfoRequest(), timeout=ctx.options.check_timeout_s)
        said = str(json_format.MessageToDict(info.extra).get("decode_without_kv_session", "served"))
        if said.startswith("refused"):  # an engine that cannot serve it locally says why (ServerInfo.extra)
            await ctx.gen_rejected(ctx.request("nosess"), C.FAILED_PRECONDITION,
                                   what="Generate without kv.session on a DECODE engine that says it refuses it")
            return
        s = await ctx.run(ctx.request("nosess"))
        expect(s.error is None, f"Generate without kv.session on DECODE (v0.1.0): EngineError {s.error}")
        return
    await ctx.gen_rejected(ctx.request("nosess"), *codes, what="Generate without kv.session on DECODE")


@check("generate.aggregated_refuses_kv_session", "role AGGREGATED")
async def aggregated_refuses_session(ctx):
    """"Engines must validate role/request compatibility before acceptance and return a non-OK gRPC status
    on mismatch": an AGGREGATED engine refuses kv.session as a role mismatch (FAILED_PRECONDITION, or
    INVALID_ARGUMENT), not as a session it merely failed to find (NOT_FOUND would tell the caller to retry
    with another session; with the error trailer the code is ROLE_MISMATCH)."""
    ctx.require_generation()
    req = ctx.request("sess")
    req.kv.session.CopyFrom(kv_pb2.KvSessionRef(session_id="conformance-no-such-session"))
    exc = await ctx.gen_rejected(req, C.FAILED_PRECONDITION, C.INVALID_ARGUMENT,
                                 what="Generate with kv.session on AGGREGATED")
    err = error_trailer(exc)
    if err is not None and exc.code() == C.FAILED_PRECONDITION:
        expect(err.code == error_pb2.ERROR_CODE_ROLE_MISMATCH,
               f"role mismatch refused with EngineError code {error_pb2.ErrorCode.Name(err.code)}")


@check("generate.refused_on_task_only_model", "a model without generation capabilities")
async def refused_on_task_only_model(ctx):
    """Generate on a model that advertises tasks but no generation is refused before acceptance."""
    if ctx.generates():
        raise Skip("the model advertises generation")
    req = ctx.request("nogen")
    await ctx.gen_rejected(req, C.FAILED_PRECONDITION, C.INVALID_ARGUMENT, C.UNIMPLEMENTED,
                           what="Generate on a task-only model")


@check("generate.text_input", "advertised supports_text_input (else rejected)")
async def text_input(ctx):
    """A text prompt works when supports_text_input, else is INVALID_ARGUMENT."""
    ctx.require_generation()
    req = ctx.request("text", prompt="Hello")
    if ctx.mi().supports_text_input:
        await ctx.run(req)
    else:
        await ctx.gen_rejected(req, what="text prompt with supports_text_input false")


@check("generate.token_ids_input", "advertised supports_token_ids_input (else rejected)")
async def token_ids_input(ctx):
    """A token-id prompt works when supports_token_ids_input, else is INVALID_ARGUMENT."""
    ctx.require_generation()
    ids = (await ctx.baseline()).token_ids[:4] if ctx.mi().supports_text_input else ctx.prompt_ids()
    req = ctx.request("ids", token_ids=input_pb2.TokenIds(ids=ids or ctx.prompt_ids()))
    if ctx.mi().supports_token_ids_input:
        s = await ctx.run(req)
        expect(s.usage.prompt_tokens == len(req.token_ids.ids),
               f"usage.prompt_tokens {s.usage.prompt_tokens} != {len(req.token_ids.ids)} prompt ids")
    else:
        await ctx.gen_rejected(req, what="token-id prompt with supports_token_ids_input false")


@check("generate.max_tokens_length", "role AGGREGATED")
async def max_tokens_length(ctx):
    """max_tokens=5 with ignore_eos ends with LENGTH after exactly 5 tokens."""
    ctx.require_generation()
    req = ctx.request("len", max_tokens=5, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.ignore_eos = True
    text, ids, fin = (await ctx.run(req)).only()
    expect(fin.reason == G.FINISH_REASON_LENGTH, f"finish reason {G.FinishReason.Name(fin.reason)}, expected LENGTH")
    expect(len(ids) == 5, f"{len(ids)} tokens streamed, max_tokens 5")


@check("generate.min_tokens", "role AGGREGATED")
async def min_tokens(ctx):
    """min_tokens holds back a stop token id that occurs first: at least min_tokens tokens come out (the engine
    may either mask the stop token or not stop on it)."""
    ctx.require_generation()
    base = await ctx.baseline()
    stop_id = base.token_ids[0]
    req = ctx.request("min", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.min_tokens = 4
    req.stopping.ignore_eos = True
    req.stopping.conditions.add(stop_token_id=stop_id)
    s = await ctx.run(req)
    _, ids, fin = s.only()
    expect(len(ids) >= 4, f"only {len(ids)} tokens with min_tokens 4 (stop token id {stop_id} is the first token)")


def _pick_stop(text: str) -> str:
    for length in (3, 2, 4):
        for start in range(max(1, len(text) // 3), len(text) - length + 1):
            s = text[start:start + length]
            if s.strip() and text.find(s) >= 1 and "\ufffd" not in s:
                return s
    raise Skip(f"could not derive a stop string from the greedy output {text!r}")


NEVER = "\u2603conformance-never\u2603"


@check("generate.stop_text", "role AGGREGATED")
async def stop_text(ctx):
    """A stop string known to occur (from a greedy run) ends with STOP, "stop_match identifies the matched
    caller ... stop string": stop_match.stop_text is the one that matched, not the first one requested (a
    string that never occurs is requested first), and the output stops right before it (excluded by default)."""
    ctx.require_generation()
    base = await ctx.baseline()
    stop = _pick_stop(base.text)
    req = ctx.request("stoptext", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.ignore_eos = True
    req.stopping.conditions.add(stop_text=NEVER)
    req.stopping.conditions.add(stop_text=stop)
    text, _, fin = (await ctx.run(req)).only()
    expect(fin.reason == G.FINISH_REASON_STOP,
           f"finish reason {G.FinishReason.Name(fin.reason)} although {stop!r} occurs in {base.text!r}")
    expect(fin.stop_match.WhichOneof("match") == "stop_text" and fin.stop_match.stop_text == stop,
           f"stop_match {fin.stop_match} != stop_text {stop!r}")
    expect(stop not in text, f"output {text!r} contains the stop string {stop!r}")
    expect(text == base.text[: base.text.find(stop)],
           f"output {text!r} is not the greedy text up to the stop string {base.text[: base.text.find(stop)]!r}")


@check("generate.include_stop_in_output", "advertised supports_stop_in_output (else rejected)")
async def include_stop(ctx):
    """include_stop_in_output keeps the matched stop string when advertised; otherwise INVALID_ARGUMENT."""
    ctx.require_generation()
    base = await ctx.baseline()
    stop = _pick_stop(base.text)
    req = ctx.request("incl", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.ignore_eos = True
    req.stopping.include_stop_in_output = True
    req.stopping.conditions.add(stop_text=stop)
    if not ctx.gen_caps().supports_stop_in_output:
        await ctx.gen_rejected(req, what="include_stop_in_output not advertised")
        ctx.reported(ctx.gen_caps(), "supports_stop_in_output", "include_stop_in_output")
        return
    text, _, fin = (await ctx.run(req)).only()
    expect(fin.reason == G.FINISH_REASON_STOP and fin.stop_match.stop_text == stop,
           f"expected STOP on {stop!r}, got {G.FinishReason.Name(fin.reason)} / {fin.stop_match}")
    expect(text.endswith(stop), f"output {text!r} does not end with the included stop string {stop!r}")
    expect(text == base.text[: base.text.find(stop) + len(stop)], f"output {text!r} is not the greedy prefix")


@check("generate.stop_token_id", "role AGGREGATED")
async def stop_token_id(ctx):
    """A stop token id known to occur ends with STOP and stop_match.stop_token_id equal to it (the matched one:
    an id that does not occur is requested first)."""
    ctx.require_generation()
    base = await ctx.baseline()
    pos = next((i for i in range(2, len(base.token_ids)) if base.token_ids[i] not in base.token_ids[:i]), None)
    if pos is None:
        raise Skip("no token in the greedy output occurs first after position 2")
    tid = base.token_ids[pos]
    req = ctx.request("stopid", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.ignore_eos = True
    decoy = next(i for i in range(2, 10_000) if i not in base.token_ids)
    req.stopping.conditions.add(stop_token_id=decoy)
    req.stopping.conditions.add(stop_token_id=tid)
    _, ids, fin = (await ctx.run(req)).only()
    expect(fin.reason == G.FINISH_REASON_STOP, f"finish reason {G.FinishReason.Name(fin.reason)}, expected STOP "
           f"(token {tid} is greedy token #{pos})")
    expect(fin.stop_match.WhichOneof("match") == "stop_token_id" and fin.stop_match.stop_token_id == tid,
           f"stop_match {fin.stop_match} != stop_token_id {tid}")
    expect(ids[:pos] == base.token_ids[:pos], f"tokens before the stop {ids[:pos]} != {base.token_ids[:pos]}")
    expect(len(ids) in (pos, pos + 1), f"{len(ids)} tokens streamed, the stop token is #{pos}")


@check("generate.num_sequences", "advertised max_num_sequences >= 2")
async def num_sequences(ctx):
    """num_sequences=n gives outputs 0..n-1, each with its own single finish (seeded sampling)."""
    ctx.require_generation()
    g = ctx.gen_caps()
    if not g.HasField("max_num_sequences") or g.max_num_sequences < 2:
        raise Skip("max_num_sequences not advertised >= 2")
    n = min(3, g.max_num_sequences)
    req = ctx.request("n", max_tokens=4, sampling=G.SamplingParams(temperature=1.0, num_sequences=n,
                                                                          **await ctx.seed(7)))
    s = await ctx.run(req)
    expect(s.error is None, f"EngineError: {s.error}")
    expect(sorted(s.finished) == list(range(n)), f"finished indexes {sorted(s.finished)} != 0..{n - 1}")
    expect(sorted(s.token_ids) == list(range(n)), f"token indexes {sorted(s.token_ids)} != 0..{n - 1}")


@check("generate.num_sequences_over_limit", "advertised max_num_sequences")
async def num_sequences_over(ctx):
    """num_sequences above the advertised max_num_sequences is INVALID_ARGUMENT."""
    ctx.require_generation()
    g = ctx.gen_caps()
    if not g.HasField("max_num_sequences"):
        raise Skip("max_num_sequences not advertised")
    req = ctx.request("nover", sampling=G.SamplingParams(temperature=1.0, num_sequences=g.max_num_sequences + 1,
                                                         **await ctx.seed(1)))
    await ctx.gen_rejected(req, what=f"num_sequences {g.max_num_sequences + 1}")


@check("generate.reject_no_input", "always")
async def reject_no_input(ctx):
    """A request with neither prompt nor token_ids is INVALID_ARGUMENT with no events."""
    if ctx.role == engine_pb2.ENGINE_ROLE_DECODE:
        raise Skip("role DECODE needs a KV session")
    if not ctx.generates():
        raise Skip("the model advertises no generation capabilities")
    req = G.GenerateRequest(request_id=ctx.rid("noinput"), model=ctx.model,
                            stopping=G.StoppingOptions(max_tokens=4))
    await ctx.gen_rejected(req, what="Generate without input")


@check("generate.reject_num_sequences_zero", "role AGGREGATED")
async def reject_n_zero(ctx):
    """An explicit num_sequences=0 is INVALID_ARGUMENT with no events."""
    ctx.require_generation()
    await ctx.gen_rejected(ctx.request("n0", sampling=G.SamplingParams(num_sequences=0)),
                           what="num_sequences 0")


@check("generate.reject_max_tokens_zero", "role AGGREGATED")
async def reject_max_tokens_zero(ctx):
    """An explicit max_tokens=0 is INVALID_ARGUMENT with no events."""
    ctx.require_generation()
    req = ctx.request("mt0", max_tokens=None)
    req.stopping.max_tokens = 0
    await ctx.gen_rejected(req, what="max_tokens 0")


@check("generate.reject_unknown_model", "always")
async def reject_unknown_model(ctx):
    """Generate for a model that is not served is NOT_FOUND with no events."""
    if ctx.role == engine_pb2.ENGINE_ROLE_DECODE:
        raise Skip("role DECODE needs a KV session")
    if not ctx.generates():
        raise Skip("the model advertises no generation capabilities")
    req = ctx.request("unknownmodel")
    req.model = "conformance/no-such-model"
    await ctx.gen_rejected(req, C.NOT_FOUND, what="Generate for an unknown model")


@check("generate.duplicate_live_request_id", "role AGGREGATED")
async def duplicate_id(ctx):
    """A second request with the id of a live request is ALREADY_EXISTS with no events."""
    ctx.require_generation()
    for _ in range(3):  # a fast engine may finish the "long" request before the duplicate arrives
        long = ctx.long_request("dup")
        call = ctx.stub.Generate(long, timeout=ctx.options.check_timeout_s)
        try:
            first = await call.read()
            expect(first is not grpc.aio.EOF, "the long request ended without events")
            if first.WhichOneof("event") == "finished" or first.WhichOneof("event") == "error":
                raise Skip("the long request finished at once; pass --long-request-metadata to slow the engine")
            dup = ctx.request("dup2")
            dup.request_id = long.request_id
            try:
                await ctx.gen_rejected(dup, C.ALREADY_EXISTS, what="duplicate live request id")
                return
            except CheckFailed:
                if not call.done():  # the first request was still live: a real violation
                    raise
        finally:
            call.cancel()
            await ctx.wait_idle("cancelling the long request")
    raise Skip("the long request kept finishing before the duplicate arrived; pass --long-request-metadata "
               "to slow the engine")


# option gates -----------------------------------------------------------------------------------------

async def _gated(ctx, caps, name: str, req, what: str):
    """Advertised: works; else INVALID_ARGUMENT, never silently ignored -- and a refused option's capability
    is reported (an explicit false), not left unreported."""
    if getattr(caps, name):
        s = await ctx.run(req)
        expect(s.error is None, f"{what}: EngineError {s.error}")
    else:
        await ctx.gen_rejected(req, what=f"{what} (not advertised)")
        ctx.reported(caps, name, what)


@check("generate.priority", "advertised supports_priority (else rejected on revision 1)")
async def priority(ctx):
    """priority works when supports_priority, else INVALID_ARGUMENT on revision 1 (never silently ignored);
    v0.1.0's ``openengine-priority`` "is used only when the selected model and task advertise priority
    support", so there the request is served (in default order) and supports_priority says false."""
    ctx.require_generation()
    req = ctx.request("prio", priority=1)
    if ctx.options.contract == "v0.1.0" and not ctx.gen_caps().supports_priority:
        s = await ctx.run(req)
        expect(s.error is None, f"openengine-priority on a model without priority: EngineError {s.error}")
        expect(ctx.gen_caps().HasField("supports_priority"),
               "priority is served in default order, yet supports_priority is absent (unreported)")
        return
    await _gated(ctx, ctx.gen_caps(), "supports_priority", req, "priority")


@check("generate.cache_salt", "advertised supports_cache_salt (else rejected)")
async def cache_salt(ctx):
    """kv.cache_salt works when supports_cache_salt, else INVALID_ARGUMENT."""
    ctx.require_generation()
    req = ctx.request("salt")
    req.kv.cache_salt = "conformance"
    await _gated(ctx, ctx.gen_caps(), "supports_cache_salt", req, "cache_salt")


@check("generate.bypass_prefix_cache", "advertised supports_prefix_cache_bypass (else rejected)")
async def bypass_prefix_cache(ctx):
    """kv.bypass_prefix_cache works when advertised, else INVALID_ARGUMENT."""
    ctx.require_generation()
    req = ctx.request("bypass")
    req.kv.bypass_prefix_cache = True
    await _gated(ctx, ctx.gen_caps(), "supports_prefix_cache_bypass", req, "bypass_prefix_cache")


@check("generate.lora_name", "advertised supports_lora (else rejected)")
async def lora_name(ctx):
    """lora_name is INVALID_ARGUMENT when supports_lora is false; an unknown adapter is refused otherwise."""
    ctx.require_generation()
    req = ctx.request("lora", lora_name="conformance-no-such-adapter")
    if ctx.mi().supports_lora:
        await ctx.gen_rejected(req, C.NOT_FOUND, C.INVALID_ARGUMENT, what="Generate with an unknown lora_name")
    else:
        await ctx.gen_rejected(req, what="lora_name with supports_lora false")
        ctx.reported(ctx.mi(), "supports_lora", "lora_name")


@check("generate.media_unadvertised", "supports_multimodal false")
async def media_unadvertised(ctx):
    """media on a model that does not advertise supports_multimodal is INVALID_ARGUMENT."""
    ctx.require_generation()
    if ctx.mi().supports_multimodal:
        raise Skip("supports_multimodal is advertised (media inputs are engine-specific)")
    req = ctx.request("media")
    req.media.add(modality=input_pb2.MODALITY_IMAGE, data_uri="data:image/png;base64,iVBORw0KGgo=")
    await ctx.gen_rejected(req, what="media on a text-only model")
    ctx.reported(ctx.mi(), "supports_multimodal", "media")


# logprobs -----------------------------------------------------------------------------------------------

def _sel(mode: int, cap, ids: list[int]) -> G.CandidateTokenSelection:
    if mode == MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N:
        n = min(2, cap.max_top_n) if cap.HasField("max_top_n") else 2
        return G.CandidateTokenSelection(top_n=n)
    if mode == MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        return G.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=ids))
    return G.CandidateTokenSelection(all=G.AllCandidates())


async def _candidate_ids(ctx) -> list[int]:
    base = await ctx.baseline()
    return sorted(set(base.token_ids))[:2] or [1, 2]


def _logprob_check(which: str, mode: int):
    mode_name = MODES.Name(mode).removeprefix("CANDIDATE_TOKEN_SELECTION_MODE_")

    @check(f"generate.{which}_logprobs_{mode_name.lower()}",
           f"advertised {which}_logprobs {mode_name} (else rejected)")
    async def run(ctx):
        ctx.require_generation()
        cap = getattr(ctx.gen_caps(), f"{which}_logprobs")
        sel = _sel(mode, cap, await _candidate_ids(ctx))
        req = ctx.request(f"{which}lp{mode}", max_tokens=3, sampling=G.SamplingParams(temperature=0.0))
        if which == "prompt":
            req.response.return_prompt_logprobs = True
            req.response.prompt_candidates.CopyFrom(sel)
        else:
            req.response.return_output_logprobs = True
            req.response.output_candidates.CopyFrom(sel)
        if not (cap.supported and mode in cap.candidate_selection_modes):
            await ctx.gen_rejected(req, what=f"{which} logprobs with {mode_name} candidates (not advertised)")
            if not ctx.gen_caps().HasField(f"{which}_logprobs"):
                raise CheckFailed(f"{which} logprobs are refused, yet generation.{which}_logprobs is absent "
                                  "(unreported): report supported = false")
            ctx.reported(cap, "supported", f"{which} logprobs")
            return
        s = await ctx.run(req)
        expect(s.error is None, f"EngineError {s.error}")
        if which == "prompt":
            expect(s.prompt is not None, "return_prompt_logprobs asked but no PromptOutput came")
            expect(len(s.prompt.tokens) == s.usage.prompt_tokens,
                   f"PromptOutput has {len(s.prompt.tokens)} tokens, usage.prompt_tokens {s.usage.prompt_tokens}")
            infos = list(s.prompt.tokens)[1:]
            for info in infos:
                expect(info.HasField("logprob"), "a prompt token after the first has no logprob")
        else:
            infos = s.tokens.get(0, [])
        counts = {len(i.candidates) for i in infos}
        if sel.WhichOneof("selection") == "top_n":
            expect(counts <= {sel.top_n}, f"{which} candidate counts {counts} != top_n {sel.top_n}")
        elif sel.WhichOneof("selection") == "token_ids":
            for info in infos:
                got = [c.token_id for c in info.candidates]
                expect(got == list(sel.token_ids.ids), f"{which} candidates {got} != asked {list(sel.token_ids.ids)}")
        else:
            expect(len(counts) <= 1 and (not counts or counts.pop() > 1),
                   f"ALL candidates: inconsistent or trivial candidate counts {counts}")

    return run


for _which in ("prompt", "output"):
    for _mode in (MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
                  MODES.CANDIDATE_TOKEN_SELECTION_MODE_ALL):
        _logprob_check(_which, _mode)


@check("generate.top_n_over_limit", "advertised output_logprobs max_top_n")
async def top_n_over(ctx):
    """top_n above output_logprobs.max_top_n is INVALID_ARGUMENT."""
    ctx.require_generation()
    cap = ctx.gen_caps().output_logprobs
    if not (cap.supported and cap.HasField("max_top_n")
            and MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N in cap.candidate_selection_modes):
        raise Skip("output_logprobs TOP_N with max_top_n not advertised")
    req = ctx.request("topn")
    req.response.return_output_logprobs = True
    req.response.output_candidates.top_n = cap.max_top_n + 1
    await ctx.gen_rejected(req, what=f"top_n {cap.max_top_n + 1} > max_top_n {cap.max_top_n}")


@check("generate.logprobs_plain", "advertised output_logprobs")
async def logprobs_plain(ctx):
    """return_output_logprobs without candidates gives a logprob per token; without it, none."""
    ctx.require_generation()
    cap = ctx.gen_caps().output_logprobs
    req = ctx.request("lp", max_tokens=3)
    req.response.return_output_logprobs = True
    if not cap.supported:
        await ctx.gen_rejected(req, what="output logprobs (not advertised)")
        ctx.reported(cap, "supported", "output logprobs")
        return
    s = await ctx.run(req)
    expect(all(t.HasField("logprob") for t in s.tokens.get(0, [])), "a token has no logprob")


@check("generate.concurrent_streams", "role AGGREGATED")
async def concurrent(ctx):
    """Two concurrent requests each get their own well-formed stream."""
    ctx.require_generation()
    reqs = [ctx.request(f"conc{i}", max_tokens=4, sampling=G.SamplingParams(temperature=0.0)) for i in range(2)]
    results = await asyncio.gather(*(ctx.run(r) for r in reqs))
    for s in results:
        expect(s.error is None, f"EngineError {s.error}")


# limits, prompt positions, failures after acceptance, scheduling order, prefix-cache options -------------

@check("generate.limits_at_maximum", "advertised max_num_sequences / max_top_n")
async def limits_at_maximum(ctx):
    """"The remaining generation fields advertise support and limits for the corresponding request
    options": an advertised limit is the largest value accepted, so num_sequences == max_num_sequences
    (up to 16) and top_n == max_top_n (prompt and output, TOP_N advertised) are accepted and honoured."""
    ctx.require_generation()
    g = ctx.gen_caps()
    tested = []
    if g.HasField("max_num_sequences") and g.max_num_sequences <= 16:
        n = g.max_num_sequences
        req = ctx.request("nmax", max_tokens=2, sampling=G.SamplingParams(temperature=1.0, num_sequences=n,
                                                                          **await ctx.seed(3)))
        s = await ctx.run(req)
        expect(sorted(s.finished) == list(range(n)), f"num_sequences {n} (the maximum): finished {sorted(s.finished)}")
        tested.append(f"num_sequences {n}")
    for which in ("output", "prompt"):
        cap = getattr(g, f"{which}_logprobs")
        if not (cap.supported and cap.HasField("max_top_n")
                and MODES.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N in cap.candidate_selection_modes):
            continue
        req = ctx.request(f"{which}topmax", max_tokens=2, sampling=G.SamplingParams(temperature=0.0))
        getattr(req.response, f"{which}_candidates").top_n = cap.max_top_n
        setattr(req.response, f"return_{which}_logprobs", True)
        s = await ctx.run(req)
        infos = s.tokens.get(0, []) if which == "output" else list(s.prompt.tokens if s.prompt else [])[1:]
        expect(infos, f"{which} top_n {cap.max_top_n}: no token information came back")
        for info in infos:
            expect(len(info.candidates) == cap.max_top_n,
                   f"{which} top_n {cap.max_top_n} (the maximum): {len(info.candidates)} candidates")
        tested.append(f"{which} top_n {cap.max_top_n}")
    if not tested:
        raise Skip("no max_num_sequences <= 16 and no max_top_n with TOP_N advertised")


@check("generate.prompt_logprob_start", "advertised prompt_logprobs (else rejected by generate.prompt_logprobs_*)")
async def prompt_logprob_start(ctx):
    """ResponseOptions.prompt_logprob_start: prompt token information starts at that position, so the
    PromptOutput holds the prompt tokens from there on (the same ids as a run from 0), and its first entry
    is not the prompt's first token, so it carries a logprob."""
    ctx.require_generation()
    cap = ctx.gen_caps().prompt_logprobs
    if not cap.supported:
        raise Skip("prompt logprobs not advertised (their refusal is generate.prompt_logprobs_*)")
    kw = {"token_ids": input_pb2.TokenIds(ids=ctx.prompt_ids())} if ctx.mi().supports_token_ids_input else {}
    runs = []
    for start in (None, 2):
        req = ctx.request("pstart", max_tokens=1, sampling=G.SamplingParams(temperature=0.0), **kw)
        req.response.return_prompt_logprobs = True
        if start is not None:
            req.response.prompt_logprob_start = start
        s = await ctx.run(req)
        expect(s.prompt is not None, "return_prompt_logprobs asked but no PromptOutput came")
        runs.append(s)
    full, tail = ([t.token_id for t in r.prompt.tokens] for r in runs)
    expect(tail == full[2:], f"prompt_logprob_start 2: prompt token ids {tail}, expected {full[2:]} (from {full})")
    expect(not tail or runs[1].prompt.tokens[0].HasField("logprob"),
           "prompt_logprob_start 2: the first returned prompt token (position 2) has no logprob")


@check("generate.failure_after_acceptance", "--fail-request-metadata KEY=VALUE")
async def failure_after_acceptance(ctx):
    """"Accepted request, application failure: exactly one terminal EngineError event; gRPC OK after the
    event" -- never a non-OK status once events flowed. Needs a test-engine hook that makes an accepted
    request fail mid-stream (``--fail-request-metadata``, e.g. the fake's ``fake.crash_after=2``)."""
    if not ctx.options.fail_metadata:
        raise Skip("no --fail-request-metadata given (a test-engine hook that fails an accepted request)")
    ctx.require_generation()
    req = ctx.request("fail", max_tokens=16, sampling=G.SamplingParams(temperature=0.0))
    req.stopping.ignore_eos = True
    req.metadata.update(ctx.options.fail_metadata)
    events = []
    try:
        async for r in ctx.stub.Generate(req, timeout=ctx.options.check_timeout_s):
            events.append(r)
    except grpc.aio.AioRpcError as exc:
        raise CheckFailed(f"the failing request ended with gRPC status {exc.code().name} after {len(events)} "
                          "event(s): an accepted request ends with one terminal EngineError and gRPC OK") from None
    from conformance.context import check_stream

    s = check_stream(req, events)
    expect(s.error is not None, "the request carrying --fail-request-metadata completed without an EngineError "
           "(the hook did not reach the engine)")


@check("generate.priority_order", "advertised supports_priority; --serial-request-metadata KEY=VALUE")
async def priority_order(ctx):
    """"priority uses higher values for higher scheduling priority": of two queued requests, the one with
    the larger priority starts first. Needs a test-engine hook that runs the requests carrying it one at a
    time (``--serial-request-metadata``, e.g. the fake's ``fake.serialize=1``); without supports_priority
    the option's refusal is generate.priority."""
    if not ctx.options.serial_metadata:
        raise Skip("no --serial-request-metadata given (a test-engine hook that queues requests)")
    ctx.require_generation()
    if not ctx.gen_caps().supports_priority:
        raise Skip("supports_priority not advertised (its refusal is generate.priority)")

    def queued(tag, priority):
        req = ctx.request(tag, max_tokens=2, priority=priority, sampling=G.SamplingParams(temperature=0.0))
        req.metadata.update(ctx.options.serial_metadata)
        return req

    started: list[str] = []

    async def run(req, name):
        async for _ in ctx.stub.Generate(req, timeout=ctx.options.check_timeout_s):
            if name not in started:
                started.append(name)

    blocker_req = ctx.long_request("prio-block", priority=0)
    blocker_req.metadata.update(ctx.options.serial_metadata)
    blocker = ctx.stub.Generate(blocker_req, timeout=ctx.options.check_timeout_s)
    try:
        first = await blocker.read()
        expect(first is not grpc.aio.EOF, "the blocking request ended without events")
        low = asyncio.ensure_future(run(queued("prio-low", 1), "low"))
        await asyncio.sleep(0.3)
        high = asyncio.ensure_future(run(queued("prio-high", 10), "high"))
        await asyncio.sleep(0.3)
        expect(not started, f"{started} started while the blocking request held the engine (the hook does not queue)")
    finally:
        blocker.cancel()  # frees the engine: the two queued requests run now, one at a time
    await asyncio.wait_for(asyncio.gather(low, high), ctx.options.check_timeout_s)
    expect(started == ["high", "low"], f"queued requests started in the order {started}: priority 10 must start "
           "before priority 1 (larger values have higher priority)")


def _cache_prompt(ctx, tag: str) -> dict:
    """A prompt long enough to fill prefix-cache blocks, unique to this run."""
    mi = ctx.mi()
    room = (mi.max_context_length - 32) if mi.HasField("max_context_length") else 400
    if mi.supports_text_input:
        text = f"prefix cache probe {ctx.rid(tag)} " + " ".join(f"w{i}" for i in range(200))
        return {"prompt": text[: max(32, min(len(text), room))]}
    seed = sum(ord(c) for c in ctx.rid(tag))
    return {"token_ids": input_pb2.TokenIds(ids=[1 + (seed + 7 * i) % 97 for i in range(max(16, min(300, room)))])}


async def _cached(ctx, tag: str, prompt: dict, **kv) -> int | None:
    req = ctx.request(tag, max_tokens=1, sampling=G.SamplingParams(temperature=0.0), **prompt)
    for k, v in kv.items():
        setattr(req.kv, k, v)
    s = await ctx.run(req)
    expect(s.error is None, f"EngineError {s.error}")
    return s.usage.cached_prompt_tokens if s.usage.HasField("cached_prompt_tokens") else None


async def _repeat_hits(ctx, tag: str, prompt: dict, **kv) -> None:
    await _cached(ctx, tag, prompt, **kv)
    again = await _cached(ctx, tag, prompt, **kv)
    if not again:
        raise Skip("a repeated prompt reports no cached_prompt_tokens, so prefix-cache reuse is not observable")


@check("generate.cache_salt_namespaces", "advertised supports_cache_salt; cached_prompt_tokens reported")
async def cache_salt_namespaces(ctx):
    """"cache_salt namespaces the prefix-cache key": a prompt cached under one salt is not reused under
    another (cached_prompt_tokens 0), where a repeat under the same salt is."""
    ctx.require_generation()
    if not ctx.gen_caps().supports_cache_salt:
        raise Skip("supports_cache_salt not advertised (its refusal is generate.cache_salt)")
    prompt = _cache_prompt(ctx, "salt")
    await _repeat_hits(ctx, "salt-a", prompt, cache_salt=f"conformance-a-{ctx.rid('s')}")
    other = await _cached(ctx, "salt-b", prompt, cache_salt=f"conformance-b-{ctx.rid('s')}")
    expect(not other, f"a prompt cached under one cache_salt reused {other} cached tokens under another salt")


@check("generate.bypass_prefix_cache_skips_reuse",
       "advertised supports_prefix_cache_bypass; cached_prompt_tokens reported")
async def bypass_prefix_cache_skips_reuse(ctx):
    """"bypass_prefix_cache = true skips prefix cache reuse": a prompt that a repeat finds cached reports
    no cached_prompt_tokens when sent with bypass_prefix_cache."""
    ctx.require_generation()
    if not ctx.gen_caps().supports_prefix_cache_bypass:
        raise Skip("supports_prefix_cache_bypass not advertised (its refusal is generate.bypass_prefix_cache)")
    prompt = _cache_prompt(ctx, "bypass")
    await _repeat_hits(ctx, "bypass", prompt)
    bypassed = await _cached(ctx, "bypass-on", prompt, bypass_prefix_cache=True)
    expect(not bypassed, f"bypass_prefix_cache = true still reused {bypassed} cached prompt tokens")
