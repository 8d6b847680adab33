"""Observation messages: ``LoadInfo`` and ``RuntimeEvent``."""

from __future__ import annotations

from openengine_adapters import backend as be
from openengine_adapters.messages import presence
from openengine_adapters.v1 import observability_pb2


def load_info(snapshot: be.LoadSnapshot, instance_id: str) -> observability_pb2.LoadInfo:
    """Revision 1's LoadInfo: its attributes are a string map, so JSON values become text
    (``true``/``false`` for booleans, as JSON writes them)."""
    msg = presence.fill(observability_pb2.LoadInfo(), snapshot, frozenset({"attributes"}))
    msg.instance_id = instance_id
    msg.attributes.update({k: attribute_text(v) for k, v in snapshot.attributes.items()})
    return msg


def attribute_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def runtime_event(ev: be.RuntimeEventData) -> observability_pb2.RuntimeEvent:
    return observability_pb2.RuntimeEvent(
        event_id=ev.event_id,
        timestamp_unix_nanos=ev.timestamp_unix_nanos,
        type=int(ev.type),
        attributes=dict(ev.attributes),
    )
