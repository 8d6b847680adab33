"""Pure translations between the backend seam and SGLang's native engine API (0.5.x).

No engine is needed: these take and return plain dicts and objects (SGLang's ``GenerateReqInput``
is built by the backend from the keyword arguments returned here), so they are unit-tested with
tables of cases.

SGLang streams CUMULATIVE chunks (``incremental_streaming_output`` off, its default): every
chunk carries the whole ``output_ids`` / ``text`` / logprob lists so far, and intermediate chunks
may alias SGLang's live lists. ``OutputTranslator.delta`` therefore slices what is new at once,
with its own per-output offsets, before the caller awaits anything.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import outputs
from openengine_adapters.engine_kit.guided import choice_regex
from openengine_adapters.engine_kit.sessions import struct_int
from openengine_adapters.errors import EngineFailure, invalid
from openengine_adapters.sampling import REAL_FIELDS, set_sampling
from openengine_adapters.types import CandidateMode, ErrorCode, FinishReason, GuidedMode

# SGLang's stop-string limit (``SamplingParams.normalize``): more are refused there.
MAX_STOP_STRINGS = 32
# The KvSessionRef.attributes_struct keys of an SGLang PD handoff (the bootstrap rendezvous).
SESSION_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "prefill_dp_rank")
# SGLang's FAKE_BOOTSTRAP_HOST (disaggregation/utils.py): no peer, no transfer (warmup, health).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
_MAX_SAFE_INT = 2**53
_ROOM_LIMIT = 2**63  # SGLang keeps bootstrap rooms in int64 tensors


# --------------------------------------------------------------------------- request ids


def engine_rids(request_id: str, n: int, salt: str | None = None) -> list[str]:
    """SGLang request ids for the n outputs of one OpenEngine request.

    SGLang's scheduler aborts every request whose rid STARTS WITH the aborted rid, so these ids
    must never prefix one another nor any other request's: each starts with a fixed-length random
    salt shared only by this request, then the index closed by ``|`` (so ``-1|`` can never prefix
    ``-10|``), then the client's id for readability in SGLang's logs.
    """
    salt = salt or uuid.uuid4().hex
    return [f"oe{salt}-{i}|{request_id}" for i in range(n)]


def derived_seed(seed: int, index: int) -> int:
    """Output ``index``'s sampling seed: the request seed for index 0, a splitmix64 mix for the
    others (n identical seeds would give n identical samples), kept in SGLang's int64 range."""
    if index == 0:
        return seed if seed < 2**63 else seed - 2**64
    z = (seed + 0x9E3779B97F4A7C15 * index) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) >> 1


# --------------------------------------------------------------------------- request side


def guided_kwargs(g: be.Guided) -> dict[str, str]:
    """The SGLang sampling_params constraint: choice lowered to a regex and json_object to the
    schema ``{"type": "object"}``, as SGLang's own OpenAI layer does."""
    if g.mode == GuidedMode.JSON_SCHEMA:
        return {"json_schema": g.value}
    if g.mode == GuidedMode.REGEX:
        return {"regex": g.value}
    if g.mode == GuidedMode.EBNF_GRAMMAR:
        return {"ebnf": g.value}
    if g.mode == GuidedMode.STRUCTURAL_TAG:
        return {"structural_tag": g.value}
    if g.mode == GuidedMode.CHOICE:
        return {"regex": choice_regex(g.value)}
    if g.mode == GuidedMode.JSON_OBJECT:
        return {"json_schema": json.dumps({"type": "object"})}
    raise invalid(f"guided: unsupported mode {g.mode!r}")


# v0.1.0 GenerateRequest.extra keys this adapter applies: SGLang sampling parameters with no portable field
REQUEST_EXTRA = {
    "skip_special_tokens": be.ExtraKey("bool", "SGLang sampling_params.skip_special_tokens (default true)"),
    "spaces_between_special_tokens": be.ExtraKey(
        "bool", "SGLang sampling_params.spaces_between_special_tokens (default true)"),
}


def sampling_params(p: be.GenerateParams, index: int = 0) -> dict[str, Any]:
    """SGLang's ``sampling_params`` dict for output ``index`` of a validated request.

    Only options the client set are passed (presence), except ``max_new_tokens``, which is always
    explicit: SGLang's default is 128, while an absent OpenEngine max_tokens means "up to the
    context length" (None: SGLang bounds it by the context). ``n`` is always 1: the backend issues
    one SGLang request per output.
    """
    s, st = p.sampling, p.stopping
    sp: dict[str, Any] = {"max_new_tokens": st.max_tokens}
    sp.update(set_sampling(p, "sglang", REAL_FIELDS))  # top_k and seed are mapped by value below
    if s.top_k is not None:
        sp["top_k"] = s.top_k if s.top_k > 0 else -1  # OpenEngine 0/-1 = disabled; SGLang -1 = all
    if s.seed is not None:
        sp["sampling_seed"] = derived_seed(s.seed, index)
    if st.min_tokens is not None:
        sp["min_new_tokens"] = st.min_tokens
    if st.stop_texts:
        sp["stop"] = list(st.stop_texts)
    if st.stop_token_ids:
        # With ignore_eos SGLang does not stop on them (the adapter matches them, OutputTranslator)
        # but still masks them during min_new_tokens.
        sp["stop_token_ids"] = list(st.stop_token_ids)
    if st.ignore_eos is not None:
        sp["ignore_eos"] = st.ignore_eos
    if st.include_stop_in_output is not None:
        sp["no_stop_trim"] = st.include_stop_in_output
    if p.guided is not None:
        sp.update(guided_kwargs(p.guided))
    sp.update(p.extra)  # already checked against REQUEST_EXTRA (names are SGLang's)
    return sp


def top_logprobs_num(lp: be.LogprobRequest) -> int:
    """SGLang has one ``top_logprobs_num`` for prompt and output: the larger TOP_N asked (each side
    is cut back to its own n when translated)."""
    n = 0
    for want, sel in ((lp.prompt, lp.prompt_candidates), (lp.output, lp.output_candidates)):
        if want and sel is not None and sel.mode == CandidateMode.TOP_N:
            n = max(n, sel.top_n)
    return n


def request_kwargs(p: be.GenerateParams, rid: str, index: int = 0, *,
                   disagg: Mapping[str, Any] | None = None, low_priority_first: bool = False) -> dict[str, Any]:
    """``GenerateReqInput`` keyword arguments for output ``index`` (one SGLang request).
    ``low_priority_first``: SGLang runs with ``--schedule-low-priority-values-first``."""
    kw: dict[str, Any] = {"rid": rid, "stream": True,
                          "sampling_params": sampling_params(p, index)}
    if p.prompt is not None:
        kw["text"] = p.prompt
    else:
        kw["input_ids"] = list(p.token_ids)
    lp = p.logprobs
    if lp.prompt or lp.output:
        kw["return_logprob"] = True
        kw["return_text_in_logprobs"] = True
        # -1: no prompt logprobs. SGLang reports no logprob for the first position it returns, so
        # a start > 0 asks one position earlier and prompt_tokens() drops it.
        kw["logprob_start_len"] = max(0, (lp.prompt_start or 0) - 1) if lp.prompt else -1
        top = top_logprobs_num(lp)
        if top:
            kw["top_logprobs_num"] = top
        sel = lp.output_candidates
        if lp.output and sel is not None and sel.mode == CandidateMode.TOKEN_IDS:
            kw["token_ids_logprob"] = list(sel.token_ids)
    if p.lora_name:
        kw["lora_path"] = p.lora_name  # SGLang resolves the registered adapter name
    if p.priority is not None:  # OpenEngine: higher runs first, as SGLang's default
        kw["priority"] = -p.priority if low_priority_first else p.priority
    if p.cache_salt is not None:
        kw["cache_salt"] = p.cache_salt
    if p.data_parallel_rank is not None:
        kw["routed_dp_rank"] = p.data_parallel_rank
    if p.trace_headers:
        kw["external_trace_header"] = dict(p.trace_headers)  # used when SGLang runs with --enable-trace
    if disagg:
        kw.update(disagg)
    return kw


# --------------------------------------------------------------------------- disaggregation


def new_bootstrap_room() -> int:
    """A random bootstrap room (SGLang's router picks them the same way: 63 random bits)."""
    return uuid.uuid4().int & (_ROOM_LIMIT - 1)


def encode_session(host: str, port: int, room: int, prefill_dp_rank: int) -> dict[str, Any]:
    """KvSessionRef.attributes_struct of an SGLang handoff. Struct numbers are doubles, so a room
    above 2^53 travels as a decimal string."""
    return {"bootstrap_host": host, "bootstrap_port": port,
            "bootstrap_room": room if room < _MAX_SAFE_INT else str(room), "prefill_dp_rank": prefill_dp_rank}


def decode_session(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """KvSessionRef.attributes_struct -> the ``GenerateReqInput`` bootstrap fields of a decode
    request (the same rendezvous the prefill request used). Raises ``RequestRejected`` naming the
    bad attribute."""
    for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        if key not in attributes:
            raise invalid(f"kv.session.attributes_struct.{key}: required for an SGLang decode "
                          "(the PrefillReady session attributes)")
    host = attributes["bootstrap_host"]
    if not isinstance(host, str) or not host:
        raise invalid("kv.session.attributes_struct.bootstrap_host: must be a non-empty string")
    port = struct_int(attributes["bootstrap_port"], "bootstrap_port")
    if not 0 < port < 65536:
        raise invalid(f"kv.session.attributes_struct.bootstrap_port: {port} is not a port")
    room = struct_int(attributes["bootstrap_room"], "bootstrap_room")
    if not 0 <= room < _ROOM_LIMIT:
        raise invalid("kv.session.attributes_struct.bootstrap_room: must be in [0, 2^63)")
    kw = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    if attributes.get("prefill_dp_rank") is not None:
        rank = struct_int(attributes["prefill_dp_rank"], "prefill_dp_rank")
        if rank < 0:
            raise invalid("kv.session.attributes_struct.prefill_dp_rank: must be >= 0")
        kw["disagg_prefill_dp_rank"] = rank
    return kw


def session_key(disagg: Mapping[str, Any]) -> str:
    """The handoff a decode consumes: its bootstrap rendezvous (host, port, room)."""
    return f"{disagg['bootstrap_host']}:{disagg['bootstrap_port']}/{disagg['bootstrap_room']}"


# --------------------------------------------------------------------------- output side


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


class OutputTranslator:
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


# --------------------------------------------------------------------------- load


def load_snapshot(loads: Sequence[Any], page_size: int, per_rank: bool) -> be.LoadSnapshot:
    """SGLang ``get_loads()`` snapshots (one per DP rank) -> LoadSnapshot. SGLang counts KV in
    tokens; blocks are pages (``page_size`` tokens)."""
    page = max(1, int(page_size or 1))

    def blocks(tokens: Any) -> int | None:
        return None if tokens is None else -(-int(tokens) // page)

    ranks = []
    for s in loads:
        ranks.append(be.RankLoad(
            data_parallel_rank=getattr(s, "dp_rank", None),
            running_requests=getattr(s, "num_running_reqs", None),
            queued_requests=getattr(s, "num_waiting_reqs", None),
            used_kv_blocks=blocks(getattr(s, "num_used_tokens", None)),
            total_kv_blocks=(None if getattr(s, "max_total_num_tokens", None) is None
                             else int(s.max_total_num_tokens) // page),
        ))

    def total(name: str) -> int | None:
        values = [getattr(r, name) for r in ranks]
        return None if not values or any(v is None for v in values) else sum(values)

    waiting = [getattr(s, "num_waiting_uncached_tokens", None) for s in loads]
    timestamps = [getattr(s, "timestamp", None) for s in loads]
    return be.LoadSnapshot(
        timestamp_unix_nanos=int(max(timestamps) * 1e9) if timestamps and None not in timestamps else None,
        running_requests=total("running_requests"),
        queued_requests=total("queued_requests"),
        used_kv_blocks=total("used_kv_blocks"),
        total_kv_blocks=total("total_kv_blocks"),
        running_tokens=sum(int(getattr(s, "num_used_tokens", 0) or 0) for s in loads) if loads else None,
        waiting_tokens=sum(int(w) for w in waiting) if waiting and None not in waiting else None,
        ranks=tuple(ranks) if per_rank else (),
        attributes={"page_size": str(page)},
    )


def with_in_flight(snap: be.LoadSnapshot, in_flight: int) -> be.LoadSnapshot:
    """Count what is in flight the moment it is. SGLang publishes its ``get_loads`` snapshot on a
    prefill and then every 15 decode steps (and when idle), so a request that runs can read as
    ``running 0`` until the next one; every engine request the adapter holds and SGLang does not
    report queued is running (TensorRT-LLM's own tests pin that in-flight work is counted:
    NVIDIA/TensorRT-LLM tests/unittest/grpc/openengine/). Per-rank rows stay SGLang's."""
    if snap.running_requests is None:
        return snap
    running = max(snap.running_requests, in_flight - (snap.queued_requests or 0))
    return dataclasses.replace(snap, running_requests=running)


# --------------------------------------------------------------------------- KV events


def kv_events_config(raw: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """SGLang's ``--kv-events-config`` JSON -> dict; ``None`` unless it configures a ZMQ publisher."""
    if not raw:
        return None
    cfg = json.loads(raw) if isinstance(raw, str) else dict(raw)
    if cfg.get("publisher", "null") != "zmq":
        return None
    cfg.setdefault("endpoint", "tcp://*:5557")
    return cfg

