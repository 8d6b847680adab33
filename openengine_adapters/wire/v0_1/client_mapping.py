"""The client's side of the v0.1.0 surface: a revision-1-typed client on the v0.1.0 wire
(``wire.v0_1.stub``, which the conformance suite runs v0.1.0 servers with). ``server_mapping``,
reversed: revision-1 requests -> v0.1.0 requests and metadata, v0.1.0 responses -> revision 1.
"""

from __future__ import annotations

from google.protobuf import json_format

from openengine_adapters.messages.observability import attribute_text
from openengine_adapters.types import ErrorCode, HealthState
from openengine_adapters.v0_1 import error_pb2, generation_pb2, lifecycle_pb2, model_pb2, server_pb2
from openengine_adapters.v1 import engine_pb2
from openengine_adapters.v1 import error_pb2 as rev1_error_pb2
from openengine_adapters.v1 import generation_pb2 as rev1_generation_pb2
from openengine_adapters.v1 import kv_pb2 as rev1_kv_pb2
from openengine_adapters.v1 import lifecycle_pb2 as rev1_lifecycle_pb2
from openengine_adapters.v1 import model_pb2 as rev1_model_pb2
from openengine_adapters.v1 import observability_pb2 as rev1_observability_pb2
from openengine_adapters.wire.v0_1.server_mapping import CAPACITY_FIELDS, copy_kv_options, recast

REVISION1_ERROR_CODE = {int(c): int(c) for c in ErrorCode if c <= ErrorCode.CANCELLED}
REVISION1_ERROR_CODE[error_pb2.ERROR_CODE_INTERNAL] = int(ErrorCode.INTERNAL)

REVISION1_HEALTH_STATE = {lifecycle_pb2.HEALTH_STATE_UNSPECIFIED: int(HealthState.UNSPECIFIED),
                          lifecycle_pb2.HEALTH_STATE_STARTING: int(HealthState.STARTING),
                          lifecycle_pb2.HEALTH_STATE_READY: int(HealthState.READY),
                          lifecycle_pb2.HEALTH_STATE_DEGRADED: int(HealthState.DEGRADED),
                          lifecycle_pb2.HEALTH_STATE_NOT_READY: int(HealthState.NOT_READY)}

def v0_1_generate_request(req: rev1_generation_pb2.GenerateRequest
                          ) -> tuple[generation_pb2.GenerateRequest, list[tuple[str, str]]]:
    """A revision-1 request as v0.1.0 sends it: the body, and the gRPC metadata for priority, the DP
    target and revision 1's ``metadata`` map (application keys)."""
    out = recast(req, generation_pb2.GenerateRequest, ("priority", "metadata", "kv"))
    metadata = [(key, value) for key, value in sorted(req.metadata.items())]
    if req.HasField("priority"):
        metadata.append(("openengine-priority", str(req.priority)))
    if req.HasField("kv"):
        copy_kv_options(req.kv, out.kv)
        if req.kv.HasField("data_parallel_rank"):
            metadata.append(("openengine-target-dp-rank", str(req.kv.data_parallel_rank)))
    return out, metadata


def revision1_error(err: error_pb2.EngineError) -> rev1_error_pb2.EngineError:
    return rev1_error_pb2.EngineError(code=REVISION1_ERROR_CODE.get(err.code, int(ErrorCode.UNSPECIFIED)),
                                      message=err.message, retryable=err.retryable)


def revision1_error_trailer(value: bytes) -> bytes:
    return revision1_error(error_pb2.EngineError.FromString(value)).SerializeToString()


def revision1_generate_response(raw: bytes) -> rev1_generation_pb2.GenerateResponse:
    """v0.1.0 GenerateResponse bytes as revision 1's message (only an error event is re-encoded)."""
    resp = rev1_generation_pb2.GenerateResponse.FromString(raw)
    if resp.HasField("error"):
        v01 = generation_pb2.GenerateResponse.FromString(raw)
        resp.error.CopyFrom(revision1_error(v01.error))
    return resp


def revision1_engine_info(info: server_pb2.ServerInfo) -> engine_pb2.EngineInfo:
    out = engine_pb2.EngineInfo(
        engine_name=info.engine_name, engine_version=info.engine_version, role=info.engine_role,
        instance_id=info.instance_id, supported_models=info.supported_models,
        schema_revision=info.schema_revision, minimum_client_revision=info.minimum_client_revision,
        schema_release=info.schema_release)
    out.parallelism.CopyFrom(recast(info.parallelism, engine_pb2.ParallelismInfo, ("decode_context_parallel_size",)))
    out.kv_connector.CopyFrom(recast(info.kv_connector, rev1_kv_pb2.KvConnectorInfo, ("schema_version",)))
    if info.kv_connector.HasField("schema_version"):
        out.kv_connector.schema_version = info.kv_connector.schema_version
    return out


def revision1_model_info(mi: model_pb2.ModelInfo, capacity: server_pb2.DeploymentCapacity | None
                         ) -> rev1_model_pb2.ModelInfo:
    out = recast(mi, rev1_model_pb2.ModelInfo, ("extra",))
    if capacity is not None:  # v0.1.0 moved these four to ServerInfo.capacity
        for name in CAPACITY_FIELDS:
            if capacity.HasField(name):
                setattr(out, name, getattr(capacity, name))
    return out


def revision1_load_info(load: server_pb2.LoadInfo) -> rev1_observability_pb2.LoadInfo:
    out = recast(load, rev1_observability_pb2.LoadInfo, ("attributes",))
    values = json_format.MessageToDict(load.attributes)
    out.attributes.update({k: attribute_text(int(v) if isinstance(v, float) and v.is_integer() else v)
                           for k, v in values.items()})
    return out


def revision1_health(resp: lifecycle_pb2.HealthResponse) -> rev1_lifecycle_pb2.HealthResponse:
    out = rev1_lifecycle_pb2.HealthResponse(state=REVISION1_HEALTH_STATE.get(resp.state, 0))
    for c in resp.checks:
        out.checks.add(name=c.name, state=REVISION1_HEALTH_STATE.get(c.state, 0), message=c.message)
    return out

