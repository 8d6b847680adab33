"""Seam dataclasses -> discovery/observation messages, honouring proto3 presence both ways.

The seam's dataclasses use the proto field names, so one generic copier serves every message:
``None`` stays absent, an explicit ``0``/``False`` is set (and so present), lists and maps are
copied, nested dataclasses recurse into their sub-message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import IntEnum

from google.protobuf import json_format

from openengine_adapters import backend as be
from openengine_adapters.types import EngineRole
from openengine_adapters.v1 import engine_pb2, kv_pb2, model_pb2, observability_pb2


def fill(msg, obj, skip: frozenset[str] = frozenset()):
    """Copy a seam dataclass into the same-named fields of ``msg``; return ``msg``."""
    for f in dataclasses.fields(obj):
        if f.name in skip or not f.metadata.get("wire", True):
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            fill(getattr(msg, f.name), value)
        elif isinstance(value, Mapping):
            getattr(msg, f.name).update(value)
        elif isinstance(value, tuple | list):
            target = getattr(msg, f.name)
            if value and dataclasses.is_dataclass(value[0]):
                for item in value:
                    fill(target.add(), item)
            else:
                target.extend(int(v) if isinstance(v, IntEnum) else v for v in value)
        else:
            setattr(msg, f.name, int(value) if isinstance(value, IntEnum) else value)
    return msg


def card_problems(obj, path: str = "") -> list[str]:
    """Where a model card breaks the discovery rules: UNSPECIFIED (0) in a capability list, or
    a reported limit/dimension that is not > 0."""
    problems = []
    for f in dataclasses.fields(obj):
        if not f.metadata.get("wire", True):
            continue
        value = getattr(obj, f.name)
        where = f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            problems += card_problems(value, where + ".")
        elif isinstance(value, tuple) and value and isinstance(value[0], IntEnum):
            if any(int(v) == 0 for v in value):
                problems.append(f"{where} contains UNSPECIFIED")
        elif isinstance(value, int) and not isinstance(value, bool) and value <= 0 and (
                f.name.startswith(("max_", "total_")) or f.name in ("dimension", "kv_block_size")):
            problems.append(f"{where} must be > 0, got {value}")
    return problems


def model_info(card: be.ModelCard, role: EngineRole = EngineRole.AGGREGATED) -> model_pb2.ModelInfo:
    msg = fill(model_pb2.ModelInfo(), card_for_role(card, role), frozenset({"served_model_name"}))
    msg.served_model_name = card.names[0]
    return msg


def card_for_role(card: be.ModelCard, role: EngineRole) -> be.ModelCard:
    """The card as this engine's role lets requests use it: a PREFILL engine refuses output
    logprobs, guided decoding, several sequences and more than one token (the role rule in
    ``validation.generate``), so it reports them as unsupported or limited, not the model's
    support."""
    if role != EngineRole.PREFILL:
        return card
    gen = card.generation
    if gen is not None:
        gen = dataclasses.replace(gen, output_logprobs=be.LogprobSupport(supported=False),
                                  guided_decoding=be.GuidedSupport(supported=False), max_num_sequences=1)
    return dataclasses.replace(card, generation=gen, max_output_tokens=1)


def kv_connector_info(conn: be.KvConnector | None) -> kv_pb2.KvConnectorInfo:
    """An engine without a connector reports ``enabled = false`` (a reported value)."""
    if conn is None:
        return kv_pb2.KvConnectorInfo(enabled=False)
    return fill(kv_pb2.KvConnectorInfo(), conn)


def engine_info(identity: be.EngineIdentity, instance_id: str, models: list[str],
                connector: be.KvConnector | None, revision: int, min_client: int,
                release: str) -> engine_pb2.EngineInfo:
    msg = engine_pb2.EngineInfo(
        engine_name=identity.engine_name,
        engine_version=identity.engine_version,
        role=int(identity.role),
        instance_id=instance_id,
        supported_models=models,
        kv_connector=kv_connector_info(connector),
        schema_revision=revision,
        minimum_client_revision=min_client,
        schema_release=release,
    )
    fill(msg.parallelism, identity.parallelism)
    return msg


def load_info(snapshot: be.LoadSnapshot, instance_id: str) -> observability_pb2.LoadInfo:
    """Revision 1's LoadInfo: its attributes are a string map, so JSON values become text
    (``true``/``false`` for booleans, as JSON writes them)."""
    msg = fill(observability_pb2.LoadInfo(), snapshot, frozenset({"attributes"}))
    msg.instance_id = instance_id
    msg.attributes.update({k: attribute_text(v) for k, v in snapshot.attributes.items()})
    return msg


def attribute_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def struct_dict(struct) -> dict:
    """A ``google.protobuf.Struct`` as plain JSON values (numbers are floats, as on the wire)."""
    return json_format.MessageToDict(struct)


def kv_session_ref(session: be.KvSession) -> kv_pb2.KvSessionRef:
    msg = fill(kv_pb2.KvSessionRef(), session, frozenset({"attributes"}))
    if session.attributes:
        json_format.ParseDict(dict(session.attributes), msg.attributes_struct)
    return msg


def kv_event_source(src: be.KvEventSourceInfo) -> kv_pb2.KvEventSource:
    return fill(kv_pb2.KvEventSource(), src)


_KV_EVENT_FIELD = {
    be.BlockStored: "block_stored",
    be.BlockRemoved: "block_removed",
    be.AllBlocksCleared: "all_blocks_cleared",
}


def kv_event_batch(batch: be.KvEventBatchData) -> kv_pb2.KvEventBatch:
    msg = kv_pb2.KvEventBatch(
        sequence_number=batch.sequence_number,
        timestamp_unix_nanos=batch.timestamp_unix_nanos,
        data_parallel_rank=batch.data_parallel_rank,
    )
    for ev in batch.events:
        out = msg.events.add(request_id=ev.request_id)
        if ev.kv_session is not None:
            out.kv_session.CopyFrom(kv_session_ref(ev.kv_session))
        body = getattr(out, _KV_EVENT_FIELD[type(ev.event)])
        body.SetInParent()
        if isinstance(ev.event, be.BlockStored):
            fill(body, ev.event, frozenset({"extra_keys"}))
            for key in ev.event.extra_keys:
                body.extra_keys.add(values=list(key))
        elif isinstance(ev.event, be.BlockRemoved):
            fill(body, ev.event)
    return msg


def runtime_event(ev: be.RuntimeEventData) -> observability_pb2.RuntimeEvent:
    return observability_pb2.RuntimeEvent(
        event_id=ev.event_id,
        timestamp_unix_nanos=ev.timestamp_unix_nanos,
        type=int(ev.type),
        attributes=dict(ev.attributes),
    )
