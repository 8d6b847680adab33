"""The server's side of the v0.1.0 surface: v0.1.0 requests -> the core's revision-1 messages, and the
core's responses -> v0.1.0 (the client's side, reversed, is ``client_mapping``).

Revision 1 is the core's message set: a superset of v0.1.0 for everything both contracts have. What
differs (upstream commits 8c93c23..dbd84b6 plus the v0.1.0 drain removals):
- ``GenerateRequest``: field 12 is ``extra`` (revision 1: ``priority``; ``metadata`` = 13), priority
  and the target DP rank travel in gRPC metadata, and ``KvOptions`` is renumbered
  (2 = bypass_prefix_cache, 3 = cache_salt; revision 1's 2 = data_parallel_rank).
- ``EngineError`` has no ``retry_after_ms``/``details``; ``ErrorCode`` and ``HealthState`` lack
  DRAINING, so INTERNAL = 11 and NOT_READY = 4.
- ``ServerInfo`` replaces EngineInfo (capacity moved in from ModelInfo, ``extra``); ``ModelInfo``
  loses the capacity fields and ``tasks`` and gains ``extra``; ``LoadInfo.attributes`` is a Struct;
  ``KvConnectorInfo`` has no ``supports_drain`` (``schema_version`` = 8).
Everything else is wire-identical (``PASSTHROUGH`` below; tests/test_wire_contract_v0_1.py pins it),
so those messages cross by their bytes, and a revision-1 ``GenerateResponse`` whose event is not an
error is already the v0.1.0 bytes: the per-token path does no translation at all.

Revision 1's DRAINING has no v0.1.0 value. A drain (SIGTERM, or revision 1's Drain RPC) is reported
on this surface as health NOT_READY and as error code OVERLOADED, retryable: the v0.1.0 code that
tells a router to send the work elsewhere. The gRPC status (UNAVAILABLE) is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from openengine_adapters import backend as be
from openengine_adapters.errors import invalid
from openengine_adapters.messages import presence
from openengine_adapters.types import ErrorCode, HealthState
from openengine_adapters.v0_1 import error_pb2, generation_pb2, kv_pb2, lifecycle_pb2, lora_pb2, model_pb2, server_pb2
from openengine_adapters.v1 import engine_pb2
from openengine_adapters.v1 import error_pb2 as rev1_error_pb2
from openengine_adapters.v1 import generation_pb2 as rev1_generation_pb2
from openengine_adapters.v1 import kv_pb2 as rev1_kv_pb2
from openengine_adapters.v1 import lifecycle_pb2 as rev1_lifecycle_pb2
from openengine_adapters.v1 import lora_pb2 as rev1_lora_pb2
from openengine_adapters.v1 import model_pb2 as rev1_model_pb2
from openengine_adapters.v1 import observability_pb2 as rev1_observability_pb2

# v0.1.0 message -> the revision-1 message with the same wire shape (fields, numbers, types).
PASSTHROUGH = {
    model_pb2.GetModelInfoRequest: rev1_model_pb2.GetModelInfoRequest,
    server_pb2.GetLoadRequest: rev1_observability_pb2.GetLoadRequest,
    lifecycle_pb2.HealthRequest: rev1_lifecycle_pb2.HealthRequest,
    lifecycle_pb2.AbortRequest: rev1_lifecycle_pb2.AbortRequest,
    lifecycle_pb2.AbortResponse: rev1_lifecycle_pb2.AbortResponse,
    lora_pb2.LoadLoraRequest: rev1_lora_pb2.LoadLoraRequest,
    lora_pb2.LoadLoraResponse: rev1_lora_pb2.LoadLoraResponse,
    lora_pb2.UnloadLoraRequest: rev1_lora_pb2.UnloadLoraRequest,
    lora_pb2.UnloadLoraResponse: rev1_lora_pb2.UnloadLoraResponse,
    lora_pb2.ListLorasRequest: rev1_lora_pb2.ListLorasRequest,
    lora_pb2.ListLorasResponse: rev1_lora_pb2.ListLorasResponse,
    kv_pb2.GetKvEventSourcesRequest: rev1_kv_pb2.GetKvEventSourcesRequest,
    kv_pb2.GetKvEventSourcesResponse: rev1_kv_pb2.GetKvEventSourcesResponse,
    kv_pb2.SubscribeKvEventsRequest: rev1_kv_pb2.SubscribeKvEventsRequest,
    kv_pb2.KvEventBatch: rev1_kv_pb2.KvEventBatch,
    kv_pb2.KvSessionRef: rev1_kv_pb2.KvSessionRef,
    generation_pb2.PromptOutput: rev1_generation_pb2.PromptOutput,
    generation_pb2.TokenOutput: rev1_generation_pb2.TokenOutput,
    generation_pb2.PrefillReady: rev1_generation_pb2.PrefillReady,
    generation_pb2.GenerationFinished: rev1_generation_pb2.GenerationFinished,
    generation_pb2.Usage: rev1_generation_pb2.Usage,
    model_pb2.GenerationCapabilities: rev1_model_pb2.GenerationCapabilities,
}


ERROR_CODE = {int(c): int(c) for c in ErrorCode if c <= ErrorCode.CANCELLED}
ERROR_CODE |= {int(ErrorCode.DRAINING): error_pb2.ERROR_CODE_OVERLOADED,
               int(ErrorCode.INTERNAL): error_pb2.ERROR_CODE_INTERNAL}

HEALTH_STATE = {int(HealthState.UNSPECIFIED): lifecycle_pb2.HEALTH_STATE_UNSPECIFIED,
                int(HealthState.STARTING): lifecycle_pb2.HEALTH_STATE_STARTING,
                int(HealthState.READY): lifecycle_pb2.HEALTH_STATE_READY,
                int(HealthState.DEGRADED): lifecycle_pb2.HEALTH_STATE_DEGRADED,
                int(HealthState.DRAINING): lifecycle_pb2.HEALTH_STATE_NOT_READY,
                int(HealthState.NOT_READY): lifecycle_pb2.HEALTH_STATE_NOT_READY}

def recast(msg, target, drop: tuple[str, ...] = ()):
    """``msg`` as the other contract's ``target`` by its bytes, less the ``drop`` fields: those whose
    number or type differs between the two contracts (the caller carries them over itself)."""
    body = type(msg)()
    body.CopyFrom(msg)
    for name in drop:
        body.ClearField(name)
    return target.FromString(body.SerializeToString())


def copy_kv_options(src, dst) -> None:
    """KvOptions' session, bypass and salt, by name (their numbers differ between the contracts)."""
    dst.SetInParent()
    if src.HasField("session"):
        dst.session.ParseFromString(src.session.SerializeToString())
    if src.HasField("bypass_prefix_cache"):
        dst.bypass_prefix_cache = src.bypass_prefix_cache
    if src.HasField("cache_salt"):
        dst.cache_salt = src.cache_salt


def generate_request(req: generation_pb2.GenerateRequest, *, priority: int | None, target_dp_rank: int | None,
                     application: Mapping[str, str]) -> rev1_generation_pb2.GenerateRequest:
    """The core's request: fields 1-11 by their bytes, KvOptions renumbered, priority and the DP
    target from metadata. ``extra`` stays out (the core takes it beside the request)."""
    for i, item in enumerate(req.media):
        if item.modality == generation_pb2.MODALITY_UNSPECIFIED:
            raise invalid(f"media[{i}].modality: must be set (MODALITY_UNSPECIFIED means the sender "
                          "left it unset, and is not taken for an image)")
    out = recast(req, rev1_generation_pb2.GenerateRequest, ("extra", "kv"))
    if req.HasField("kv"):
        copy_kv_options(req.kv, out.kv)
    if target_dp_rank is not None:
        out.kv.data_parallel_rank = target_dp_rank
    if priority is not None:
        out.priority = priority
    out.metadata.update(application)
    return out


def engine_error(err: rev1_error_pb2.EngineError) -> error_pb2.EngineError:
    return error_pb2.EngineError(code=ERROR_CODE.get(err.code, error_pb2.ERROR_CODE_UNSPECIFIED),
                                 message=err.message, retryable=err.retryable)


def error_trailer(value: bytes) -> bytes:
    """The ``openengine-error-bin`` trailer re-encoded as v0.1.0's EngineError."""
    return engine_error(rev1_error_pb2.EngineError.FromString(value)).SerializeToString()


def generate_error(resp: rev1_generation_pb2.GenerateResponse) -> generation_pb2.GenerateResponse:
    """A terminal error event in v0.1.0's shape (the only GenerateResponse that differs)."""
    out = generation_pb2.GenerateResponse(request_id=resp.request_id, error=engine_error(resp.error))
    if resp.HasField("usage"):
        out.usage.ParseFromString(resp.usage.SerializeToString())
    return out


def kv_events_error(err: rev1_error_pb2.EngineError) -> kv_pb2.SubscribeKvEventsResponse:
    return kv_pb2.SubscribeKvEventsResponse(error=engine_error(err))


DEFAULT_KV_CACHE_SPEC_KIND = "full_attention"  # vLLM's KVCacheSpecKind of a plain transformer's one group

# --kv-block-hash-encoding: "int64" (8 big-endian bytes, as upstream's text lists) or "decimal_int64" (the
# ASCII decimal of the same signed int64), the only encoding Dynamo's KV reader takes (kv.rs block_hash @0cc34d99)
INT64, DECIMAL_INT64 = "int64", "decimal_int64"


BLOCK_HASH_ENCODINGS = (INT64, DECIMAL_INT64)

KV_BLOCK_HASH_ENCODING_ENV = "OPENENGINE_KV_BLOCK_HASH_ENCODING"  # the plugins' --kv-block-hash-encoding

def kv_events_batch(response, block_hash_encoding: str = INT64):
    """A batch as v0.1.0 readers take it: vLLM (0.32) annotates every BlockStored with its KV cache
    group's kind, ``full_attention`` for a plain model, and Dynamo's KV reader (kv.rs
    ``convert_event`` @0cc34d99) refuses any BlockStored that carries a kind ("unsupported KV cache
    group/spec metadata"), ending its subscription. The default kind with no sliding window says
    nothing a router needs, and the field is optional metadata: it is left out here. Any other kind
    (sliding window, MLA, Mamba: a hybrid cache a router cannot index as one) stays. Revision 1 keeps
    the engine's annotation.

    With ``block_hash_encoding="decimal_int64"`` (``--kv-block-hash-encoding``) the ``int64`` block hashes
    go out as the decimal text of the same value, for Dynamo's KV router; other encodings stay."""
    for event in response.batch.events:
        if event.WhichOneof("event") == "block_stored":
            stored = event.block_stored
            if stored.kv_cache_spec_kind == DEFAULT_KV_CACHE_SPEC_KIND and not stored.kv_cache_spec_sliding_window:
                stored.kv_cache_spec_kind = ""
        if block_hash_encoding == DECIMAL_INT64:
            for h in _block_hashes(event):
                if h.encoding == INT64:
                    h.value, h.encoding = str(int.from_bytes(h.value, "big", signed=True)).encode(), DECIMAL_INT64
    return response


def _block_hashes(event) -> list:
    kind = event.WhichOneof("event")
    if kind == "block_stored":
        stored = event.block_stored
        return [*stored.block_hashes, *([stored.parent_block_hash] if stored.HasField("parent_block_hash") else [])]
    if kind == "block_removed":
        return list(event.block_removed.block_hashes)
    return []


# revision 1's ModelInfo fields that v0.1.0 moved into ServerInfo.capacity
CAPACITY_FIELDS = ("kv_block_size", "total_kv_blocks", "max_running_requests", "max_batched_tokens")


def _struct(target, values: Mapping[str, Any]) -> None:
    if values:
        json_format.ParseDict(dict(values), target)


def kv_connector(info: rev1_kv_pb2.KvConnectorInfo) -> kv_pb2.KvConnectorInfo:
    out = recast(info, kv_pb2.KvConnectorInfo, ("supports_drain", "schema_version"))
    if info.HasField("schema_version"):
        out.schema_version = info.schema_version
    return out


def server_info(info: engine_pb2.EngineInfo, identity: be.EngineIdentity, default_card: be.ModelCard | None,
                release: str, extra: Mapping[str, Any]) -> server_pb2.ServerInfo:
    out = server_pb2.ServerInfo(
        engine_name=info.engine_name, engine_version=info.engine_version, engine_role=info.role,
        instance_id=info.instance_id, supported_models=info.supported_models,
        kv_connector=kv_connector(info.kv_connector), schema_revision=info.schema_revision,
        minimum_client_revision=info.minimum_client_revision, schema_release=release)
    out.parallelism.ParseFromString(info.parallelism.SerializeToString())
    if identity.parallelism.decode_context_parallel_size is not None:
        out.parallelism.decode_context_parallel_size = identity.parallelism.decode_context_parallel_size
    cap = out.capacity
    cap.SetInParent()
    if default_card is not None:
        for name in CAPACITY_FIELDS:
            value = getattr(default_card, name)
            if value is not None:
                setattr(cap, name, value)
    if identity.max_loras is not None:
        cap.max_loras = identity.max_loras
    _struct(out.extra, extra)
    return out


def model_info(info: rev1_model_pb2.ModelInfo, extra: Mapping[str, Any]) -> model_pb2.ModelInfo:
    out = recast(info, model_pb2.ModelInfo, (*CAPACITY_FIELDS, "tasks"))
    _struct(out.extra, extra)
    return out


def load_info(snapshot: be.LoadSnapshot, instance_id: str) -> server_pb2.LoadInfo:
    out = presence.fill(server_pb2.LoadInfo(), snapshot, frozenset({"attributes"}))
    out.instance_id = instance_id
    _struct(out.attributes, snapshot.attributes)
    return out


def health_response(resp: rev1_lifecycle_pb2.HealthResponse) -> lifecycle_pb2.HealthResponse:
    out = lifecycle_pb2.HealthResponse(state=HEALTH_STATE.get(resp.state, lifecycle_pb2.HEALTH_STATE_UNSPECIFIED))
    for c in resp.checks:
        out.checks.add(name=c.name, state=HEALTH_STATE.get(c.state, lifecycle_pb2.HEALTH_STATE_UNSPECIFIED),
                       message=c.message)
    return out

