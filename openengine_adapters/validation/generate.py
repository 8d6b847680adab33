"""GenerateRequest -> GenerateParams, enforcing every rule of the spec before acceptance.

Each failure is a ``RequestRejected`` whose message names the field and the rule. Options the
model card does not advertise are rejected when explicitly present (presence, not truthiness),
never ignored: that is revision 1's reading. The v0.1.0 surface passes a ``Leniency``: upstream's
text and its clients read some of those requests as servable (``validation.leniency``), and each is
accepted here, in this one place, and counted.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace

from openengine_adapters.backend import (
    CandidateSelection,
    GenerateParams,
    GenerationSupport,
    Guided,
    LogprobRequest,
    LogprobSupport,
    Media,
    ModelCard,
    Sampling,
    Stopping,
)
from openengine_adapters.errors import invalid, not_found, role_mismatch, unsupported
from openengine_adapters.sampling import REAL_FIELDS
from openengine_adapters.types import CandidateMode, EngineRole, ErrorCode, GuidedMode
from openengine_adapters.v1 import generation_pb2
from openengine_adapters.validation.inputs import (
    check_finite,
    check_media,
    check_token_ids,
    check_unique,
    media_modality,
)
from openengine_adapters.validation.kv import parse_kv_session
from openengine_adapters.validation.leniency import IGNORE, Leniency

_NO_GENERATION = GenerationSupport()
_GUIDED_FIELDS = {
    "json_schema": GuidedMode.JSON_SCHEMA,
    "regex": GuidedMode.REGEX,
    "ebnf_grammar": GuidedMode.EBNF_GRAMMAR,
    "structural_tag": GuidedMode.STRUCTURAL_TAG,
    "choice": GuidedMode.CHOICE,
    "json_object": GuidedMode.JSON_OBJECT,
}


@dataclass(frozen=True)
class EngineContext:
    """What validation needs to know about the engine beyond the model card."""

    role: EngineRole
    data_parallel_size: int
    loaded_loras: Collection[str]
    transfer_backend: str = ""
    local_decode_refusal: str | None = None  # EngineBackend.local_decode_refusal


def parse_generate(
    req: generation_pb2.GenerateRequest, request_id: str, card: ModelCard, engine: EngineContext,
    lenient: Leniency | None = None,
) -> GenerateParams:
    """``lenient``: the v0.1.0 surface's reading (module docstring); None is revision 1's."""
    gen = card.generation or _NO_GENERATION
    prompt, token_ids = _parse_input(req, card)
    sampling = _parse_sampling(req, gen, lenient) if req.HasField("sampling") else Sampling()
    # v0.1.0 prefill: the decode leg's min_tokens comes along with the prefill's max_tokens 1 (capped below)
    prefill_leg = lenient is not None and engine.role == EngineRole.PREFILL
    stopping = _parse_stopping(req, card, gen, lenient, prefill_leg) if req.HasField("stopping") else Stopping()
    logprobs = _parse_response(req, gen, token_ids) if req.HasField("response") else LogprobRequest()
    guided = _parse_guided(req.guided, gen) if req.HasField("guided") else None
    media = _parse_media(req, card)

    if req.lora_name:
        if not card.supports_lora:
            raise unsupported("lora_name: this model does not support LoRA adapters")
        if req.lora_name not in engine.loaded_loras:
            raise not_found(f"lora_name: adapter {req.lora_name!r} is not loaded", ErrorCode.MODEL_NOT_FOUND)
    priority = None
    if req.HasField("priority"):
        if gen.supports_priority:
            priority = req.priority
        elif lenient is not None:  # upstream: "used only when the model advertises priority support"
            lenient.priority(card.names[0])
        else:
            raise unsupported("priority: this model does not advertise priority scheduling")

    session = dp_rank = bypass = salt = None
    if req.HasField("kv"):
        kv = req.kv
        if kv.HasField("session"):
            session = parse_kv_session(kv.session, "kv.session", engine.transfer_backend)
        if kv.HasField("data_parallel_rank"):
            dp_rank = check_dp_rank(kv.data_parallel_rank, engine.data_parallel_size, "kv.data_parallel_rank")
        if kv.HasField("bypass_prefix_cache"):
            if gen.supports_prefix_cache_bypass:
                bypass = kv.bypass_prefix_cache
            elif lenient is None or kv.bypass_prefix_cache:  # false asks for what every engine does
                raise unsupported("kv.bypass_prefix_cache: prefix-cache bypass is not advertised")
        if kv.HasField("cache_salt") and not (lenient is not None and not kv.cache_salt):  # "" salts nothing
            if not gen.supports_cache_salt:
                raise unsupported("kv.cache_salt: cache salting is not advertised")
            if not kv.cache_salt:
                raise invalid("kv.cache_salt: must be non-empty when set")
            salt = kv.cache_salt

    params = GenerateParams(
        request_id=request_id,
        model=card.names[0],
        prompt=prompt,
        token_ids=token_ids,
        sampling=sampling,
        stopping=stopping,
        logprobs=logprobs,
        guided=guided,
        media=media,
        lora_name=req.lora_name,
        priority=priority,
        metadata=dict(req.metadata),
        kv_session=session,
        data_parallel_rank=dp_rank,
        bypass_prefix_cache=bypass,
        cache_salt=salt,
    )
    _check_role(params, engine.role, lenient is not None)
    if lenient is not None and engine.role == EngineRole.DECODE and session is None and engine.local_decode_refusal:
        raise role_mismatch(f"kv.session: required here: {engine.local_decode_refusal}")
    if engine.role == EngineRole.PREFILL:  # one rule for every engine: the prefill samples one token
        min_tokens = params.stopping.min_tokens
        params = replace(params, stopping=replace(
            params.stopping, max_tokens=1, min_tokens=None if min_tokens is None else min(min_tokens, 1)))
    return params


def _parse_input(req, card: ModelCard) -> tuple[str | None, tuple[int, ...] | None]:
    which = req.WhichOneof("input")
    if which is None:
        raise invalid("input: exactly one of prompt or token_ids must be set")
    if which == "prompt":
        if not card.supports_text_input:
            raise unsupported("prompt: this model does not accept text input; send token_ids")
        if not req.prompt:
            raise invalid("prompt: must be non-empty")
        return req.prompt, None
    if not card.supports_token_ids_input:
        raise unsupported("token_ids: this model does not accept token-id input; send prompt")
    ids = tuple(req.token_ids.ids)
    check_token_ids(ids, "token_ids.ids")
    # a text prompt's length is known only once the engine tokenizes it: the engine refuses it then
    if card.max_context_length and len(ids) > card.max_context_length:
        raise invalid(f"token_ids.ids: the prompt has {len(ids)} tokens, more than the model's "
                      f"max_context_length {card.max_context_length}")
    return None, ids


def check_dp_rank(rank: int, data_parallel_size: int, field: str) -> int:
    """A target data-parallel rank the engine has (``field``: where the surface carries it)."""
    if rank >= data_parallel_size:
        raise invalid(f"{field}: {rank} is out of range for data_parallel_size {data_parallel_size}")
    return rank


def check_room(prompt_len: int, max_tokens: int | None, max_context: int | None) -> None:
    """The prompt leaves room to generate, and the tokens asked for fit, within the context length:
    for an engine that would clamp ``max_tokens`` silently instead (TensorRT-LLM's worker,
    ``executor/base_worker.py`` ``_deduce_max_tokens``), called once it has counted a text prompt."""
    if max_context is None:
        return
    if max_tokens is not None and prompt_len + max_tokens > max_context:
        raise invalid(f"stopping.max_tokens: prompt ({prompt_len} tokens) + max_tokens "
                      f"({max_tokens}) exceeds the context length {max_context}")
    if prompt_len >= max_context:
        raise invalid(f"input: the prompt ({prompt_len} tokens) leaves no room to generate within "
                      f"the context length {max_context}")


def _parse_sampling(req, gen: GenerationSupport, lenient: Leniency | None) -> Sampling:
    s = req.sampling
    opt = {}
    for f in REAL_FIELDS:  # the sampling table: every value finite, then each in its range
        if s.HasField(f.name):
            value = getattr(s, f.name)
            check_finite(value, f"sampling.{f.name}")
            opt[f.name] = value
    for f in REAL_FIELDS:
        if f.name in opt and not f.within(opt[f.name]):
            raise invalid(f"sampling.{f.name}: {f.rule}")
    if s.HasField("top_k"):
        if s.top_k < -1:
            raise invalid("sampling.top_k: must be -1 or 0 (disabled) or a positive count")
        opt["top_k"] = s.top_k
    if s.HasField("seed"):
        opt["seed"] = s.seed
    for ignored in gen.ignored_options:  # options this engine would not apply: refused, or dropped
        if ignored.name in opt and opt[ignored.name] not in ignored.neutral:
            field = f"sampling.{ignored.name}"
            if lenient is None or lenient.ignored_options != IGNORE:
                raise unsupported(f"{field}: {ignored.reason}")
            lenient.option(field, ignored.reason)
            del opt[ignored.name]
    n = 1
    if s.HasField("num_sequences"):
        n = s.num_sequences
        if n == 0:
            raise invalid("sampling.num_sequences: must be > 0 when present")
        limit = gen.max_num_sequences or 1
        if n > limit:
            raise unsupported(f"sampling.num_sequences: {n} exceeds max_num_sequences {limit}")
    return Sampling(num_sequences=n, **opt)


def _parse_stopping(req, card: ModelCard, gen: GenerationSupport, lenient: Leniency | None,
                    prefill_leg: bool = False) -> Stopping:
    s = req.stopping
    max_tokens = min_tokens = ignore_eos = include = None
    if s.HasField("max_tokens"):
        max_tokens = s.max_tokens
        if max_tokens == 0:
            raise invalid("stopping.max_tokens: must be > 0 when present")
        if card.max_output_tokens is not None and max_tokens > card.max_output_tokens:
            raise invalid(
                f"stopping.max_tokens: {max_tokens} exceeds max_output_tokens {card.max_output_tokens}"
            )
    if s.HasField("min_tokens"):
        min_tokens = s.min_tokens
        if max_tokens is not None and min_tokens > max_tokens and not prefill_leg:
            raise invalid("stopping.min_tokens: must not exceed stopping.max_tokens")
    texts, ids = [], []
    for i, cond in enumerate(s.conditions):
        which = cond.WhichOneof("condition")
        if which is None:
            raise invalid(f"stopping.conditions[{i}]: exactly one of stop_text or stop_token_id must be set")
        if which == "stop_text":
            if not cond.stop_text:
                raise invalid(f"stopping.conditions[{i}].stop_text: must be non-empty")
            texts.append(cond.stop_text)
        else:
            ids.append(cond.stop_token_id)
    texts = list(dict.fromkeys(texts))  # a stop string given twice is one stop string
    if gen.max_stop_strings is not None and len(texts) > gen.max_stop_strings:
        raise invalid(f"stopping.conditions: at most {gen.max_stop_strings} stop strings")
    if s.HasField("ignore_eos"):
        ignore_eos = s.ignore_eos
    if s.HasField("include_stop_in_output"):
        if gen.supports_stop_in_output:
            include = s.include_stop_in_output
        elif lenient is None or s.include_stop_in_output:  # false: what an engine does without the option
            raise unsupported("stopping.include_stop_in_output: not advertised by this model")
    return Stopping(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_texts=tuple(texts),
        stop_token_ids=tuple(dict.fromkeys(ids)),
        ignore_eos=ignore_eos,
        include_stop_in_output=include,
    )


def _candidates(sel, support: LogprobSupport, field: str) -> CandidateSelection:
    which = sel.WhichOneof("selection")
    if which is None:
        raise invalid(f"{field}: exactly one of top_n, token_ids or all must be set")
    mode = {"top_n": CandidateMode.TOP_N, "token_ids": CandidateMode.TOKEN_IDS,
            "all": CandidateMode.ALL}[which]
    if mode not in support.candidate_selection_modes:
        raise unsupported(f"{field}.{which}: candidate selection mode {mode.name} is not advertised")
    if mode == CandidateMode.TOP_N:
        if support.max_top_n is not None and sel.top_n > support.max_top_n:
            raise unsupported(f"{field}.top_n: {sel.top_n} exceeds max_top_n {support.max_top_n}")
        return CandidateSelection(mode, top_n=sel.top_n)
    if mode == CandidateMode.TOKEN_IDS:
        ids = tuple(sel.token_ids.ids)
        check_token_ids(ids, f"{field}.token_ids.ids")
        check_unique(ids, f"{field}.token_ids.ids")
        if support.max_token_ids is not None and len(ids) > support.max_token_ids:
            raise invalid(f"{field}.token_ids: at most {support.max_token_ids} ids")
        return CandidateSelection(mode, token_ids=ids)
    return CandidateSelection(mode)


def _parse_response(req, gen: GenerationSupport, token_ids) -> LogprobRequest:
    r = req.response
    prompt = r.return_prompt_logprobs if r.HasField("return_prompt_logprobs") else False
    output = r.return_output_logprobs if r.HasField("return_output_logprobs") else False
    psup = gen.prompt_logprobs or LogprobSupport()
    osup = gen.output_logprobs or LogprobSupport()
    if prompt and not psup.supported:
        raise unsupported("response.return_prompt_logprobs: prompt logprobs are not advertised")
    if output and not osup.supported:
        raise unsupported("response.return_output_logprobs: output logprobs are not advertised")
    pc = oc = start = None
    if r.HasField("prompt_candidates"):
        if not prompt:
            raise invalid("response.prompt_candidates: requires return_prompt_logprobs = true")
        pc = _candidates(r.prompt_candidates, psup, "response.prompt_candidates")
    if r.HasField("output_candidates"):
        if not output:
            raise invalid("response.output_candidates: requires return_output_logprobs = true")
        oc = _candidates(r.output_candidates, osup, "response.output_candidates")
    if r.HasField("prompt_logprob_start"):
        if not prompt:
            raise invalid("response.prompt_logprob_start: requires return_prompt_logprobs = true")
        start = r.prompt_logprob_start
        if token_ids is not None and start >= len(token_ids):
            raise invalid(
                f"response.prompt_logprob_start: {start} is not a prompt position "
                f"(prompt has {len(token_ids)} tokens)"
            )
    return LogprobRequest(prompt=prompt, prompt_candidates=pc, prompt_start=start, output=output,
                          output_candidates=oc)


def _parse_guided(g, gen: GenerationSupport) -> Guided:
    which = g.WhichOneof("guide")
    if which is None:
        raise invalid("guided: exactly one guide (json_schema, regex, ebnf_grammar, "
                      "structural_tag, choice, json_object) must be set")
    mode = _GUIDED_FIELDS[which]
    support = gen.guided_decoding
    if support is None or not support.supported or mode not in support.modes:
        raise unsupported(f"guided.{which}: guided decoding mode {mode.name} is not advertised")
    if g.backend and support.backend is not None and g.backend != support.backend:
        raise invalid(f"guided.backend: {g.backend!r} differs from the engine's grammar backend "
                      f"{support.backend!r} (set per engine, not per request)")
    if mode == GuidedMode.CHOICE:
        choices = tuple(g.choice.choices)
        if not choices:
            raise invalid("guided.choice.choices: must contain at least one choice")
        if any(not c for c in choices):
            raise invalid("guided.choice.choices: every choice must be non-empty")
        check_unique(choices, "guided.choice.choices")
        return Guided(mode, choices, g.backend)
    if mode == GuidedMode.JSON_OBJECT:
        return Guided(mode, None, g.backend)
    value = getattr(g, which)
    if not value:
        raise invalid(f"guided.{which}: must be non-empty")
    if mode in (GuidedMode.JSON_SCHEMA, GuidedMode.STRUCTURAL_TAG):
        try:
            doc = json.loads(value)
        except ValueError as exc:
            raise invalid(f"guided.{which}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict | bool):
            raise invalid(f"guided.{which}: must be a JSON object")
    return Guided(mode, value, g.backend)


def _parse_media(req, card: ModelCard) -> tuple[Media, ...]:
    if not req.media:
        return ()
    check_media(req.media, "media", card.media_modalities if card.supports_multimodal else None)
    return tuple(parse_media_item(m) for m in req.media)


def parse_media_item(m) -> Media:
    source = m.WhichOneof("source")
    return Media(
        modality=media_modality(m),
        url=m.url if source == "url" else None,
        data_uri=m.data_uri if source == "data_uri" else None,
        raw_bytes=m.raw_bytes if source == "raw_bytes" else None,
        mime_type=m.mime_type,
        uuid=m.uuid,
    )


def _check_role(p: GenerateParams, role: EngineRole, lenient: bool = False) -> None:
    """Role/request compatibility (spec: validated before acceptance, non-OK status). ``lenient`` (v0.1.0):
    a DECODE engine serves a request without a session locally (conditional disaggregation: Dynamo's
    TensorRT-LLM sidecar skips the prefill worker for short prompts; TensorRT-LLM's own server serves
    it as a plain request), and a PREFILL request may carry the decode leg's output options (its one
    sampled token honours them where the engine samples the first token there; see docs/interop.md)."""
    if role == EngineRole.DECODE and p.kv_session is None and not lenient:
        raise role_mismatch("kv.session: a DECODE engine requires a KV session to decode from")
    if role in (EngineRole.AGGREGATED, EngineRole.UNSPECIFIED) and p.kv_session is not None:
        raise role_mismatch("kv.session: an AGGREGATED engine does not attach to KV sessions")
    if role == EngineRole.PREFILL:
        if p.kv_session is not None:
            raise role_mismatch("kv.session: a PREFILL engine builds sessions, it does not decode them")
        if p.sampling.num_sequences > 1:
            raise role_mismatch("sampling.num_sequences: a PREFILL engine does not generate outputs")
        if p.stopping.max_tokens is not None and p.stopping.max_tokens > 1:
            raise role_mismatch("stopping.max_tokens: a PREFILL engine does not perform decode "
                                "generation (absent or 1)")
        if p.logprobs.output and not lenient:
            raise role_mismatch("response.return_output_logprobs: a PREFILL engine emits no output tokens")
        if p.guided is not None and not lenient:
            raise role_mismatch("guided: a PREFILL engine does not perform constrained decoding")
