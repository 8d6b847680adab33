"""Dynamo's TensorRT-LLM sidecar (its OpenEngine client), replayed in Python from its Rust source.

Sources (ai-dynamo/dynamo):
- lib/sidecar/trtllm/src/{convert,client,engine}.rs at 11db6893d5e47019acb007796daf015e74eb1bda: the
  request (``build_generate_request``: max_tokens derived from GetModelInfo's max_context_length,
  logprobs asked on the prefill leg too, TopN floored at 1, ``num_sequences`` 1), the stream reader
  (``ResponseState``), start-up (``GetModelInfo(model=<--model-path>)``), Abort outcomes.
- lib/sidecar/trtllm/src/disagg.rs at 1d54a636193d71d6a0be29f77899a1d5244c3b20: the ``extra`` keys
  (``detokenize: false`` always, ``request_type: "context_only"`` on the prefill leg,
  ``conversation_id``) and the handoff JSON (``session_id, transfer_backend, endpoints, dp_rank,
  attributes``; ``attributes`` required).
- lib/sidecar/trtllm/deploy/agg.yaml at 11db6893...: the Kubernetes start-up and readiness probes,
  ``ControlStub.Health(HealthRequest(), timeout=3)``, ready iff ``HEALTH_STATE_READY``.
The handoff's attributes pass through dynamo_sidecar_common's ``struct_to_json``/``json_to_struct``
(lib/sidecar/common/src/json.rs, not in the stored index): a Struct number JSON cannot carry
exactly (NaN, an infinity, an integral value past 2^53) is refused there; ``strict_number`` below
is that rule as the issue states it, and the v0.1.0 proto says the same of Struct numbers.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dynamo_openengine import ClientRefused, Output, Preprocessed, _json_to_prost_value, _normalize_top_k
from google.protobuf import struct_pb2

from openengine_adapters.v0_1 import generation_pb2 as gen
from openengine_adapters.v0_1 import kv_pb2, model_pb2
from openengine_adapters.v0_1 import lifecycle_pb2 as life

SOURCE = "ai-dynamo/dynamo lib/sidecar/trtllm/src @ 11db6893d5e47019acb007796daf015e74eb1bda"
RPC_TIMEOUT_S = 30.0  # client.rs: RPC_TIMEOUT
PROBE_TIMEOUT_S = 3.0  # deploy/agg.yaml: Health(..., timeout=3)


def start_up(control, model_path: str) -> int:
    """engine.rs ``start``: ``GetModelInfo(model=<--model-path>)`` within 30 s; a missing or zero
    ``max_context_length`` fails start-up. Returns the context length ``generate`` derives from."""
    info = control.GetModelInfo(model_pb2.GetModelInfoRequest(model=model_path), timeout=RPC_TIMEOUT_S)
    if not (info.HasField("max_context_length") and info.max_context_length > 0):
        raise ClientRefused("Control.GetModelInfo reported no max_context_length for this model")
    return info.max_context_length


def probe(control) -> bool:
    """deploy/agg.yaml's startupProbe/readinessProbe: Health with a 3 s deadline, READY or not."""
    return control.Health(life.HealthRequest(), timeout=PROBE_TIMEOUT_S).state == life.HEALTH_STATE_READY


def request_extra(context_only: bool, conversation_id: str | None = None) -> struct_pb2.Struct:
    """disagg.rs ``request_extra``."""
    extra = struct_pb2.Struct()
    extra.update({"detokenize": False})
    if context_only:
        extra.update({"request_type": "context_only"})
    if conversation_id is not None:
        extra.update({"conversation_id": conversation_id})
    return extra


def max_tokens(r: Preprocessed, context_length: int | None) -> int:
    """convert.rs ``max_tokens``: the user's, else ``max(1, context_length - prompt_len)``."""
    if r.max_tokens is not None:
        return r.max_tokens
    if context_length is None:
        raise ClientRefused("TensorRT-LLM requires max_tokens, and the server reported no model context length")
    return max(1, context_length - len(r.token_ids))


def _validate_request(r: Preprocessed, mode: str) -> None:
    """convert.rs ``validate_request`` (the parts a text request can reach)."""
    if not r.token_ids:
        raise ClientRefused("token_ids must not be empty")
    if r.prefill_result is not None and mode != "decode":
        raise ClientRefused("received a prefill_result on a worker not in decode mode")
    if r.prompt_logprobs is not None:
        raise ClientRefused("prompt logprobs are not supported by the TensorRT-LLM sidecar")
    if r.dp_rank is not None or r.prefill_dp_rank is not None:
        raise ClientRefused("KV-aware data-parallel routing is not supported by the TensorRT-LLM sidecar")
    if r.cache_namespace:
        raise ClientRefused("cache namespace isolation is not supported by the TensorRT-LLM sidecar")
    if r.priority:
        raise ClientRefused("request priority is not supported by the TensorRT-LLM sidecar")
    if r.include_stop_str_in_output:
        raise ClientRefused("include_stop_str_in_output is not supported by the TensorRT-LLM sidecar")
    if (r.n or 1) != 1:
        raise ClientRefused("n must be 1")


def _guided(r: Preprocessed) -> gen.GuidedDecoding | None:
    """convert.rs ``guided_decoding``: json (a value is rendered to its JSON text), regex, grammar,
    structural tag; one at most, ``backend`` empty."""
    g = r.guided_decoding
    if g is None:
        return None
    guides = []
    for key, field in (("json", "json_schema"), ("regex", "regex"), ("grammar", "ebnf_grammar"),
                       ("structural_tag", "structural_tag")):
        if key in g:
            value = g[key]
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            guides.append((field, text))
    if "choice" in g:
        raise ClientRefused("guided decoding `choice` is not supported by the TensorRT-LLM OpenEngine server")
    if len(guides) > 1:
        raise ClientRefused("only one guided decoding constraint may be set")
    if not guides:
        return None
    field, text = guides[0]
    return gen.GuidedDecoding(**{field: text})


def build_generate_request(r: Preprocessed, request_id: str, model: str, context_length: int | None,
                           mode: str, conversation_id: str | None = None) -> gen.GenerateRequest:
    """convert.rs ``build_generate_request`` with disagg.rs ``request_extra``."""
    _validate_request(r, mode)
    stop_ids = sorted(set((r.stop_token_ids or []) + (r.stop_token_ids_hidden or [])))
    conditions = [gen.StopCondition(stop_text=t) for t in (r.stop or [])]
    conditions += [gen.StopCondition(stop_token_id=i) for i in stop_ids]
    if r.seed is not None and r.seed < 0:
        raise ClientRefused(f"seed must be non-negative; got {r.seed}")

    def some(**kw):
        return {k: v for k, v in kw.items() if v is not None}

    sampling = gen.SamplingParams(num_sequences=1, **some(
        temperature=r.temperature, top_p=r.top_p, top_k=_normalize_top_k(r.top_k), min_p=r.min_p,
        frequency_penalty=r.frequency_penalty, presence_penalty=r.presence_penalty,
        repetition_penalty=r.repetition_penalty, seed=r.seed))
    stopping = gen.StoppingOptions(
        max_tokens=1 if mode == "prefill" else max_tokens(r, context_length), conditions=conditions,
        **some(min_tokens=None if mode == "prefill" else r.min_tokens, ignore_eos=r.ignore_eos))
    response = gen.ResponseOptions(return_output_logprobs=r.logprobs is not None)  # Some(false) when not asked
    if r.logprobs is not None:
        response.output_candidates.top_n = max(1, r.logprobs)  # output_candidates: floored at 1
    req = gen.GenerateRequest(request_id=request_id, model=model, token_ids=gen.TokenIds(ids=r.token_ids),
                              sampling=sampling, stopping=stopping,
                              extra=request_extra(mode == "prefill", conversation_id))
    req.response.CopyFrom(response)
    if (guided := _guided(r)) is not None:
        req.guided.CopyFrom(guided)
    if mode == "decode":
        if r.prefill_result is None:
            raise ClientRefused("decode request is missing the prefill_result KV handoff")
        req.kv.CopyFrom(gen.KvOptions(session=session_from_json(r.prefill_result)))
    return req


class ResponseState:
    """convert.rs ``ResponseState``: a missing output_index reads as 0 (unlike the openengine
    sidecar), tokens on a prefill leg are dropped, ``PrefillReady`` is the prefill leg's terminal, a
    selected-token logprob is required on every token when logprobs were asked."""

    REASONS = {gen.FINISH_REASON_STOP: "stop", gen.FINISH_REASON_LENGTH: "length",
               gen.FINISH_REASON_CANCELLED: "cancelled"}

    def __init__(self, r: Preprocessed, mode: str) -> None:
        self.prompt_tokens = len(r.token_ids)
        self.completion_tokens = 0
        self.output_logprobs = r.logprobs
        self.mode = mode

    def convert(self, response: gen.GenerateResponse) -> Output | None:
        kind = response.WhichOneof("event")
        if kind == "token":
            if self.mode == "prefill":
                return None
            token = response.token
            if token.output_index:
                raise ClientRefused(f"received unsupported output index {token.output_index}")
            ids = [t.token_id for t in token.tokens]
            self.completion_tokens += len(ids)
            if not ids:
                return None
            log_probs = None
            if self.output_logprobs is not None:
                for t in token.tokens:
                    if not t.HasField("logprob"):
                        raise ClientRefused(f"token {t.token_id} is missing its logprob")
                log_probs = [t.logprob for t in token.tokens]
            return Output(token_ids=ids, log_probs=log_probs)
        if kind == "finished":
            finished = response.finished
            if finished.output_index:
                raise ClientRefused(f"received unsupported output index {finished.output_index}")
            if response.HasField("usage"):
                if response.usage.prompt_tokens:
                    self.prompt_tokens = response.usage.prompt_tokens
                if response.usage.completion_tokens:
                    self.completion_tokens = response.usage.completion_tokens
            if finished.reason not in self.REASONS:
                raise ClientRefused("terminal response has an unspecified finish reason"
                                    if finished.reason == gen.FINISH_REASON_UNSPECIFIED
                                    else f"unknown finish reason {finished.reason}")
            return Output(finish_reason=self.REASONS[finished.reason],
                          usage=(self.prompt_tokens, self.completion_tokens))
        if kind == "error":
            raise ClientRefused(f"TensorRT-LLM engine error: {response.error.message}")
        if kind == "prompt":
            raise ClientRefused("received an unexpected prompt event; prompt logprobs are not requested")
        if kind == "prefill_ready":
            if self.mode != "prefill":
                raise ClientRefused("received a prefill_ready event on a worker that is not in prefill mode")
            if not response.prefill_ready.HasField("kv_session"):
                raise ClientRefused("prefill_ready event carried no kv_session")
            return Output(finish_reason="length", usage=(self.prompt_tokens, 0),
                          disaggregated_params=session_to_json(response.prefill_ready.kv_session))
        raise ClientRefused("response carried no event")

    def read(self, responses) -> list[Output]:
        """engine.rs ``generate``: outputs up to and with the terminal one (then the stream is dropped)."""
        outs = []
        for response in responses:
            out = self.convert(response)
            if out is not None:
                outs.append(out)
                if out.finish_reason is not None:
                    return outs
        raise ClientRefused("Generate ended before a terminal response")


def abort_ok(response) -> None:
    """client.rs ``abort``: ABORTED or ALREADY_FINISHED; anything else is protocol drift."""
    if response.status not in (life.ABORT_STATUS_ABORTED, life.ABORT_STATUS_ALREADY_FINISHED):
        raise ClientRefused(f"TensorRT-LLM returned an unexpected abort status: {response.message}")


# --------------------------------------------------------------------------- the JSON handoff (disagg.rs)


def strict_number(value: float, where: str) -> int | float:
    """A Struct number as JSON, refusing what JSON cannot carry exactly (see the module docstring)."""
    if not math.isfinite(value):
        raise ClientRefused(f"{where}: non-finite number {value!r} in prefill handoff attributes")
    if value == int(value):
        if abs(value) > 2**53:
            raise ClientRefused(f"{where}: integer {value!r} past 2^53 in prefill handoff attributes")
        return int(value)
    return value


def _struct_to_json(value: struct_pb2.Value, where: str) -> Any:
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return None
    if kind == "number_value":
        return strict_number(value.number_value, where)
    if kind == "list_value":
        return [_struct_to_json(v, f"{where}[{i}]") for i, v in enumerate(value.list_value.values)]
    if kind == "struct_value":
        return {k: _struct_to_json(v, f"{where}.{k}") for k, v in value.struct_value.fields.items()}
    return getattr(value, kind)


def session_to_json(session: kv_pb2.KvSessionRef) -> dict:
    """disagg.rs ``session_to_json``: session_id and attributes_struct required."""
    if not session.session_id:
        raise ClientRefused("prefill_ready carried no kv_session.session_id")
    if not session.HasField("attributes_struct"):
        raise ClientRefused("prefill_ready carried no kv_session.attributes_struct")
    attributes = {k: _struct_to_json(v, k) for k, v in session.attributes_struct.fields.items()}
    return {"session_id": session.session_id, "transfer_backend": session.transfer_backend,
            "endpoints": [{"host": e.host, "port": e.port, "protocol": e.protocol} for e in session.endpoints],
            "dp_rank": session.dp_rank, "attributes": attributes}


def session_from_json(value: Any) -> kv_pb2.KvSessionRef:
    """disagg.rs ``session_from_json``: every field required (serde), unknown ones accepted."""
    keys = ("session_id", "transfer_backend", "endpoints", "dp_rank", "attributes")
    if not isinstance(value, dict) or any(k not in value for k in keys):
        raise ClientRefused("decode request prefill_result.disaggregated_params is not a TensorRT-LLM handoff")
    if not value["session_id"]:
        raise ClientRefused("decode request prefill handoff has an empty session_id")
    out = kv_pb2.KvSessionRef(session_id=value["session_id"], transfer_backend=value["transfer_backend"],
                              endpoints=[kv_pb2.KvEndpoint(**e) for e in value["endpoints"]],
                              dp_rank=value["dp_rank"])
    for k, v in value["attributes"].items():
        out.attributes_struct.fields[k].CopyFrom(_json_to_prost_value(v))
    return out
