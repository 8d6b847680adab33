"""Rules only the v0.1.0 contract has: ServerInfo, gRPC metadata keys, ``extra`` (``--contract v0.1.0``).

Quotes are upstream's docs/api.md at the v0.1.0 release. These checks call the v0.1.0 services
directly (messages as the release defines them); on a revision-1 run they are skipped.
"""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import unknown_fields

from conformance.registry import CheckFailed, Skip, check, expect
from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.v0_1 import (
    error_pb2,
    generation_pb2,
    lifecycle_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)

V0_1_CODES = frozenset(error_pb2.ErrorCode.values()) - {error_pb2.ERROR_CODE_UNSPECIFIED}


def _v0_1(ctx):
    if ctx.options.contract != "v0.1.0":
        raise Skip("v0.1.0 only (run with --contract v0.1.0)")
    return openengine_pb2_grpc.InferenceStub(ctx.channel), openengine_pb2_grpc.ControlStub(ctx.channel)


def _request(ctx, max_tokens: int = 2) -> generation_pb2.GenerateRequest:
    """The suite's usual small request, in v0.1.0's message (fields 1-11 are the same bytes)."""
    rev1 = ctx.request("v01", max_tokens=max_tokens)
    rev1.ClearField("kv")
    return generation_pb2.GenerateRequest.FromString(rev1.SerializeToString())


def v0_1_error(err: error_pb2.EngineError, what: str) -> None:
    """A v0.1.0 EngineError is v0.1.0's message: a v0.1.0 ErrorCode value ("ERROR_CODE_INTERNAL = 11";
    revision 1's 12 and its DRAINING do not exist here) and no field v0.1.0 lacks (retry_after_ms,
    details are revision 1's fields 4 and 5)."""
    expect(err.code in V0_1_CODES, f"{what}: EngineError code {err.code} is not a v0.1.0 ErrorCode value")
    extra = [f.field_number for f in unknown_fields.UnknownFieldSet(err)]
    expect(not extra, f"{what}: the EngineError carries fields v0.1.0 does not define: {extra}")


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
        err = error_pb2.EngineError.FromString(values[0])
        v0_1_error(err, what)
        return err
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


V0_1_HEALTH_STATES = frozenset(lifecycle_pb2.HealthState.values()) - {lifecycle_pb2.HEALTH_STATE_UNSPECIFIED}
OTHER_ROLE = {1: 2, 2: 3, 3: 2}  # AGGREGATED -> PREFILL, PREFILL -> DECODE, DECODE -> PREFILL


@check("v0_1.health_states", "contract v0.1.0")
async def health_states(ctx):
    """Health and abort, as released: v0.1.0's HealthState has no DRAINING, so "HEALTH_STATE_NOT_READY = 4": every
    state a v0.1.0 Health answers, overall and per check, is a v0.1.0 value (revision 1's NOT_READY 5 is none; a
    client reads it as UNSPECIFIED), for a plain query, one for the server's own role and a role-specific query
    for another role, which answers NOT_READY."""
    _, control = _v0_1(ctx)
    other = OTHER_ROLE.get(ctx.role, 0)
    for what, req in (("Health()", lifecycle_pb2.HealthRequest()),
                      ("Health(own role)", lifecycle_pb2.HealthRequest(role=ctx.role)),
                      ("Health(another role)", lifecycle_pb2.HealthRequest(role=other))):
        h = await control.Health(req, timeout=ctx.options.check_timeout_s)
        expect(h.state in V0_1_HEALTH_STATES, f"{what}: state {h.state} is not a v0.1.0 HealthState value")
        for c in h.checks:
            expect(c.state in V0_1_HEALTH_STATES,
                   f"{what}: check {c.name!r} state {c.state} is not a v0.1.0 HealthState value")
        if req.role == other:
            expect(h.state == lifecycle_pb2.HEALTH_STATE_NOT_READY, f"{what}: a {ctx.role_name} server asked for "
                   f"role {other} answered {lifecycle_pb2.HealthState.Name(h.state)}, not NOT_READY (4)")


def _undefined_fields(msg, path: str = "") -> list[str]:
    """Field numbers ``msg`` carries that its (v0.1.0) type does not define, nested messages included."""
    out = [f"{path}{f.field_number}" for f in unknown_fields.UnknownFieldSet(msg)]
    for field, value in msg.ListFields():
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if field.message_type.full_name.startswith("google.protobuf."):
            continue
        items = [value] if hasattr(value, "DESCRIPTOR") else value  # one message, or a repeated field
        for item in items:
            out += _undefined_fields(item, f"{path}{field.name}.")
    return out


@check("v0_1.discovery_shapes", "contract v0.1.0")
async def discovery_shapes(ctx):
    """ServerInfo, ModelInfo, LoadInfo and HealthResponse are v0.1.0's messages: no field v0.1.0 does not define. In
    particular (Model identity and capabilities) "KV layout and scheduler capacity are reported once through
    ServerInfo.capacity, not repeated as model identity" (revision 1's ModelInfo fields 6-9), and ModelInfo has
    no tasks (27)."""
    _, control = _v0_1(ctx)
    t = ctx.options.check_timeout_s
    answers = {"ServerInfo": await control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=t),
               "ModelInfo": await control.GetModelInfo(model_pb2.GetModelInfoRequest(model=ctx.model), timeout=t),
               "LoadInfo": await control.GetLoad(server_pb2.GetLoadRequest(include_per_rank=True), timeout=t),
               "HealthResponse": await control.Health(lifecycle_pb2.HealthRequest(), timeout=t)}
    for name, msg in answers.items():
        extra = _undefined_fields(msg)
        expect(not extra, f"{name} carries fields v0.1.0 does not define: {extra}"
               + (" (revision 1's capacity fields repeated as model identity)" if name == "ModelInfo"
                  and {"6", "7", "8", "9"} & set(extra) else ""))


@check("v0_1.metadata.control_ignores_admission_keys", "contract v0.1.0")
async def control_ignores_admission_keys(ctx):
    """gRPC request metadata: "Routing and admission keys apply only to Inference RPCs": Control RPCs carrying them
    (even values an Inference RPC would refuse, as a client that attaches one metadata set to every call sends
    them) are answered as without them."""
    _, control = _v0_1(ctx)
    md = (("openengine-priority", "high"), ("openengine-target-dp-rank", "-1"), ("openengine-routing-key", "r"))
    t = ctx.options.check_timeout_s
    calls = (("GetServerInfo", lambda: control.GetServerInfo(server_pb2.GetServerInfoRequest(), metadata=md,
                                                            timeout=t)),
             ("GetModelInfo", lambda: control.GetModelInfo(model_pb2.GetModelInfoRequest(model=ctx.model),
                                                          metadata=md, timeout=t)),
             ("GetLoad", lambda: control.GetLoad(server_pb2.GetLoadRequest(), metadata=md, timeout=t)),
             ("Health", lambda: control.Health(lifecycle_pb2.HealthRequest(), metadata=md, timeout=t)))
    for name, call in calls:
        try:
            await call()
        except grpc.aio.AioRpcError as exc:
            raise CheckFailed(f"{name} with openengine- admission keys failed: {exc.code().name}: "
                              f"{exc.details()}") from None


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
    """"The priority key is used only when the selected model and task advertise priority support": a
    router sends it on every request, so a model without priority support serves it in its default order
    (ModelInfo keeps saying supports_priority false); a malformed value stays INVALID_ARGUMENT
    (v0_1.metadata.malformed_values)."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    call = inference.Generate(_request(ctx), metadata=(("openengine-priority", "1"),),
                              timeout=ctx.options.check_timeout_s)
    events = [e async for e in call]
    expect(events and events[-1].WhichOneof("event") == "finished",
           f"a prioritized request did not finish (supports_priority {ctx.gen_caps().supports_priority})")
    expect(ctx.gen_caps().HasField("supports_priority"),
           "openengine-priority is served, yet supports_priority is absent (unreported)")


@check("v0_1.explicit_defaults_served", "contract v0.1.0; role AGGREGATED")
async def explicit_defaults_served(ctx):
    """"Optional scalars preserve the distinction between an engine default and explicit zero or false":
    an explicit false asks for the engine's default. Dynamo's sidecar forwards a user's
    bypass_prefix_cache=false as present-and-false; with include_stop_in_output=false it asks for what
    every engine does without the option, advertised or not, so the request is served."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    req = _request(ctx)
    req.kv.bypass_prefix_cache = False
    req.stopping.include_stop_in_output = False
    events = [e async for e in inference.Generate(req, timeout=ctx.options.check_timeout_s)]
    expect(events and events[-1].WhichOneof("event") == "finished",
           "bypass_prefix_cache=false / include_stop_in_output=false ended with "
           f"{events[-1].WhichOneof('event') if events else 'nothing'}")


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


@check("v0_1.metadata.malformed_values", "contract v0.1.0; role AGGREGATED")
async def malformed_values(ctx):
    """"openengine-target-dp-rank: Base-10 uint32", "openengine-priority: Base-10 int32"; "malformed numeric
    values ... return gRPC INVALID_ARGUMENT": fractions, hex, signs a uint32 lacks and values outside the
    type's range are malformed."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    cases = [("openengine-priority", v) for v in ("1.5", "0x10", "2147483648", "-2147483649")]
    cases += [("openengine-target-dp-rank", v) for v in ("-1", "one", "4294967296")]
    for key, value in cases:
        await _refused(ctx, inference.Generate(_request(ctx), metadata=((key, value),),
                                               timeout=ctx.options.check_timeout_s),
                       grpc.StatusCode.INVALID_ARGUMENT, f"{key}: {value}")


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@check("v0_1.metadata.valid_keys_accepted", "contract v0.1.0; role AGGREGATED")
async def valid_keys_accepted(ctx):
    """The keys upstream defines work when well-formed: an "opaque non-empty ASCII routing key", the
    target DP rank 0 (every server has rank 0), W3C ``traceparent``/``tracestate``, and "application-specific
    metadata may use other gRPC metadata keys"; a malformed ``traceparent`` is ignored as W3C says (the trace
    restarts), never an error."""
    inference, _ = _v0_1(ctx)
    ctx.require_generation()
    for what, md in (("routing key, dp rank 0, trace context, an application key",
                      (("openengine-routing-key", "tenant-a/42"), ("openengine-target-dp-rank", "0"),
                       ("traceparent", TRACEPARENT), ("tracestate", "conformance=1"),
                       ("x-conformance-app", "v"))),
                     ("a malformed traceparent", (("traceparent", "not-a-trace-parent"),))):
        try:
            events = [e async for e in inference.Generate(_request(ctx), metadata=md,
                                                          timeout=ctx.options.check_timeout_s)]
        except grpc.aio.AioRpcError as exc:
            raise CheckFailed(f"{what}: refused with {exc.code().name}: {exc.details()}") from None
        expect(events and events[-1].WhichOneof("event") == "finished", f"{what}: the request did not finish")


@check("v0_1.error_event", "contract v0.1.0; role AGGREGATED; --fail-request-metadata KEY=VALUE")
async def error_event(ctx):
    """After acceptance a failure is "exactly one terminal EngineError event" with "gRPC OK after the event",
    in v0.1.0's shape: a v0.1.0 ErrorCode (INTERNAL is 11) and none of revision 1's extra fields; the
    request's metadata (application keys) reaches the engine, so the test hook fires."""
    inference, _ = _v0_1(ctx)
    if not ctx.options.fail_metadata:
        raise Skip("no --fail-request-metadata given (a test-engine hook that fails an accepted request)")
    ctx.require_generation()
    req = _request(ctx, max_tokens=16)
    req.stopping.ignore_eos = True
    try:
        events = [e async for e in inference.Generate(req, metadata=tuple(ctx.options.fail_metadata.items()),
                                                      timeout=ctx.options.check_timeout_s)]
    except grpc.aio.AioRpcError as exc:
        raise CheckFailed(f"the failing request ended with gRPC status {exc.code().name}") from None
    kinds = [e.WhichOneof("event") for e in events]
    expect(kinds and kinds[-1] == "error", f"the request carrying the failure hook ended with {kinds[-1:]}")
    expect(kinds.count("error") == 1, "more than one EngineError")
    v0_1_error(events[-1].error, "the terminal error event")
    expect(events[-1].HasField("usage"), "the terminal EngineError carries no usage")


@check("v0_1.admission_limit", "contract v0.1.0; --expect-admission-limit N")
async def admission_limit(ctx):
    """Beyond the admission limit a v0.1.0 Generate is RESOURCE_EXHAUSTED before any event, with v0.1.0's
    EngineError in the trailer: OVERLOADED, retryable, and no revision-1-only field (retry_after_ms is not
    part of v0.1.0's EngineError)."""
    inference, _ = _v0_1(ctx)
    n = ctx.options.expect_admission_limit
    if n is None:
        raise Skip("no --expect-admission-limit given")
    ctx.require_generation()
    calls = []
    long_md = tuple(ctx.options.long_metadata.items())
    try:
        for _ in range(n):
            req = _request(ctx, max_tokens=ctx.long_request("adm").stopping.max_tokens)
            req.stopping.ignore_eos = True
            call = inference.Generate(req, metadata=long_md, timeout=ctx.options.check_timeout_s)
            first = await call.read()
            if first is grpc.aio.EOF or first.WhichOneof("event") in ("finished", "error"):
                raise Skip("a long request finished at once; pass --long-request-metadata to slow the engine")
            calls.append(call)
        err = await _refused(ctx, inference.Generate(_request(ctx), metadata=long_md,
                                                     timeout=ctx.options.check_timeout_s),
                             grpc.StatusCode.RESOURCE_EXHAUSTED, f"request {n + 1} beyond the admission limit")
        expect(err.code == error_pb2.ERROR_CODE_OVERLOADED and err.retryable,
               f"admission overflow EngineError: code {err.code}, retryable {err.retryable}")
    finally:
        for call in calls:
            call.cancel()
    await asyncio.sleep(0)
    await ctx.wait_idle("cancelling the admitted streams")
