"""Rules only the v0.1.0 contract has: ServerInfo, gRPC metadata keys, ``extra`` (``--contract v0.1.0``).

Quotes are upstream's docs/api.md at the v0.1.0 release. These checks call the v0.1.0 services
directly (messages as the release defines them); on a revision-1 run they are skipped.
"""

from __future__ import annotations

import grpc

from conformance.registry import Skip, check, expect
from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.v0_1 import error_pb2, generation_pb2, openengine_pb2_grpc, server_pb2


def _v0_1(ctx):
    if ctx.options.contract != "v0.1.0":
        raise Skip("v0.1.0 only (run with --contract v0.1.0)")
    return openengine_pb2_grpc.InferenceStub(ctx.channel), openengine_pb2_grpc.ControlStub(ctx.channel)


def _request(ctx) -> generation_pb2.GenerateRequest:
    """The suite's usual small request, in v0.1.0's message (fields 1-11 are the same bytes)."""
    rev1 = ctx.request("v01", max_tokens=2)
    rev1.ClearField("kv")
    return generation_pb2.GenerateRequest.FromString(rev1.SerializeToString())


async def _refused(ctx, call, code: grpc.StatusCode, what: str) -> error_pb2.EngineError:
    events = []
    try:
        async for event in call:
            events.append(event)
    except grpc.aio.AioRpcError as exc:
        expect(exc.code() == code, f"{what}: expected {code.name}, got {exc.code().name}: {exc.details()}")
        expect(not events, f"{what}: {len(events)} event(s) sent before the rejection")
        values = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
        expect(values, f"{what}: {code.name} without the {ERROR_TRAILER} trailer")
        return error_pb2.EngineError.FromString(values[0])
    raise AssertionError(f"{what}: expected {code.name}, the call succeeded ({len(events)} events)")


@check("v0_1.server_info", "contract v0.1.0")
async def server_info(ctx):
    """ServerInfo: "schema_revision ... zero is invalid", an immutable schema_release, and DeploymentCapacity
    and KvConnectorInfo present (discovery scalars use presence: absent means unknown)."""
    _, control = _v0_1(ctx)
    info = await control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=ctx.options.check_timeout_s)
    expect(info.schema_revision == 1, f"schema_revision {info.schema_revision}")
    expect(1 <= info.minimum_client_revision <= info.schema_revision,
           f"minimum_client_revision {info.minimum_client_revision}")
    expect(info.schema_release.strip(), "schema_release is empty")
    expect(info.engine_role == ctx.role, f"engine_role {info.engine_role} != the role the suite discovered")
    expect(info.HasField("kv_connector") and info.kv_connector.HasField("enabled"),
           "kv_connector.enabled must be reported (false when the engine has no connector)")
    par = info.parallelism
    if par.HasField("decode_context_parallel_size"):
        expect(par.decode_context_parallel_size >= 1, "decode_context_parallel_size: at least 1")


@check("v0_1.metadata.malformed_priority", "contract v0.1.0; role AGGREGATED")
async def malformed_priority(ctx):
    """"malformed numeric values or repeated OpenEngine keys return gRPC INVALID_ARGUMENT"."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    err = await _refused(ctx, inference.Generate(_request(ctx), metadata=(("openengine-priority", "high"),),
                                                 timeout=ctx.options.check_timeout_s),
                         grpc.StatusCode.INVALID_ARGUMENT, "openengine-priority: high")
    expect(err.code == error_pb2.ERROR_CODE_INVALID_ARGUMENT, f"EngineError code {err.code}")


@check("v0_1.metadata.repeated_key", "contract v0.1.0; role AGGREGATED")
async def repeated_key(ctx):
    """"Clients send at most one value for each OpenEngine key; ... repeated OpenEngine keys return
    gRPC INVALID_ARGUMENT"."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    await _refused(ctx, inference.Generate(
        _request(ctx), metadata=(("openengine-routing-key", "a"), ("openengine-routing-key", "b")),
        timeout=ctx.options.check_timeout_s), grpc.StatusCode.INVALID_ARGUMENT, "a repeated openengine- key")


@check("v0_1.metadata.dp_rank_out_of_range", "contract v0.1.0; role AGGREGATED")
async def dp_rank_out_of_range(ctx):
    """``openengine-target-dp-rank`` is a routing target: one past the data-parallel size cannot be honoured."""
    inference, control = _v0_1(ctx)
    ctx.require_generation()
    info = await control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=ctx.options.check_timeout_s)
    if not info.parallelism.HasField("data_parallel_size"):
        raise Skip("data_parallel_size is not reported")
    size = info.parallelism.data_parallel_size
    await _refused(ctx, inference.Generate(_request(ctx), metadata=(("openengine-target-dp-rank", str(size)),),
                                           timeout=ctx.options.check_timeout_s),
                   grpc.StatusCode.INVALID_ARGUMENT, f"openengine-target-dp-rank {size} (data_parallel_size {size})")


@check("v0_1.metadata.priority_as_advertised", "contract v0.1.0; role AGGREGATED")
async def priority_as_advertised(ctx):
    """"The priority key is used only when the selected model and task advertise priority support":
    accepted where advertised, refused where it is not (never silently ignored)."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    call = inference.Generate(_request(ctx), metadata=(("openengine-priority", "1"),),
                              timeout=ctx.options.check_timeout_s)
    if ctx.gen_caps().supports_priority:
        events = [e async for e in call]
        expect(events and events[-1].WhichOneof("event") == "finished", "a prioritized request did not finish")
    else:
        await _refused(ctx, call, grpc.StatusCode.INVALID_ARGUMENT, "openengine-priority on a model without priority")


@check("v0_1.extra.unknown_keys_ignored", "contract v0.1.0; role AGGREGATED")
async def unknown_extra_ignored(ctx):
    """GenerateRequest.extra: "an engine MAY ignore keys it does not recognize, and a request MUST remain
    valid with this field empty": a key no engine knows does not make a valid request fail."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    req = _request(ctx)
    req.extra.update({"conformance_unknown_key": {"nested": [1, "two", True]}})
    events = [e async for e in inference.Generate(req, timeout=ctx.options.check_timeout_s)]
    expect(events and events[-1].WhichOneof("event") == "finished",
           f"a request with an unknown extra key ended with {events[-1].WhichOneof('event') if events else 'nothing'}")
