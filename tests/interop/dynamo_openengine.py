"""Dynamo's engine-neutral OpenEngine sidecar, replayed in Python from its Rust source.

Source: ai-dynamo/dynamo, lib/sidecar/openengine/src/{lib,engine,client,convert}.rs at commit
3770f0cf01e66ccbaf076f1b6f3ed8c72061762f (the sidecar generated from the v0.1.0 protos:
``OPENENGINE_SCHEMA_RELEASE = "768a93c7b44e40f28c692ad0b471a8f2"``). Every rule below names the
Rust function it mirrors; a ``ClientRefused`` is where that function returns an error
(``protocol_error`` / ``invalid_argument``), i.e. where the real sidecar would stop serving or
fail the request. Nothing here imports this project: it speaks the canonical v0.1.0 messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2

from openengine_adapters.v0_1 import generation_pb2 as gen
from openengine_adapters.v0_1 import kv_pb2, server_pb2

SOURCE = "ai-dynamo/dynamo lib/sidecar/openengine/src @ 3770f0cf01e66ccbaf076f1b6f3ed8c72061762f"
# lib.rs: OPENENGINE_SCHEMA_RELEASE
SCHEMA_RELEASE = "768a93c7b44e40f28c692ad0b471a8f2"
SCHEMA_REVISION = 1  # engine.rs: const SCHEMA_REVISION


class ClientRefused(AssertionError):
    """The real client would have failed here (its Rust function returned an error)."""


# --------------------------------------------------------------------------- start-up (engine.rs)


@dataclass
class Discovery:
    """engine.rs ``struct Discovery`` built by ``Discovery::from_server_info``."""

    info: server_pb2.ServerInfo
    role: int
    mode: str  # "aggregated" | "prefill" | "decode"
    model_source: str
    remote_model: str

    @classmethod
    def from_server_info(cls, info: server_pb2.ServerInfo, model_path: str | None = None) -> Discovery:
        if not info.engine_name.strip():
            raise ClientRefused("GetServerInfo returned an empty engine_name")
        if info.schema_revision < SCHEMA_REVISION or info.minimum_client_revision > SCHEMA_REVISION:
            raise ClientRefused(f"incompatible schema revisions: server={info.schema_revision}, "
                                f"minimum_client={info.minimum_client_revision}, client={SCHEMA_REVISION}")
        if info.schema_release != SCHEMA_RELEASE:
            raise ClientRefused(f"server schema_release `{info.schema_release}` does not match `{SCHEMA_RELEASE}`")
        modes = {server_pb2.ENGINE_ROLE_AGGREGATED: "aggregated", server_pb2.ENGINE_ROLE_PREFILL: "prefill",
                 server_pb2.ENGINE_ROLE_DECODE: "decode"}
        if info.engine_role == server_pb2.ENGINE_ROLE_UNSPECIFIED:
            raise ClientRefused("GetServerInfo returned an unspecified engine role")
        if info.engine_role not in modes:
            raise ClientRefused(f"unknown engine role {info.engine_role}")
        mode = modes[info.engine_role]
        if len(info.supported_models) != 1:
            raise ClientRefused("this initial sidecar requires exactly one supported model; server returned "
                                f"{len(info.supported_models)}")
        (remote_model,) = info.supported_models
        if not remote_model.strip():
            raise ClientRefused("GetServerInfo returned an empty supported model")
        if mode != "aggregated":
            if not info.HasField("kv_connector"):
                raise ClientRefused("disaggregated server omitted kv_connector")
            connector = info.kv_connector
            if not (connector.HasField("enabled") and connector.enabled) or not connector.transfer_backend.strip():
                raise ClientRefused("disaggregated server did not advertise an enabled KV transfer backend")
        return cls(info, info.engine_role, mode, model_path or remote_model, remote_model)

    def ensure_same_server(self, observed: Discovery) -> None:
        """engine.rs ``ensure_same_server``: bootstrap discovery against the one in ``start``."""
        if (self.info.engine_name != observed.info.engine_name
                or self.info.schema_release != observed.info.schema_release
                or self.role != observed.role or self.remote_model != observed.remote_model):
            raise ClientRefused("OpenEngine identity, role, schema, or model changed during startup")

    def engine_config(self) -> dict[str, Any]:
        """engine.rs ``engine_config``: what Dynamo registers (the KV router's block size and capacity)."""
        cap = self.info.capacity if self.info.HasField("capacity") else None
        par = self.info.parallelism if self.info.HasField("parallelism") else None

        def opt(msg, name):
            return getattr(msg, name) if msg is not None and msg.HasField(name) else None

        dp_size = opt(par, "data_parallel_size")
        start = opt(par, "data_parallel_start_rank")
        return {
            "served_model_name": self.remote_model,
            "runtime_data": {"grpc_service": "openengine.v1.Inference",
                             "openengine_schema_release": self.info.schema_release,
                             "engine_name": self.info.engine_name},
            "kv_cache_block_size": opt(cap, "kv_block_size"),
            "total_kv_blocks": opt(cap, "total_kv_blocks"),
            "max_num_seqs": opt(cap, "max_running_requests"),
            "max_num_batched_tokens": opt(cap, "max_batched_tokens"),
            "data_parallel_size": dp_size if dp_size else None,
            "data_parallel_start_rank": start if start is not None else opt(par, "data_parallel_rank"),
        }


def start_up(control, model_path: str | None = None, timeout: float = 30.0) -> Discovery:
    """``bootstrap_discover`` then ``LLMEngine::start``: GetServerInfo twice, the second compared to the
    first. (The v0.1.0 sidecar calls no GetModelInfo and no Health before serving.)"""
    from openengine_adapters.v0_1 import server_pb2 as s

    boot = Discovery.from_server_info(control.GetServerInfo(s.GetServerInfoRequest(), timeout=timeout), model_path)
    observed = Discovery.from_server_info(control.GetServerInfo(s.GetServerInfoRequest(), timeout=timeout),
                                          boot.model_source)
    boot.ensure_same_server(observed)
    return observed


# --------------------------------------------------------------------------- requests (convert.rs)


@dataclass
class Preprocessed:
    """The fields of Dynamo's ``PreprocessedRequest`` that convert.rs reads."""

    token_ids: list[int]
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int | None = None
    include_stop_str_in_output: bool | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_token_ids_hidden: list[int] | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = None  # output_options.logprobs
    prompt_logprobs: int | None = None
    guided_decoding: dict | None = None
    priority: int | None = None  # routing.priority
    dp_rank: int | None = None
    prefill_dp_rank: int | None = None
    cache_namespace: str | None = None
    extra_args: dict = field(default_factory=dict)
    prefill_result: Any = None  # PrefillResult.disaggregated_params (JSON)
    trace: dict = field(default_factory=dict)  # ctx.metadata(): traceparent / tracestate


def _validate_request(r: Preprocessed, mode: str) -> None:
    """convert.rs ``validate_request`` (the parts a text request can reach)."""
    if not r.token_ids:
        raise ClientRefused("token_ids must not be empty")
    if (mode == "decode") != (r.prefill_result is not None):
        raise ClientRefused("decode requests require a prefill_result KV session" if mode == "decode"
                            else "only decode requests may carry a prefill_result KV session")
    if r.prompt_logprobs is not None:
        raise ClientRefused("prompt logprobs are not supported by this OpenEngine sidecar")
    if r.guided_decoding is not None:
        raise ClientRefused("guided decoding is not implemented by the TensorRT-LLM OpenEngine server")
    if _prefix_cache_bypass(r) is True:
        raise ClientRefused("prefix-cache bypass is not implemented by the TensorRT-LLM OpenEngine server")
    if (r.n or 1) != 1:
        raise ClientRefused("n must be 1")


def _prefix_cache_bypass(r: Preprocessed) -> bool | None:
    """convert.rs ``prefix_cache_bypass``: ``extra_args.bypass_prefix_cache`` or ``disable_prefix_cache``."""
    for key in ("bypass_prefix_cache", "disable_prefix_cache"):
        if isinstance(r.extra_args.get(key), bool):
            return r.extra_args[key]
    return None


def _normalize_top_k(top_k: int | None) -> int | None:
    if top_k in (None, -1, 0):
        return None
    if top_k > 0:
        return top_k
    raise ClientRefused(f"top_k must be -1, 0, or positive; got {top_k}")


def build_generate_request(r: Preprocessed, request_id: str, model: str, mode: str) -> gen.GenerateRequest:
    """convert.rs ``build_generate_request``: token ids, every sampling field as sent (present iff the
    user set it), max_tokens 1 on prefill, TopN(logprobs) with ``return_output_logprobs`` on every
    role, empty ResponseOptions/KvOptions messages always present, ``cache_salt`` from the routing
    cache namespace, the decode session from the JSON handoff; no guided, media, LoRA or extra."""
    _validate_request(r, mode)
    stop_ids = sorted(set((r.stop_token_ids or []) + (r.stop_token_ids_hidden or [])))
    conditions = [gen.StopCondition(stop_text=t) for t in (r.stop or [])]
    conditions += [gen.StopCondition(stop_token_id=i) for i in stop_ids]
    session = disagg_json_to_kv_session(r.prefill_result) if mode == "decode" else None
    if r.seed is not None and r.seed < 0:
        raise ClientRefused(f"seed must be non-negative; got {r.seed}")

    def some(**kw):
        return {k: v for k, v in kw.items() if v is not None}

    sampling = gen.SamplingParams(**some(
        temperature=r.temperature, top_p=r.top_p, top_k=_normalize_top_k(r.top_k), min_p=r.min_p,
        frequency_penalty=r.frequency_penalty, presence_penalty=r.presence_penalty,
        repetition_penalty=r.repetition_penalty, seed=r.seed, num_sequences=r.n))
    stopping = gen.StoppingOptions(conditions=conditions, **some(
        max_tokens=1 if mode == "prefill" else r.max_tokens, min_tokens=r.min_tokens, ignore_eos=r.ignore_eos,
        include_stop_in_output=r.include_stop_str_in_output))
    response = gen.ResponseOptions()
    if r.logprobs is not None:
        response.return_output_logprobs = True
        response.output_candidates.top_n = r.logprobs  # TopN(0) when the user asked logprobs=0
    kv = gen.KvOptions()
    if session is not None:
        kv.session.CopyFrom(session)
    if (bypass := _prefix_cache_bypass(r)) is not None:
        kv.bypass_prefix_cache = bypass
    if r.cache_namespace is not None:
        kv.cache_salt = r.cache_namespace
    req = gen.GenerateRequest(request_id=request_id, model=model, token_ids=gen.TokenIds(ids=r.token_ids),
                              sampling=sampling, stopping=stopping)
    req.response.CopyFrom(response)  # Some(ResponseOptions{..}): present even when empty
    req.kv.CopyFrom(kv)  # Some(KvOptions{..}): present even when empty
    return req


def generate_metadata(r: Preprocessed, mode: str) -> list[tuple[str, str]]:
    """convert.rs ``generate_metadata``: traceparent/tracestate from the request context, the routing
    priority as ``openengine-priority``, the target rank on aggregated and prefill legs (never decode)."""
    md = [(k, r.trace[k]) for k in ("traceparent", "tracestate") if k in r.trace]
    if r.priority is not None:
        md.append(("openengine-priority", str(r.priority)))
    rank = {"prefill": r.prefill_dp_rank if r.prefill_dp_rank is not None else r.dp_rank,
            "aggregated": r.dp_rank}.get(mode)
    if rank is not None:
        md.append(("openengine-target-dp-rank", str(rank)))
    return md


# --------------------------------------------------------------------------- the stream reader (convert.rs)


@dataclass
class Output:
    """What ``ResponseState::convert`` yields (an ``LLMEngineOutput``), reduced to what tests check."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] | None = None
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None
    disaggregated_params: dict | None = None


class ResponseState:
    """convert.rs ``ResponseState``: the sidecar's strict reader of one Generate stream. Feed every
    response to ``convert``; ``read`` drives a whole stream the way engine.rs ``generate`` does
    (stop at the first terminal output; a stream that ends before it is an error)."""

    REASONS = {gen.FINISH_REASON_STOP: "stop", gen.FINISH_REASON_LENGTH: "length",
               gen.FINISH_REASON_CANCELLED: "cancelled"}

    def __init__(self, mode: str, prompt_tokens: int) -> None:
        self.mode = mode
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0

    def convert(self, response: gen.GenerateResponse, request_id: str) -> Output | None:
        if response.request_id != request_id:
            raise ClientRefused(f"Generate returned request_id `{response.request_id}` on stream `{request_id}`")
        has_usage = response.HasField("usage")
        if has_usage:
            self.prompt_tokens = response.usage.prompt_tokens
            self.completion_tokens = response.usage.completion_tokens
        kind = response.WhichOneof("event")
        if kind == "token":
            token = response.token
            if self.mode == "prefill" or has_usage:
                raise ClientRefused("Generate returned a token event for prefill or with terminal usage")
            if not token.HasField("output_index"):
                raise ClientRefused("token event omitted required output_index")
            if token.output_index != 0:
                raise ClientRefused(f"received unsupported output index {token.output_index}")
            self.completion_tokens += len(token.tokens)
            if not token.tokens and not token.text:
                return None
            has_lp = any(t.HasField("logprob") for t in token.tokens)
            return Output(token_ids=[t.token_id for t in token.tokens],
                          log_probs=[t.logprob if t.HasField("logprob") else -math.inf for t in token.tokens]
                          if has_lp else None)
        if kind == "prefill_ready":
            if self.mode != "prefill":
                raise ClientRefused("Generate returned PrefillReady for a non-prefill worker")
            if not response.prefill_ready.HasField("kv_session"):
                raise ClientRefused("PrefillReady omitted required kv_session")
            if not has_usage:
                raise ClientRefused("PrefillReady omitted terminal usage")
            return Output(finish_reason="stop", usage=(response.usage.prompt_tokens, response.usage.completion_tokens),
                          disaggregated_params=kv_session_to_disagg_json(response.prefill_ready.kv_session))
        if kind == "finished":
            finished = response.finished
            if self.mode == "prefill":
                raise ClientRefused("Generate returned GenerationFinished for a prefill worker")
            if not finished.HasField("output_index"):
                raise ClientRefused("GenerationFinished omitted required output_index")
            if finished.output_index != 0:
                raise ClientRefused(f"received unsupported output index {finished.output_index}")
            if not has_usage:
                raise ClientRefused("GenerationFinished omitted terminal usage")
            if finished.reason not in self.REASONS:
                raise ClientRefused("GenerationFinished used an unspecified finish reason"
                                    if finished.reason == gen.FINISH_REASON_UNSPECIFIED
                                    else f"unknown OpenEngine finish reason {finished.reason}")
            return Output(finish_reason=self.REASONS[finished.reason],
                          usage=(response.usage.prompt_tokens, response.usage.completion_tokens))
        if kind == "error":
            raise ClientRefused(f"server error {response.error.code}: {response.error.message}")
        if kind == "prompt":
            raise ClientRefused("Generate returned prompt logprobs that were not requested")
        raise ClientRefused("Generate response carried no event")

    def read(self, responses, request_id: str) -> list[Output]:
        """engine.rs ``generate``'s loop: outputs up to and with the terminal one. The stream is then
        dropped by the sidecar: ``rest`` counts what the server sent after it (must be nothing)."""
        outs: list[Output] = []
        it = iter(responses)
        for response in it:
            out = self.convert(response, request_id)
            if out is not None:
                outs.append(out)
                if out.finish_reason is not None:
                    self.rest = list(it)
                    if self.rest:
                        raise ClientRefused(f"{len(self.rest)} responses after the terminal one")
                    return outs
        raise ClientRefused("Generate ended before a terminal response")


# --------------------------------------------------------------------------- the JSON handoff (convert.rs)


def _prost_value_to_json(value: struct_pb2.Value) -> Any:
    """convert.rs ``prost_value_to_json``: an integral double becomes ``value as i64`` (Rust's
    saturating cast), any other finite double a JSON float, a non-finite one JSON null."""
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        v = value.number_value
        if math.isfinite(v) and v == int(v):
            return max(-(2**63), min(2**63 - 1, int(v)))
        if math.isnan(v) or math.isinf(v):  # fract() is NaN: serde_json::Number::from_f64 -> None -> Null
            return None
        return v
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [_prost_value_to_json(v) for v in value.list_value.values]
    return {k: _prost_value_to_json(v) for k, v in value.struct_value.fields.items()}


def _json_to_prost_value(value: Any) -> struct_pb2.Value:
    """convert.rs ``json_to_prost_value``: a JSON number becomes ``as_f64``."""
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int | float):
        out.number_value = float(value)
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, list):
        out.list_value.values.extend(_json_to_prost_value(v) for v in value)
    else:
        for k, v in value.items():
            out.struct_value.fields[k].CopyFrom(_json_to_prost_value(v))
    return out


def kv_session_to_disagg_json(session: kv_pb2.KvSessionRef) -> dict:
    """convert.rs ``kv_session_to_disagg_json`` (prefill worker -> Dynamo's ``disaggregated_params``)."""
    return {
        "session_id": session.session_id,
        "transfer_backend": session.transfer_backend,
        "endpoints": [{"host": e.host, "port": e.port, "protocol": e.protocol} for e in session.endpoints],
        "dp_rank": session.dp_rank,
        "attributes_struct": ({k: _prost_value_to_json(v) for k, v in session.attributes_struct.fields.items()}
                              if session.HasField("attributes_struct") else None),
    }


def _u32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def disagg_json_to_kv_session(value: Any) -> kv_pb2.KvSessionRef:
    """convert.rs ``disagg_json_to_kv_session`` (Dynamo's handoff -> the decode request's session)."""
    if not isinstance(value, dict):
        raise ClientRefused("prefill_result.disaggregated_params must be an object")
    for key in ("session_id", "transfer_backend"):
        if not (isinstance(value.get(key), str) and value[key]):
            raise ClientRefused(f"handoff `{key}` must be a non-empty string")
    if not isinstance(value.get("endpoints"), list):
        raise ClientRefused("handoff `endpoints` must be an array")
    endpoints = []
    for e in value["endpoints"]:
        if not isinstance(e, dict):
            raise ClientRefused("handoff endpoint must be an object")
        if not (isinstance(e.get("host"), str) and e["host"]):
            raise ClientRefused("handoff endpoint host must be non-empty")
        if not _u32(e.get("port")):
            raise ClientRefused("handoff endpoint port must be a uint32")
        if not (isinstance(e.get("protocol"), str) and e["protocol"]):
            raise ClientRefused("handoff endpoint protocol must be non-empty")
        endpoints.append(kv_pb2.KvEndpoint(host=e["host"], port=e["port"], protocol=e["protocol"]))
    attrs = value.get("attributes_struct")
    if attrs is not None and not isinstance(attrs, dict):
        raise ClientRefused("handoff `attributes_struct` must be an object or null")
    if not _u32(value.get("dp_rank")):
        raise ClientRefused("handoff `dp_rank` must be a uint32")
    out = kv_pb2.KvSessionRef(session_id=value["session_id"], transfer_backend=value["transfer_backend"],
                              endpoints=endpoints, dp_rank=value["dp_rank"])
    if attrs is not None:
        for k, v in attrs.items():
            out.attributes_struct.fields[k].CopyFrom(_json_to_prost_value(v))
    return out
