"""KV messages: the connector's info, a handed-off session's ref, event sources and event
batches."""

from __future__ import annotations

from google.protobuf import json_format

from openengine_adapters import backend as be
from openengine_adapters.messages import presence
from openengine_adapters.v1 import kv_pb2


def kv_connector_info(conn: be.KvConnector | None) -> kv_pb2.KvConnectorInfo:
    """An engine without a connector reports ``enabled = false`` (a reported value)."""
    if conn is None:
        return kv_pb2.KvConnectorInfo(enabled=False)
    return presence.fill(kv_pb2.KvConnectorInfo(), conn)


def kv_session_ref(session: be.KvSession) -> kv_pb2.KvSessionRef:
    msg = presence.fill(kv_pb2.KvSessionRef(), session, frozenset({"attributes"}))
    if session.attributes:
        json_format.ParseDict(dict(session.attributes), msg.attributes_struct)
    return msg


def kv_event_source(src: be.KvEventSourceInfo) -> kv_pb2.KvEventSource:
    return presence.fill(kv_pb2.KvEventSource(), src)


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
            presence.fill(body, ev.event, frozenset({"extra_keys"}))
            for key in ev.event.extra_keys:
                body.extra_keys.add(values=list(key))
        elif isinstance(ev.event, be.BlockRemoved):
            presence.fill(body, ev.event)
    return msg
