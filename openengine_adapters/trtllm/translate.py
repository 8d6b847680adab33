"""Pure translations between the backend seam and TensorRT-LLM's LLM API (1.2.x).

No engine is needed: these take and return plain objects (TensorRT-LLM classes are built by the
backend from the keyword arguments returned here), so they are unit-tested with tables of cases.

TensorRT-LLM streams CUMULATIVE ``CompletionOutput``s. With n > 1 each engine response updates
one sequence while the ``*_diff`` properties of the others keep returning their last diff, so
``OutputTranslator`` never reads ``*_diff``: it keeps its own per-index offsets into the
cumulative ``token_ids`` / ``text`` / ``logprobs`` lists.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.engine_kit.sessions import struct_int
from openengine_adapters.errors import EngineFailure, invalid
from openengine_adapters.sampling import common_sampling_kwargs
from openengine_adapters.types import ErrorCode, FinishReason, StorageMedium

# A handoff is laid out as TensorRT-LLM's own OpenEngine server lays it out
# (tensorrt_llm/grpc/openengine/disagg.py prefill_ready_response / disaggregated_params_from_request),
# so either side can consume the other's: KvSessionRef.session_id = str(ctx_request_id),
# dp_rank = ctx_dp_rank, and in attributes_struct opaque_state (base64), first_gen_tokens,
# draft_tokens, and where the engine's DisaggregatedParams has them disagg_request_id (a string),
# ctx_dp_rank and ctx_info_endpoint.
OPTIONAL_DISAGG_FIELDS = ("disagg_request_id", "ctx_dp_rank", "ctx_info_endpoint")


# --------------------------------------------------------------------------- request side


def logprob_count(sel: be.CandidateSelection | None) -> int:
    """TensorRT-LLM's top-k ``logprobs``/``prompt_logprobs`` count for a TOP_N selection.

    Never 0: some 1.x versions treat 0 as "off". With k >= 1 the sampled token is always
    reported with its true vocabulary rank; candidates beyond ``top_n`` are filtered out.
    """
    return max(1, sel.top_n if sel is not None else 0)


# What an absent temperature / top_p / top_k mean: sampling at temperature 1 over the whole
# vocabulary, as vLLM and TensorRT-LLM's own OpenEngine server (request_mapping.py
# sampling_params_from_request) do. Left unset, TensorRT-LLM would decode greedily
# (SamplingParams.params_imply_greedy_decoding) and refuse num_sequences > 1.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def sampling_kwargs(p: be.GenerateParams) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for a validated request: the shared options, absent
    sampling knobs at ``SAMPLING_DEFAULTS``, top_k -1 mapped to 0 and top-k logprob counts.
    ``max_tokens`` is None when the client gave none: TensorRT-LLM's worker then deduces the room left
    in its own max_seq_len (``executor/base_worker.py`` ``_deduce_max_tokens``), which the LLM object
    does not expose unless the user set it (``validation.generate.check_room`` refuses what it would
    clamp)."""
    lp = p.logprobs
    kw = common_sampling_kwargs(p, "trtllm")
    kw["max_tokens"] = p.stopping.max_tokens
    if p.sampling.top_k is not None:
        kw["top_k"] = max(p.sampling.top_k, 0)  # OpenEngine -1/0 = disabled; TensorRT-LLM 0 = all tokens
    for name, value in SAMPLING_DEFAULTS.items():
        kw.setdefault(name, value)
    if lp.output:
        kw["logprobs"] = logprob_count(lp.output_candidates)
    if lp.prompt:
        kw["prompt_logprobs"] = logprob_count(lp.prompt_candidates)
    return kw


def prompt_input(p: be.GenerateParams) -> str | dict[str, Any]:
    """``inputs`` of ``generate_async``: the text, or a token-ids prompt."""
    return p.prompt if p.prompt is not None else {"prompt_token_ids": list(p.token_ids)}


# --------------------------------------------------------------------------- disaggregation


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list | tuple):
        raise invalid(f"kv.session.attributes_struct.{name}: must be a list of token ids, got {value!r}")
    out = [struct_int(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if any(v < 0 for v in out):
        raise invalid(f"kv.session.attributes_struct.{name}: token ids must be >= 0")
    return out


def _ctx_request_id(session: be.KvSession) -> int:
    attrs = session.attributes
    if "ctx_request_id" in attrs:  # sessions of this adapter before the shared layout
        return struct_int(attrs["ctx_request_id"], "ctx_request_id")
    try:
        return int(session.session_id)
    except ValueError:
        raise invalid("kv.session.session_id: must be the integer context request id of a TensorRT-LLM "
                      f"prefill, got {session.session_id!r}") from None


def decode_disaggregated(session: be.KvSession, engine_fields: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A TensorRT-LLM prefill's KvSessionRef -> ``DisaggregatedParams`` kwargs for a
    ``generation_only`` request. Raises ``RequestRejected`` naming the bad attribute.

    ``engine_fields``: the fields of the engine's ``DisaggregatedParams``. ``opaque_state`` is
    required unless the engine takes ``ctx_info_endpoint`` and the session has one: one of them
    locates the context worker, and the engine consumes a handoff on its executor loop with no
    timeout, so a session it cannot resolve would stall every request on the engine
    (``tensorrt_llm/grpc/openengine/disagg.py`` ``_validate_kv_session`` refuses it for that reason).
    """
    attrs = session.attributes
    if "first_gen_tokens" not in attrs:
        raise invalid("kv.session.attributes_struct.first_gen_tokens: required for a TensorRT-LLM "
                      "decode (the PrefillReady session attributes)")
    kw: dict[str, Any] = {
        "request_type": "generation_only",
        "ctx_request_id": _ctx_request_id(session),
        "first_gen_tokens": _int_list(attrs["first_gen_tokens"], "first_gen_tokens"),
    }
    if not kw["first_gen_tokens"]:
        raise invalid("kv.session.attributes_struct.first_gen_tokens: must not be empty")
    state = attrs.get("opaque_state")
    if isinstance(state, str) and state:
        try:
            kw["opaque_state"] = base64.b64decode(state, validate=True)
        except (binascii.Error, ValueError):
            raise invalid("kv.session.attributes_struct.opaque_state: must be base64") from None
    elif state not in (None, ""):
        raise invalid(f"kv.session.attributes_struct.opaque_state: must be a base64 string, got "
                      f"{type(state).__name__}")
    endpoint = attrs.get("ctx_info_endpoint")
    if endpoint is not None:
        if "ctx_info_endpoint" not in engine_fields:
            raise invalid("kv.session.attributes_struct.ctx_info_endpoint: this TensorRT-LLM version cannot "
                          "locate a context worker by endpoint; the session needs opaque_state")
        if not isinstance(endpoint, str) or not endpoint:
            raise invalid("kv.session.attributes_struct.ctx_info_endpoint: must be a non-empty string")
        kw["ctx_info_endpoint"] = endpoint
    if not kw.get("opaque_state") and "ctx_info_endpoint" not in kw:
        raise invalid("kv.session.attributes_struct.opaque_state: required (it is what locates the context "
                      "worker; TensorRT-LLM would wait for a handoff it cannot resolve and stall the engine)")
    draft = attrs.get("draft_tokens")
    if draft is not None:
        kw["draft_tokens"] = _int_list(draft, "draft_tokens")
    for name in ("disagg_request_id", "ctx_dp_rank"):
        value = attrs.get(name)
        if value is None:
            continue
        if name not in engine_fields:
            raise invalid(f"kv.session.attributes_struct.{name}: this TensorRT-LLM version has no {name}; "
                          "the handoff cannot be resumed here")
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise invalid(f"kv.session.attributes_struct.{name}: must be an integer") from None
        kw[name] = struct_int(value, name)
    if "ctx_dp_rank" not in kw and session.dp_rank and "ctx_dp_rank" in engine_fields:
        kw["ctx_dp_rank"] = session.dp_rank
    return kw


def session_key(dp: Any) -> str:
    """The handoff a decode consumes: the context request and what locates its worker."""
    state = getattr(dp, "opaque_state", None)
    where = base64.b64encode(bytes(state)).decode("ascii") if state else getattr(dp, "ctx_info_endpoint", "")
    return f"{dp.ctx_request_id}@{where}"


def encode_disaggregated(dp: Any, fallback_id: str = "") -> tuple[str, int, dict[str, Any]]:
    """A prefill result's ``DisaggregatedParams`` -> (session_id, dp_rank, JSON-like attributes),
    in the layout above."""
    ctx = dp.ctx_request_id
    attrs: dict[str, Any] = {"first_gen_tokens": list(dp.first_gen_tokens or ())}
    if dp.opaque_state is not None:
        attrs["opaque_state"] = base64.b64encode(bytes(dp.opaque_state)).decode("ascii")
    if dp.draft_tokens:
        attrs["draft_tokens"] = list(dp.draft_tokens)
    for name in OPTIONAL_DISAGG_FIELDS:
        value = getattr(dp, name, None)
        if value is not None:
            attrs[name] = str(value) if name == "disagg_request_id" else value
    return ("" if ctx is None else str(ctx)) or fallback_id, int(getattr(dp, "ctx_dp_rank", None) or 0), attrs


# --------------------------------------------------------------------------- output side


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


class OutputTranslator:
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


# --------------------------------------------------------------------------- KV events


def block_hash(value: int) -> be.BlockHash:
    """TensorRT-LLM block hashes are 64-bit integers (signed or unsigned): 8 bytes, int64."""
    v = int(value) & (2**64 - 1)
    return be.BlockHash(v.to_bytes(8, "big"), "int64")


def medium(cache_level: Any) -> StorageMedium:
    """TensorRT-LLM cache levels: 0 = GPU (primary), 1 = host (secondary offload)."""
    return {0: StorageMedium.GPU, 1: StorageMedium.CPU_PINNED}.get(cache_level, StorageMedium.UNSPECIFIED)
