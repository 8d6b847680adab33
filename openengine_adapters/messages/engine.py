"""The engine's identity as ``EngineInfo``."""

from __future__ import annotations

from openengine_adapters import backend as be
from openengine_adapters.messages import presence
from openengine_adapters.messages.kv import kv_connector_info
from openengine_adapters.v1 import engine_pb2


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
    presence.fill(msg.parallelism, identity.parallelism)
    return msg
