"""Single-violation mutants of our own server: each breaks ONE rule of the contract.

A mutant is a function that, inside a child server process and before the server is built,
monkeypatches one piece of the core, the wire layers (revision 1 and v0.1.0's translation and
metadata) or the fake engine, so that the server breaks exactly the rule it names. The mutation
session (``tests/mutants/run.py``, ``nox -s mutation``) serves each one and runs the conformance
suite against it: a mutant is killed when at least one check fails.

``target`` picks the fake server the mutant is served as (``aggregated``, ``prefill``, ``decode``,
``task-only``: roles and a model without generation). ``invisible`` records, for a mutant the suite
cannot kill, why no black-box client can see the violation; ``needs`` names the opt-in test-engine
flag without which it is invisible (``run.py --no-hooks`` scores the suite as a user runs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from openengine_adapters import backend as be


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    apply: Callable[[], None]
    target: str = "aggregated"
    invisible: str = ""  # why the suite cannot see it (expected survivor), else ""
    smoke: str = ""  # the checks (globs) that kill it in the unit suite's smoke subset; "" = not in it
    needs: str = ""  # the opt-in flag without which no check can see it (a user's run without test hooks)

    @property
    def domain(self) -> str:
        return self.name.split(".", 1)[0]


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, rule: str, target: str = "aggregated", invisible: str = "", smoke: str = "", needs: str = ""):
    def register(fn):
        if name in MUTANTS:
            raise ValueError(f"duplicate mutant {name}")
        MUTANTS[name] = Mutant(name, rule, fn, target, invisible, smoke, needs)
        return fn

    return register


# ----------------------------------------------------------------------------- patch helpers

def _core():
    from openengine_adapters.core import service

    return service


def _family(name: str):
    """The core module of one RPC family (``generation``, ``tasks``, ``control``, ``lora``, ...)."""
    import importlib

    return importlib.import_module(f"openengine_adapters.core.{name}")


def edit_responses(edit: Callable) -> None:
    """Rewrite the Generate stream both surfaces send: ``edit(resp, request, state)`` returns the
    response, a list of responses or None (dropped); ``state`` is a dict per request."""
    service = _core()
    original = service.EngineService.Generate

    async def Generate(self, request, context, *args, **kwargs):
        state: dict = {}
        async for resp in original(self, request, context, *args, **kwargs):
            out = edit(resp, request, state)
            for r in out if isinstance(out, list) else ([] if out is None else [out]):
                yield r

    service.EngineService.Generate = Generate


def wrap_parse_generate(before: Callable | None = None, after: Callable | None = None) -> None:
    """Wrap the core's request validation: ``before(req, card, engine)`` may raise a rejection,
    ``after(params, req, card)`` returns the (altered) params."""
    generation = _family("generation")
    original = generation.parse_generate

    def parse(req, request_id, card, engine, lenient=None):
        if before is not None:
            before(req, card, engine)
        params = original(req, request_id, card, engine, lenient)
        return after(params, req, card) if after is not None else params

    generation.parse_generate = parse


def patch_method(cls, name: str, make: Callable) -> None:
    """``cls.name = make(original)``."""
    setattr(cls, name, make(getattr(cls, name)))


def fake_class():
    import fake_backend

    return fake_backend.FakeBackend


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


# ============================================================================= Generate stream

@mutant("stream.output_index_zero_absent", "TokenOutput and GenerationFinished must carry output_index, "
        "including index zero", smoke="generate.stream_contract")
def _():
    def edit(resp, req, state):
        if resp.HasField("token") and resp.token.output_index == 0:
            resp.token.ClearField("output_index")
        return resp
    edit_responses(edit)


@mutant("stream.usage_on_every_event", "Usage is set only on the final response")
def _():
    def edit(resp, req, state):
        if resp.HasField("token"):
            resp.usage.prompt_tokens = 1
        return resp
    edit_responses(edit)


@mutant("stream.no_usage_on_final", "Usage is cumulative and set on the final response")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished"):
            resp.ClearField("usage")
        return resp
    edit_responses(edit)


@mutant("stream.total_tokens_wrong", "usage.total_tokens = prompt_tokens + completion_tokens")
def _():
    def edit(resp, req, state):
        if resp.HasField("usage"):
            resp.usage.total_tokens = resp.usage.prompt_tokens
        return resp
    edit_responses(edit)


@mutant("stream.completion_tokens_off_by_one", "Usage is cumulative across every output (completion_tokens "
        "counts the tokens streamed)")
def _():
    def edit(resp, req, state):
        if resp.HasField("usage") and not resp.HasField("error"):
            resp.usage.completion_tokens += 1
            resp.usage.total_tokens += 1
        return resp
    edit_responses(edit)


@mutant("stream.cached_exceeds_prompt", "cached_prompt_tokens is a subset of prompt_tokens")
def _():
    def edit(resp, req, state):
        if resp.HasField("usage"):
            resp.usage.cached_prompt_tokens = resp.usage.prompt_tokens + 1
        return resp
    edit_responses(edit)


@mutant("stream.cumulative_text", "Every TokenOutput contains only newly emitted text; it is not cumulative")
def _():
    def edit(resp, req, state):
        if resp.HasField("token"):
            key = resp.token.output_index
            state[key] = state.get(key, "") + resp.token.text
            resp.token.text = state[key]
        return resp
    edit_responses(edit)


@mutant("stream.second_finish", "exactly one GenerationFinished for each requested output")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished") and not resp.HasField("usage"):
            return [resp, _copy(resp)]
        return resp
    edit_responses(edit)


@mutant("stream.event_after_terminal", "no event follows the terminal event", smoke="generate.stream_contract")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished") and resp.HasField("usage"):
            extra = type(resp)(request_id=resp.request_id)
            extra.token.output_index = resp.finished.output_index
            extra.token.text = "!"
            extra.token.tokens.add(token_id=33)
            return [resp, extra]
        return resp
    edit_responses(edit)


@mutant("stream.finish_reason_unspecified", "GenerationFinished reports a FinishReason (LENGTH when "
        "max_tokens ends the output)")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished") and resp.finished.reason == 2:
            resp.finished.reason = 0
        return resp
    edit_responses(edit)


@mutant("stream.stop_without_match", "When FinishReason is STOP, stop_match identifies the matched stop")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished"):
            resp.finished.ClearField("stop_match")
        return resp
    edit_responses(edit)


@mutant("stream.stop_text_first_requested", "stop_match identifies the MATCHED caller stop string "
        "(here: the first requested one)", smoke="generate.stop_text")
def _():
    def edit(resp, req, state):
        texts = [c.stop_text for c in req.stopping.conditions if c.WhichOneof("condition") == "stop_text"]
        if resp.HasField("finished") and resp.finished.stop_match.WhichOneof("match") == "stop_text" and texts:
            resp.finished.stop_match.stop_text = texts[0]
        return resp
    edit_responses(edit)


@mutant("stream.eos_as_stop_token_id", "a model EOS is reported as stop_match.eos_token_id, not as a caller "
        "stop token")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished") and resp.finished.stop_match.WhichOneof("match") == "eos_token_id":
            resp.finished.stop_match.stop_token_id = resp.finished.stop_match.eos_token_id
        return resp
    edit_responses(edit)


@mutant("stream.token_string_mismatch", "one TokenInfo per token: its token string is that token id's "
        "(not misaligned)", smoke="generate.output_logprobs_top_n")
def _():
    def edit(resp, req, state):
        if resp.HasField("token"):
            for info in resp.token.tokens:
                if info.token:
                    info.token = info.token + "~"
        return resp
    edit_responses(edit)


@mutant("stream.prompt_first_token_scored", "the first prompt token omits logprob and rank and has no candidates")
def _():
    def edit(resp, req, state):
        if resp.HasField("prompt") and resp.prompt.tokens and not req.response.prompt_logprob_start:
            resp.prompt.tokens[0].logprob = -1.0
        return resp
    edit_responses(edit)


@mutant("stream.prompt_output_twice", "PromptOutput is emitted at most once")
def _():
    def edit(resp, req, state):
        return [resp, _copy(resp)] if resp.HasField("prompt") else resp
    edit_responses(edit)


@mutant("stream.extra_candidate", "candidate entries follow the requested selection (top_n gives n)")
def _():
    def edit(resp, req, state):
        if resp.HasField("token") and req.response.output_candidates.WhichOneof("selection") == "top_n":
            for info in resp.token.tokens:
                info.candidates.add(token_id=1, logprob=-9.0, token=chr(1))
        return resp
    edit_responses(edit)


@mutant("stream.logprobs_not_asked", "no logprobs are returned when not asked")
def _():
    def edit(resp, req, state):
        if resp.HasField("token") and not req.response.return_output_logprobs:
            for info in resp.token.tokens:
                info.logprob = -0.5
        return resp
    edit_responses(edit)


@mutant("stream.request_id_not_echoed", "each response carries the request's request_id")
def _():
    def edit(resp, req, state):
        if resp.HasField("finished"):
            resp.request_id = "other"
        return resp
    edit_responses(edit)


@mutant("stream.failure_as_status", "an accepted request that fails ends with exactly one terminal EngineError "
        "and gRPC OK, not a non-OK status", smoke="generate.failure_after_acceptance")
def _():
    service = _core()
    original = service.EngineService.Generate

    async def Generate(self, request, context, *args, **kwargs):
        async for resp in original(self, request, context, *args, **kwargs):
            if resp.HasField("error"):
                await context.abort(grpc.StatusCode.INTERNAL, resp.error.message)
            yield resp

    service.EngineService.Generate = Generate


@mutant("stream.error_without_usage", "the terminal EngineError is the final response and carries usage")
def _():
    def edit(resp, req, state):
        if resp.HasField("error"):
            resp.ClearField("usage")
        return resp
    edit_responses(edit)


# ============================================================================= Generate validation

@mutant("validate.max_tokens_zero_accepted", "max_tokens must be greater than zero when present")
def _():
    def before(req, card, engine):
        if req.stopping.HasField("max_tokens") and req.stopping.max_tokens == 0:
            req.stopping.max_tokens = 1
    wrap_parse_generate(before)


@mutant("validate.num_sequences_zero_accepted", "num_sequences must be greater than zero when present")
def _():
    def before(req, card, engine):
        if req.sampling.HasField("num_sequences") and req.sampling.num_sequences == 0:
            req.sampling.ClearField("num_sequences")
    wrap_parse_generate(before)


@mutant("validate.num_sequences_refused_at_max", "max_num_sequences is the advertised limit: "
        "num_sequences == max_num_sequences is accepted")
def _():
    from openengine_adapters.errors import unsupported

    def before(req, card, engine):
        if card.generation and req.sampling.num_sequences == card.generation.max_num_sequences:
            raise unsupported("sampling.num_sequences: at the limit")
    wrap_parse_generate(before)


@mutant("validate.top_n_refused_at_max", "max_top_n is the advertised limit: top_n == max_top_n is accepted")
def _():
    from openengine_adapters.errors import unsupported

    def before(req, card, engine):
        cap = card.generation.output_logprobs if card.generation else None
        if cap and req.response.output_candidates.WhichOneof("selection") == "top_n" \
                and req.response.output_candidates.top_n == cap.max_top_n:
            raise unsupported("response.output_candidates.top_n: at the limit")
    wrap_parse_generate(before)


@mutant("validate.top_n_over_max_accepted", "top_n above the advertised max_top_n is refused")
def _():
    from openengine_adapters.validation import generate as vg

    def candidates(sel, support, field):
        return vg_candidates(sel, dataclasses.replace(support, max_top_n=None), field)
    vg_candidates = vg._candidates
    vg._candidates = candidates


@mutant("validate.num_sequences_over_max_accepted", "num_sequences above max_num_sequences is refused")
def _():
    def before(req, card, engine):
        limit = card.generation.max_num_sequences if card.generation else 1
        if req.sampling.num_sequences > limit:
            req.sampling.num_sequences = limit
    wrap_parse_generate(before)


@mutant("validate.aggregated_accepts_kv_session", "an AGGREGATED engine refuses kv.session before acceptance "
        "(role mismatch)", smoke="generate.aggregated_refuses_kv_session")
def _():
    from openengine_adapters.types import EngineRole
    from openengine_adapters.validation import generate as vg

    original = vg._check_role

    def check_role(p, role, lenient=False):
        if role != EngineRole.AGGREGATED:
            original(p, role, lenient)
    vg._check_role = check_role


@mutant("validate.prefill_accepts_decode", "a PREFILL engine refuses max_tokens > 1 (role mismatch; revision 1 also "
        "output logprobs and guided decoding)",
        target="prefill")
def _():
    from openengine_adapters.types import EngineRole
    from openengine_adapters.validation import generate as vg

    original = vg._check_role

    def check_role(p, role, lenient=False):
        if role == EngineRole.PREFILL and p.kv_session is None:
            return
        original(p, role, lenient)
    vg._check_role = check_role


@mutant("validate.decode_without_session", "revision 1: a DECODE engine refuses a request without kv.session",
        target="decode")
def _():
    from openengine_adapters.types import EngineRole
    from openengine_adapters.validation import generate as vg

    original = vg._check_role

    def check_role(p, role, lenient=False):
        if role == EngineRole.DECODE and p.kv_session is None:
            return
        original(p, role, lenient)
    vg._check_role = check_role


@mutant("v0_1.decode_without_session_refused", "v0.1.0: a DECODE engine serves a request without kv.session "
        "locally (conditional disaggregation; the revision-1 role rule applied to v0.1.0)", target="decode")
def _():
    from openengine_adapters.types import EngineRole
    from openengine_adapters.validation import generate as vg

    original = vg._check_role

    def check_role(p, role, lenient=False):
        original(p, role, lenient and role != EngineRole.DECODE)
    vg._check_role = check_role


@mutant("v0_1.prefill_output_options_refused", "v0.1.0: a PREFILL engine takes the decode leg's output logprobs "
        "and guided decoding (the revision-1 role rule applied to v0.1.0)", target="prefill")
def _():
    from openengine_adapters.types import EngineRole
    from openengine_adapters.validation import generate as vg

    original = vg._check_role

    def check_role(p, role, lenient=False):
        original(p, role, lenient and role != EngineRole.PREFILL)
    vg._check_role = check_role


@mutant("v0_1.bypass_false_refused", "v0.1.0: bypass_prefix_cache = false asks for what every engine does; "
        "served where bypass is not advertised")
def _():
    from openengine_adapters.errors import unsupported

    def before(req, card, engine):
        if req.kv.HasField("bypass_prefix_cache") and not req.kv.bypass_prefix_cache:
            raise unsupported("kv.bypass_prefix_cache: prefix-cache bypass is not advertised")
    wrap_parse_generate(before)


@mutant("validate.unknown_model_defaulted", "an unknown model returns NOT_FOUND")
def _():
    from openengine_adapters.validation import catalog

    original = catalog.ModelCatalog.resolve

    def resolve(self, model, required=False):
        try:
            return original(self, model, required)
        except Exception:
            if model == "":
                raise
            return self.cards[0]
    catalog.ModelCatalog.resolve = resolve


@mutant("validate.unknown_lora_accepted", "a non-empty lora_name selects an already loaded adapter")
def _():
    def before(req, card, engine):
        if req.lora_name and req.lora_name not in engine.loaded_loras:
            req.lora_name = ""
    wrap_parse_generate(before)


@mutant("validate.media_on_text_only_model", "media on a model without supports_multimodal is refused")
def _():
    def before(req, card, engine):
        del req.media[:]
    wrap_parse_generate(before)


@mutant("validate.unadvertised_guided_mode", "guided decoding modes not advertised are refused, never ignored")
def _():
    from openengine_adapters.validation import generate as vg

    original = vg._parse_guided

    def parse_guided(g, gen):
        support = dataclasses.replace(gen.guided_decoding, modes=tuple(vg._GUIDED_FIELDS.values()))
        return original(g, dataclasses.replace(gen, guided_decoding=support))
    vg._parse_guided = parse_guided


@mutant("validate.include_stop_ignored", "include_stop_in_output keeps the matched stop string in the output")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, stopping=dataclasses.replace(params.stopping, include_stop_in_output=None))
    wrap_parse_generate(after=after)


@mutant("validate.stop_token_ids_ignored", "a caller stop token id ends the output with STOP")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, stopping=dataclasses.replace(params.stopping, stop_token_ids=()))
    wrap_parse_generate(after=after)


@mutant("validate.min_tokens_ignored", "min_tokens holds back stop conditions for that many tokens")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, stopping=dataclasses.replace(params.stopping, min_tokens=None))
    wrap_parse_generate(after=after)


@mutant("validate.prompt_logprob_start_ignored", "prompt_logprob_start: prompt token information starts at "
        "that position")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, logprobs=dataclasses.replace(params.logprobs, prompt_start=None))
    wrap_parse_generate(after=after)


@mutant("validate.cache_salt_ignored", "cache_salt namespaces the prefix-cache key")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, cache_salt=None)
    wrap_parse_generate(after=after)


@mutant("validate.bypass_prefix_cache_ignored", "bypass_prefix_cache = true skips prefix cache reuse")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, bypass_prefix_cache=None)
    wrap_parse_generate(after=after)


@mutant("validate.priority_ignored", "priority: larger values have higher scheduling priority (here dropped)",
        needs="--serial-request-metadata")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, priority=None)
    wrap_parse_generate(after=after)


@mutant("validate.priority_inverted", "priority: larger values have higher scheduling priority (here lower)",
        needs="--serial-request-metadata")
def _():
    def after(params, req, card):
        return dataclasses.replace(params, priority=None if params.priority is None else -params.priority)
    wrap_parse_generate(after=after)


@mutant("validate.generate_on_task_only_model", "Generate on a model that advertises no generation is refused",
        target="task-only")
def _():
    from openengine_adapters.types import Feature

    service = _core()
    original = service.EngineService._require

    def require(self, feature, what):
        if feature != Feature.GENERATE:
            original(self, feature, what)
    service.EngineService._require = require


# ============================================================================= lifecycle

@mutant("lifecycle.duplicate_id_accepted", "a live request id cannot be reused (ALREADY_EXISTS)")
def _():
    from openengine_adapters.core import live_requests as registry

    original = registry.RequestRegistry.register

    def register(self, request_id, kv_session_id=None):
        if request_id in self._live:
            request_id = request_id + "#dup"
        return original(self, request_id, kv_session_id)
    registry.RequestRegistry.register = register


@mutant("lifecycle.abort_unknown_answers_ok", "Abort of an unknown request id returns NOT_FOUND")
def _():
    from openengine_adapters.core import live_requests as registry

    registry.RequestRegistry.is_finished = lambda self, request_id: True


@mutant("lifecycle.abort_without_target_ok", "Abort with no target returns INVALID_ARGUMENT")
def _():
    from openengine_adapters.v1 import lifecycle_pb2

    def make(original):
        async def Abort(self, request, context):
            if request.WhichOneof("target") is None:
                return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED)
            return await original(self, request, context)
        return Abort
    patch_method(_core().EngineService, "Abort", make)


@mutant("lifecycle.abort_unknown_kv_session_ok", "Abort of an unknown KV session returns NOT_FOUND",
        smoke="lifecycle.abort_unknown_kv_session")
def _():
    from openengine_adapters.v1 import lifecycle_pb2

    def make(original):
        async def Abort(self, request, context):
            if request.WhichOneof("target") == "kv_session":
                return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ABORTED)
            return await original(self, request, context)
        return Abort
    patch_method(_core().EngineService, "Abort", make)


@mutant("lifecycle.abort_is_a_no_op", "Abort(request_id) stops the request: its outputs end CANCELLED",
        invisible="the engine ignores the abort, and the core's abort confirmation (ABORT_CONFIRM_S) then ends the "
                  "stream itself with CANCELLED finishes and releases the request: a client sees the rule kept, "
                  "2 s late, and the contract sets no deadline on an abort")
def _():
    async def abort(self, request_ids):
        self.aborted.extend(request_ids)
    fake_class().abort = abort


@mutant("lifecycle.second_abort_not_finished", "aborting a finished request again is ALREADY_FINISHED")
def _():
    from openengine_adapters.core import live_requests as registry

    original = registry.RequestRegistry.complete

    def complete(self, entry):
        original(self, entry)
        self._finished.pop(entry.request_id, None)
        self._live.pop(entry.request_id, None)
    registry.RequestRegistry.complete = complete

    def make(orig):
        from openengine_adapters.v1 import lifecycle_pb2

        async def Abort(self, request, context):
            if request.WhichOneof("target") == "request_id" and self.registry.get(request.request_id) is None:
                return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ABORTED)
            return await orig(self, request, context)
        return Abort
    patch_method(_core().EngineService, "Abort", make)


@mutant("lifecycle.cancel_keeps_engine_running", "a client cancel stops the engine's work and releases the "
        "request (running_requests returns to 0, its id is free)")
def _():
    service = _core()
    original = service.EngineService._end_request

    async def end_request(self, entry, chunks, engine_running):
        if not engine_running:  # a request the engine ended is released as usual
            await original(self, entry, chunks, engine_running)
        # else: the engine is never told to stop, and the request never released
    service.EngineService._end_request = end_request


@mutant("lifecycle.admission_unbounded", "beyond the admission limit a request is RESOURCE_EXHAUSTED")
def _():
    from openengine_adapters.core import admission

    admission.Admission.acquire = lambda self: setattr(self, "in_flight", self.in_flight + 1)


@mutant("lifecycle.admission_wrong_status", "admission/capacity exhaustion is RESOURCE_EXHAUSTED")
def _():
    from openengine_adapters.core import admission
    from openengine_adapters.errors import RequestRejected

    original = admission.Admission.acquire

    def acquire(self):
        try:
            original(self)
        except RequestRejected as r:
            r.status = grpc.StatusCode.UNAVAILABLE
            raise
    admission.Admission.acquire = acquire


@mutant("lifecycle.health_not_serving", "Health of a serving engine is READY or DEGRADED")
def _():
    from openengine_adapters.types import HealthState

    async def check_health(self):
        return [be.HealthCheckResult("scheduler", HealthState.STARTING, "fake scheduler")]
    fake_class().check_health = check_health


@mutant("lifecycle.probe_not_reported", "include_inference_probe reports an inference_probe check")
def _():
    from openengine_adapters.core import health

    original = health.HealthReporter.report

    async def report(self, probe_model=None, role=None):
        state, checks = await original(self, probe_model, *([role] if role is not None else []))
        return state, [c for c in checks if c.name != "inference_probe"]
    health.HealthReporter.report = report


@mutant("lifecycle.load_zero_omitted", "every load scalar has explicit presence: a present zero means zero "
        "(here zeros are left out)", smoke="lifecycle.load_presence")
def _():
    original = fake_class().load

    async def load(self, per_rank):
        snap = await original(self, per_rank)
        zeros = {f.name: None for f in dataclasses.fields(snap)
                 if isinstance(getattr(snap, f.name), int) and getattr(snap, f.name) == 0}
        return dataclasses.replace(snap, **zeros)
    fake_class().load = load


@mutant("lifecycle.load_used_over_total", "used_kv_blocks never exceeds total_kv_blocks")
def _():
    original = fake_class().load

    async def load(self, per_rank):
        snap = await original(self, per_rank)
        return dataclasses.replace(snap, used_kv_blocks=snap.total_kv_blocks + 1)
    fake_class().load = load


@mutant("lifecycle.load_instance_id_differs", "LoadInfo.instance_id is the EngineInfo instance_id")
def _():
    from openengine_adapters.messages import observability

    original = observability.load_info

    def load_info(snapshot, instance_id):
        return original(snapshot, instance_id + "-other")
    observability.load_info = load_info


@mutant("drain.tasks_accepted_after_drain", "after Drain(stop_accepting_new_requests) Embed/Classify/Score are "
        "refused", smoke="lifecycle.drain")
def _():
    service = _core()
    original = service.EngineService._task

    async def task(self, *args, **kwargs):
        accepting = self.lifecycle.accepting
        self.lifecycle.accepting = True
        try:
            return await original(self, *args, **kwargs)
        finally:
            if not accepting:
                self.lifecycle.accepting = False
    service.EngineService._task = task


@mutant("drain.deadline_zero_is_none", "an explicit deadline_ms = 0 means the deadline is immediate")
def _():
    from openengine_adapters.core import drain

    original = drain.run_drain

    def run_drain(request, *args, **kwargs):
        if request.HasField("deadline_ms") and request.deadline_ms == 0:
            request = _copy(request)
            request.ClearField("deadline_ms")
        return original(request, *args, **kwargs)
    drain.run_drain = run_drain
    _family("control").run_drain = run_drain


@mutant("drain.generate_accepted_after_drain", "after Drain(stop_accepting_new_requests) Generate is refused")
def _():
    from openengine_adapters.core import drain

    drain.Lifecycle.check_accepting = lambda self: None


@mutant("drain.complete_with_work_left", "COMPLETE reports present zero counts: no request remains")
def _():
    from openengine_adapters.core import drain

    original = drain._progress

    def progress(state, in_flight, sessions, message=""):
        return original(state, in_flight + (1 if state == 3 else 0), sessions, message)
    drain._progress = progress


@mutant("drain.health_ready_after_drain", "Health is not READY after a drain that stops accepting")
def _():
    from openengine_adapters.core import health

    original = health.HealthReporter.report

    async def report(self, probe_model=None, role=None):
        from openengine_adapters.types import HealthState

        state, checks = await original(self, probe_model, *([role] if role is not None else []))
        return (HealthState.READY if state == HealthState.DRAINING else state), checks
    health.HealthReporter.report = report


# ============================================================================= LoRA

@mutant("lora.conflict_accepted", "a conflicting LoRA id, name or path returns ALREADY_EXISTS", smoke="lora.lifecycle")
def _():
    def make(original):
        async def LoadLora(self, request, context):
            a = request.adapter
            for name in [n for n, o in self._loras.items() if o.lora_id == a.lora_id or n == a.lora_name]:
                if self._loras[name].source_path != a.source_path or name != a.lora_name \
                        or self._loras[name].lora_id != a.lora_id:
                    del self._loras[name]  # the new adapter replaces the conflicting one
            return await original(self, request, context)
        return LoadLora
    patch_method(_core().EngineService, "LoadLora", make)


@mutant("lora.reload_not_idempotent", "loading the same id, name and path twice is idempotent")
def _():
    def make(original):
        async def LoadLora(self, request, context):
            from openengine_adapters.errors import RequestRejected

            if request.adapter.lora_name in self._loras:
                raise RequestRejected(grpc.StatusCode.ALREADY_EXISTS, "adapter: already loaded")
            return await original(self, request, context)
        return LoadLora
    patch_method(_core().EngineService, "LoadLora", make)


@mutant("lora.relative_path_accepted", "source_path must be an absolute directory")
def _():
    import tempfile

    def make(original):
        async def LoadLora(self, request, context):
            if request.adapter.source_path and not request.adapter.source_path.startswith("/"):
                where = tempfile.mkdtemp(prefix="oe-mutant-lora-")  # taken as if it resolved somewhere
                with open(f"{where}/adapter_config.json", "w") as fh:
                    fh.write("{}")
                request.adapter.source_path = where
            return await original(self, request, context)
        return LoadLora
    patch_method(_core().EngineService, "LoadLora", make)


@mutant("lora.unload_unknown_ok", "unloading an unknown adapter returns NOT_FOUND")
def _():
    from openengine_adapters.v1 import lora_pb2

    def make(original):
        async def UnloadLora(self, request, context):
            if request.lora_name and request.lora_name not in self._loras:
                return lora_pb2.UnloadLoraResponse()
            return await original(self, request, context)
        return UnloadLora
    patch_method(_core().EngineService, "UnloadLora", make)


# ============================================================================= discovery

@mutant("identity.schema_revision_zero", "schema_revision: zero is invalid")
def _():
    from openengine_adapters import schema

    schema.SCHEMA_REVISION = 0


@mutant("identity.schema_release_branch", "schema_release is immutable: a moving branch name is not valid")
def _():
    from openengine_adapters import schema

    schema.SCHEMA_RELEASE = "main"
    schema.V0_1_SCHEMA_RELEASE = "main"


@mutant("model_info.unspecified_in_list", "capability lists never contain UNSPECIFIED")
def _():
    from openengine_adapters.messages import model

    original = model.model_info

    def model_info(card, role=None, **kw):
        msg = original(card, role, **kw) if role is not None else original(card, **kw)
        msg.generation.guided_decoding.modes.append(0)
        return msg
    model.model_info = model_info


@mutant("model_info.false_capabilities_omitted", "discovery scalars use presence: an explicit false is "
        "reported, not left out", smoke="generate.media_unadvertised")
def _():
    from openengine_adapters.messages import presence

    original = presence.fill

    def fill(msg, obj, skip=frozenset()):
        falses = frozenset(f.name for f in dataclasses.fields(obj) if getattr(obj, f.name) is False)
        return original(msg, obj, skip | falses)
    presence.fill = fill


@mutant("model_info.unknown_model_found", "GetModelInfo of an unknown model returns NOT_FOUND")
def _():
    from openengine_adapters.validation import catalog

    original = catalog.ModelCatalog.resolve

    def resolve(self, model, required=False):
        if model.startswith("conformance/"):
            return self.cards[0]
        return original(self, model, required)
    catalog.ModelCatalog.resolve = resolve


@mutant("model_info.limit_zero", "reported limits are greater than zero")
def _():
    from openengine_adapters.messages import model

    original = model.model_info

    def model_info(card, role=None, **kw):
        msg = original(card, role, **kw) if role is not None else original(card, **kw)
        msg.max_batched_tokens = 0
        return msg
    model.model_info = model_info


# ============================================================================= tasks

def _edit_task_response(method: str, edit: Callable) -> None:
    def make(original):
        async def handler(self, request, context):
            resp = await original(self, request, context)
            if resp is not None:
                edit(resp)
            return resp
        return handler
    patch_method(_core().EngineService, method, make)


@mutant("tasks.embed_input_index_zero_absent", "input_index is present even for index zero")
def _():
    _edit_task_response("Embed", lambda resp: resp.outputs[0].ClearField("input_index") if resp.outputs else None)


@mutant("tasks.classify_order_reversed", "outputs preserve request order")
def _():
    def edit(resp):
        outs = [_copy(o) for o in resp.outputs][::-1]
        del resp.outputs[:]
        resp.outputs.extend(outs)
    _edit_task_response("Classify", edit)


@mutant("tasks.embed_normalize_false_ignored", "an explicit normalize request is implemented exactly "
        "(normalize=false here still normalizes)", smoke="tasks.embed_normalize_false_reduced")
def _():
    original = fake_class().embed

    async def embed(self, p):
        return await original(self, dataclasses.replace(p, normalize=None))
    fake_class().embed = embed


@mutant("tasks.embed_normalize_true_ignored", "normalize=true gives unit L2 norm")
def _():
    original = fake_class().embed

    async def embed(self, p):
        return await original(self, dataclasses.replace(p, normalize=False if p.normalize else p.normalize))
    fake_class().embed = embed


@mutant("tasks.embed_dimensions_ignored", "dimensions=k reduces the output to k values")
def _():
    original = fake_class().embed

    async def embed(self, p):
        return await original(self, dataclasses.replace(p, dimensions=None))
    fake_class().embed = embed


@mutant("tasks.classify_semantics_ignored", "an explicit output_semantics is implemented exactly")
def _():
    from openengine_adapters.types import ValueSemantics

    original = fake_class().classify

    async def classify(self, p):
        return await original(self, dataclasses.replace(p, semantics=ValueSemantics.PROBABILITIES))
    fake_class().classify = classify


@mutant("tasks.score_labels_reversed", "the response repeats label_token_ids in the same order")
def _():
    def edit(resp):
        ids = list(resp.label_token_ids)[::-1]
        del resp.label_token_ids[:]
        resp.label_token_ids.extend(ids)
    _edit_task_response("Score", edit)


@mutant("tasks.score_softmax_skipped", "SOFTMAX normalizes across each returned label vector")
def _():
    from openengine_adapters.types import ScoreNormalization

    original = fake_class().score

    async def score(self, p):
        res = await original(self, dataclasses.replace(p, normalization=ScoreNormalization.NONE))
        return dataclasses.replace(res, normalization=p.normalization or res.normalization)
    fake_class().score = score


@mutant("tasks.empty_batch_accepted", "each request batch must be non-empty")
def _():
    from openengine_adapters.validation import tasks as vt

    original = vt.parse_embed

    def parse_embed(request, catalog, loras):
        if not request.inputs:
            request.inputs.add(item_id="x", text="x")
        return original(request, catalog, loras)
    vt.parse_embed = parse_embed
    _family("tasks").parse_embed = parse_embed


@mutant("tasks.unadvertised_priority_accepted", "a task priority is used only where the task advertises it")
def _():
    def make(original):
        async def Embed(self, request, context):
            request.context.ClearField("priority")
            return await original(self, request, context)
        return Embed
    patch_method(_core().EngineService, "Embed", make)


# ============================================================================= KV and runtime events

@mutant("kv.batch_dropped", "KV event batches keep monotonic sequence numbers: none is dropped silently",
        smoke="kv.subscribe_events")
def _():
    original = fake_class().kv_events

    async def kv_events(self, ranks, include_snapshot, start_sequence_number):
        async for batch in original(self, ranks, include_snapshot, start_sequence_number):
            if batch.sequence_number % 3 != 2:
                yield batch
    fake_class().kv_events = kv_events


@mutant("kv.replay_skips_start", "replay from start_sequence_number starts at that batch")
def _():
    original = fake_class().kv_events

    def kv_events(self, ranks, include_snapshot, start_sequence_number):
        return original(self, ranks, include_snapshot, start_sequence_number + 1 if start_sequence_number else 0)
    fake_class().kv_events = kv_events


@mutant("kv.event_source_wildcard", "endpoint_addr is a routable host:port, never a bind wildcard")
def _():
    _family("discovery").WILDCARD_HOSTS = frozenset()


@mutant("runtime.type_filter_ignored", "a subscription receives only the event types it asked for")
def _():
    original = fake_class().runtime_events

    def runtime_events(self, types):
        return original(self, [])
    fake_class().runtime_events = runtime_events


@mutant("runtime.unspecified_type_accepted", "RUNTIME_EVENT_TYPE_UNSPECIFIED is INVALID_ARGUMENT")
def _():
    def make(original):
        async def SubscribeRuntimeEvents(self, request, context):
            del request.types[:]
            async for r in original(self, request, context):
                yield r
        return SubscribeRuntimeEvents
    patch_method(_core().EngineService, "SubscribeRuntimeEvents", make)


# ============================================================================= errors

@mutant("errors.trailer_wrong_code", "the openengine-error-bin trailer carries the EngineError of the rejection "
        "(its code matches the status)")
def _():
    from openengine_adapters.types import ErrorCode
    from openengine_adapters.wire import refusal

    original = refusal.refuse

    async def refuse(context, method, r):
        r.code = ErrorCode.INTERNAL
        await original(context, method, r)
    refusal.refuse = refuse


@mutant("errors.trailer_dropped", "rejections carry the serialized EngineError in the openengine-error-bin trailer")
def _():
    from openengine_adapters.wire import refusal

    async def refuse(context, method, r):
        await context.abort(r.status, r.message)
    refusal.refuse = refuse


# ============================================================================= v0.1.0 wire

def _v01():
    from openengine_adapters.wire.v0_1 import metadata, server_mapping, servicers

    return metadata, servicers, server_mapping


@mutant("v0_1.malformed_priority_accepted", "malformed numeric metadata values return INVALID_ARGUMENT")
def _():
    metadata, _, _ = _v01()
    original = metadata._number
    metadata._number = lambda key, value, *a: original(key, value, *a) if value.lstrip("-").isdigit() else 0


@mutant("v0_1.int32_range_unchecked", "openengine-priority is a base-10 int32")
def _():
    metadata, _, _ = _v01()
    original = metadata._number

    def number(key, value, pattern, low, high, kind):
        return original(key, value, pattern, -(2**63), 2**63, kind) if kind == "int32" else \
            original(key, value, pattern, low, high, kind)
    metadata._number = number


@mutant("v0_1.repeated_key_accepted", "repeated OpenEngine metadata keys return INVALID_ARGUMENT",
        smoke="v0_1.metadata.repeated_key")
def _():
    metadata, _, _ = _v01()
    metadata.RESERVED_PREFIX = "never-reserved-"


@mutant("v0_1.dp_rank_unchecked", "openengine-target-dp-rank is a routing target: one the server cannot honour "
        "is refused, not ignored")
def _():
    metadata, servicers, _ = _v01()
    original = metadata.parse_inference

    def parse_inference(items):
        return dataclasses.replace(original(items), target_dp_rank=None)
    metadata.parse_inference = parse_inference


@mutant("v0_1.priority_metadata_dropped", "openengine-priority: higher values have higher priority (the key is "
        "dropped at the boundary)", needs="--serial-request-metadata")
def _():
    _, servicers, server_mapping = _v01()
    original = server_mapping.generate_request

    def generate_request(req, *, priority, target_dp_rank, application):
        return original(req, priority=None, target_dp_rank=target_dp_rank, application=application)
    server_mapping.generate_request = generate_request


@mutant("v0_1.kv_options_not_renumbered", "v0.1.0 KvOptions: 2 = bypass_prefix_cache, 3 = cache_salt "
        "(taken by revision 1's numbers)")
def _():
    _, _, server_mapping = _v01()

    def copy_kv_options(src, dst):  # by bytes: v0.1.0's 2 and 3 land on revision 1's 2 and 3
        dst.SetInParent()
        dst.MergeFromString(src.SerializeToString())
    server_mapping.copy_kv_options = copy_kv_options


@mutant("v0_1.internal_code_not_renumbered", "v0.1.0 ErrorCode: INTERNAL = 11 (revision 1's 12 is no v0.1.0 value)",
        smoke="v0_1.error_event", needs="--fail-request-metadata")
def _():
    _, _, server_mapping = _v01()
    server_mapping.ERROR_CODE[12] = 12


@mutant("v0_1.error_trailer_revision1_bytes", "the v0.1.0 trailer is v0.1.0's EngineError (no revision-1-only "
        "fields such as retry_after_ms)")
def _():
    _, _, server_mapping = _v01()
    server_mapping.error_trailer = lambda value: value


@mutant("v0_1.model_info_without_generation", "ModelInfo.generation advertises what the model supports")
def _():
    _, _, server_mapping = _v01()
    original = server_mapping.model_info

    def model_info(info, extra):
        out = original(info, extra)
        out.ClearField("generation")
        return out
    server_mapping.model_info = model_info


@mutant("v0_1.server_info_role_unspecified", "ServerInfo.engine_role reports the engine's role")
def _():
    _, _, server_mapping = _v01()
    original = server_mapping.server_info

    def server_info(*args, **kwargs):
        out = original(*args, **kwargs)
        out.engine_role = 0
        return out
    server_mapping.server_info = server_info


@mutant("v0_1.bad_traceparent_refused", "a malformed traceparent is ignored (W3C), never an error")
def _():
    metadata, _, _ = _v01()
    from openengine_adapters.errors import invalid

    original = metadata.trace_context

    def trace_context(items):
        items = list(items)
        for k, v in items:
            if k == metadata.TRACEPARENT and not metadata.valid_traceparent(v):
                raise invalid("traceparent: malformed")
        return original(items)
    metadata.trace_context = trace_context


@mutant("v0_1.routing_key_refused", "openengine-routing-key: an opaque non-empty ASCII routing key is accepted")
def _():
    metadata, _, _ = _v01()
    import re

    metadata._ROUTING_KEY = re.compile(r"[a-z]+")


@mutant("v0_1.unknown_extra_refused", "an engine MAY ignore extra keys it does not recognize; a request remains "
        "valid")
def _():
    from openengine_adapters.errors import invalid
    from openengine_adapters.validation import extra as ve

    original = ve.parse_extra

    def parse_extra(values, known):
        unknown = [k for k in values if k not in known]
        if unknown:
            raise invalid(f"extra.{unknown[0]}: unknown key")
        return original(values, known)
    ve.parse_extra = parse_extra
    _family("generation").parse_extra = parse_extra


@mutant("v0_1.application_metadata_dropped", "application-specific metadata keys reach the engine as request "
        "metadata", needs="--fail-request-metadata")
def _():
    _, _, server_mapping = _v01()
    original = server_mapping.generate_request

    def generate_request(req, *, priority, target_dp_rank, application):
        return original(req, priority=priority, target_dp_rank=target_dp_rank, application={})
    server_mapping.generate_request = generate_request


# ============================================================================= issue 24: the suite's blind spots
# Written as bugs an implementation plausibly has, not from the checks: (a) a task option that changes
# values, ignored or half-applied; (b) answers only v0.1.0 has (metadata keys, HealthState numbering on
# role-specific queries, ServerInfo.capacity against LoadInfo and ModelInfo); (c) an engine failure after
# tokens, reported the wrong way.

# (a) task options that change values -------------------------------------------------------------------

@mutant("tasks.embed_token_rows_not_normalized", "normalize=true is implemented exactly: every TOKEN-granularity "
        "row has unit L2 norm (here only SEQUENCE outputs are normalized)")
def _():
    from openengine_adapters.types import Granularity

    original = fake_class().embed

    async def embed(self, p):
        if p.normalize and p.granularity == Granularity.TOKEN:
            p = dataclasses.replace(p, normalize=False)
        return await original(self, p)
    fake_class().embed = embed


@mutant("tasks.embed_sparse_skips_normalization", "an encoding changes the representation, not the values: the "
        "SPARSE tensor is the DENSE one (here the sparse path skips the default normalization)")
def _():
    from openengine_adapters.types import EmbeddingEncoding

    original = fake_class().embed

    async def embed(self, p):
        if p.encoding == EmbeddingEncoding.SPARSE and p.normalize is None:
            p = dataclasses.replace(p, normalize=False)
        return await original(self, p)
    fake_class().embed = embed


@mutant("tasks.classify_logits_softmaxed", "output_semantics LOGITS is implemented exactly (here the values are "
        "probabilities labelled LOGITS)")
def _():
    from openengine_adapters.types import ValueSemantics

    original = fake_class().classify

    async def classify(self, p):
        if p.semantics != ValueSemantics.LOGITS:
            return await original(self, p)
        res = await original(self, dataclasses.replace(p, semantics=ValueSemantics.PROBABILITIES))
        res.outputs = [dataclasses.replace(o, semantics=ValueSemantics.LOGITS) for o in res.outputs]
        return res
    fake_class().classify = classify


@mutant("tasks.score_none_softmaxed", "SCORE_NORMALIZATION_NONE requests native unnormalized values (here "
        "SOFTMAX is applied and NONE reported)")
def _():
    from openengine_adapters.types import ScoreNormalization, ValueSemantics

    original = fake_class().score

    async def score(self, p):
        if p.normalization != ScoreNormalization.NONE or not p.label_token_ids:
            return await original(self, p)
        res = await original(self, dataclasses.replace(p, normalization=ScoreNormalization.SOFTMAX))
        return dataclasses.replace(res, normalization=ScoreNormalization.NONE,
                                   semantics=ValueSemantics.LOG_PROBABILITIES)
    fake_class().score = score


# (b) v0.1.0-only answers ---------------------------------------------------------------------------------

@mutant("v0_1.health_states_revision1_numbers", "v0.1.0 HealthState: NOT_READY = 4 (here revision 1's numbers "
        "pass through: a role mismatch answers 5, no v0.1.0 value)")
def _():
    _, _, server_mapping = _v01()
    from openengine_adapters.types import HealthState

    server_mapping.HEALTH_STATE = {int(s): int(s) for s in HealthState}


@mutant("v0_1.health_check_states_untranslated", "v0.1.0 HealthState numbering holds for each HealthCheck too "
        "(here only the overall state is renumbered)", smoke="v0_1.health_states")
def _():
    _, _, server_mapping = _v01()
    from openengine_adapters.v0_1 import lifecycle_pb2

    def health_response(resp):
        out = lifecycle_pb2.HealthResponse(state=server_mapping.HEALTH_STATE.get(resp.state, 0))
        for c in resp.checks:
            out.checks.add(name=c.name, state=c.state, message=c.message)
        return out
    server_mapping.health_response = health_response


@mutant("lifecycle.health_expected_role_ignored", "HealthRequest.role is the expected role of a role-specific "
        "query: a server of another role is not ready for it (here the role is ignored: READY)")
def _():
    from openengine_adapters.core import health

    original = health.HealthReporter.report

    async def report(self, probe_model=None, expected_role=None):
        return await original(self, probe_model)
    health.HealthReporter.report = report


@mutant("v0_1.capacity_total_kv_blocks_in_tokens", "ServerInfo.capacity.total_kv_blocks is the allocatable "
        "block count LoadInfo.total_kv_blocks also reports (here: tokens, blocks x kv_block_size)")
def _():
    _, _, server_mapping = _v01()
    original = server_mapping.server_info

    def server_info(*args, **kwargs):
        out = original(*args, **kwargs)
        cap = out.capacity
        if cap.HasField("total_kv_blocks") and cap.HasField("kv_block_size"):
            cap.total_kv_blocks *= cap.kv_block_size
        return out
    server_mapping.server_info = server_info


@mutant("model_info.total_kv_blocks_in_tokens", "revision 1 ModelInfo.total_kv_blocks counts the blocks "
        "LoadInfo.total_kv_blocks counts (here: tokens, blocks x kv_block_size)")
def _():
    from openengine_adapters.messages import model

    original = model.model_info

    def model_info(card, role=None, **kw):
        msg = original(card, role, **kw) if role is not None else original(card, **kw)
        if msg.HasField("total_kv_blocks") and msg.HasField("kv_block_size"):
            msg.total_kv_blocks *= msg.kv_block_size
        return msg
    model.model_info = model_info


@mutant("v0_1.capacity_unreported", "DeploymentCapacity reports the configured capacity the server knows (here "
        "left empty, while LoadInfo reports total_kv_blocks)",
        invisible="\"an absent value means the engine cannot report the value\": an engine may learn its block "
                  "count only from runtime statistics (TensorRT-LLM's maxNumBlocks, after its first iteration), "
                  "so a LoadInfo.total_kv_blocks does not oblige ServerInfo.capacity to report it; the suite "
                  "compares the two only when both are present (lifecycle.load_matches_capacity)")
def _():
    _, _, server_mapping = _v01()
    original = server_mapping.server_info

    def server_info(info, identity, default_card, release, extra):
        return original(info, identity, None, release, extra)
    server_mapping.server_info = server_info


@mutant("v0_1.model_info_repeats_capacity", "v0.1.0: KV layout and scheduler capacity are reported once through "
        "ServerInfo.capacity, not repeated as model identity (here ModelInfo keeps revision 1's fields 6-9)")
def _():
    _, _, server_mapping = _v01()
    from openengine_adapters.v0_1 import model_pb2

    def model_info(info, extra):
        out = server_mapping.recast(info, model_pb2.ModelInfo, ("tasks",))
        server_mapping._struct(out.extra, extra)
        return out
    server_mapping.model_info = model_info


@mutant("v0_1.control_rpcs_check_admission_keys", "routing and admission keys apply only to Inference RPCs "
        "(here Control RPCs parse them and refuse a malformed openengine-priority)")
def _():
    metadata, servicers, _ = _v01()

    def make(raw):
        async def handler(self, request, context):
            metadata.parse_inference(context.invocation_metadata())
            return await raw(self, request, context)
        return handler
    for name in ("GetServerInfo", "GetModelInfo", "GetLoad", "Health"):
        raw = getattr(servicers.ControlServicer, name).__wrapped__
        setattr(servicers.ControlServicer, name, servicers._unary_call(make(raw)))


# (c) an engine failure after tokens ----------------------------------------------------------------------
# Only the target can make its engine fail: no request of either contract makes a healthy engine fail
# after acceptance, and Abort, Drain and deadlines end a request as cancellations (CANCELLED finishes, or
# Drain's DRAINING error) on their own paths. These are seen with --fail-request-metadata only.

FAIL_HOOK = "--fail-request-metadata"


def _after_tokens_failure(replace: Callable) -> None:
    """Rewrite an engine failure (an INTERNAL EngineError) that follows streamed tokens: ``replace(resp,
    context)`` is awaited and returns the responses to send instead."""
    from openengine_adapters.types import ErrorCode

    service = _core()
    original = service.EngineService.Generate

    async def Generate(self, request, context, *args, **kwargs):
        tokens = False
        async for resp in original(self, request, context, *args, **kwargs):
            if resp.HasField("error") and resp.error.code == ErrorCode.INTERNAL and tokens:
                for r in await replace(resp, context):
                    yield r
                return
            tokens = tokens or resp.HasField("token")
            yield resp

    service.EngineService.Generate = Generate


@mutant("stream.engine_failure_after_tokens_as_status", "an engine failure after tokens is one terminal "
        "EngineError and gRPC OK (here a non-OK status once tokens were sent)", needs=FAIL_HOOK)
def _():
    async def replace(resp, context):
        await context.abort(grpc.StatusCode.INTERNAL, resp.error.message)
        return []
    _after_tokens_failure(replace)


@mutant("stream.engine_failure_after_tokens_as_finish", "application failure is not a GenerationFinished reason "
        "(here an engine failure after tokens ends the output CANCELLED)", needs=FAIL_HOOK)
def _():
    from openengine_adapters.v1 import generation_pb2

    async def replace(resp, context):
        out = generation_pb2.GenerateResponse(request_id=resp.request_id)
        out.finished.output_index = 0
        out.finished.reason = generation_pb2.FINISH_REASON_CANCELLED
        out.usage.CopyFrom(resp.usage)
        return [out]
    _after_tokens_failure(replace)


@mutant("stream.engine_failure_after_tokens_silent", "an accepted request that fails ends with its terminal "
        "EngineError (here the stream just closes OK after the last token)", needs=FAIL_HOOK)
def _():
    async def replace(resp, context):
        return []
    _after_tokens_failure(replace)


# ----------------------------------------------------------------------------- serving

def build_backend(target: str):
    """The fake engine a mutant is served on."""
    import fake_backend

    from openengine_adapters.types import EngineRole, Feature

    if target == "task-only":  # an embedding/classifier/scorer model: the engine cannot generate
        card = fake_backend.default_card(generation=None)
        return fake_backend.FakeBackend(cards=[card], features=fake_backend.ALL_FEATURES - {Feature.GENERATE})
    role = {"aggregated": EngineRole.AGGREGATED, "prefill": EngineRole.PREFILL,
            "decode": EngineRole.DECODE}[target]
    return fake_backend.FakeBackend(role=role)


def apply(name: str) -> Mutant:
    m = MUTANTS[name]
    m.apply()
    return m

