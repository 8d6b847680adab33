"""Fuzzing every RPC of both surfaces against the fake-engine server (tests/serve_fake.py, its own
process, configured as a deployment would be: client and admin keys, a LoRA root, an admission
limit).

Inputs come from tests/fuzz_inputs.py, reproducible from one seed: ``OPENENGINE_FUZZ_SEED`` (else a
fixed one; printed) and ``OPENENGINE_FUZZ_INPUTS`` (else 10,000). Every answer is checked: no
UNKNOWN or INTERNAL status, every other refusal with the called surface's ``openengine-error-bin``
trailer (its message the status's), every response decoding as the method's response type, no
GenerateResponse without an event, no traceback in the server's log. Afterwards the server is
healthy, runs no engine request (GetLoad) and admits exactly its limit of new streams (no slot
leaked).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
import signal
import time

import grpc
from fuzz_inputs import FuzzInput, InputMaker, Method, methods
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import eventually, free_port, gen_request, start_fake

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.v1 import generation_pb2, lifecycle_pb2, observability_pb2, openengine_pb2_grpc
from openengine_adapters.wire.v0_1.stub import V01Stub

SEED = int(os.environ.get("OPENENGINE_FUZZ_SEED", "20261203"))
INPUTS = int(os.environ.get("OPENENGINE_FUZZ_INPUTS", "10000"))
CLIENT_KEY, ADMIN_KEY = "fuzz-client-key", "fuzz-admin-key"
MAX_IN_FLIGHT = 24
CHANNELS, WORKERS = 4, 16
UNARY_DEADLINE_S = 20.0  # an answer later than this is a hung server, not load
STREAM_WINDOW_S = 0.3  # a stream still open and silent this long is fine (a valid subscription): cancelled
STREAM_MESSAGES = 5  # then cancelled: the cancellation is part of the fuzz
BAD = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


def token_for(rng: random.Random) -> str | None:
    """Mostly the admin key (every RPC reachable); some client keys, wrong keys and none."""
    r = rng.random()
    return ADMIN_KEY if r < 0.88 else CLIENT_KEY if r < 0.95 else rng.choice((None, "wrong", ADMIN_KEY + "x"))


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.statuses: dict[str, int] = {}
        self.cancelled_by_us = 0

    def fail(self, item: FuzzInput, why: str) -> None:
        self.failures.append(f"#{item.index} {item.method.path} [{item.kind}] ({len(item.data)} bytes): {why}")

    def count(self, code: grpc.StatusCode) -> None:
        self.statuses[code.name] = self.statuses.get(code.name, 0) + 1

    def check_refusal(self, item: FuzzInput, exc: grpc.aio.AioRpcError) -> None:
        code = exc.code()
        self.count(code)
        if code in BAD:
            self.fail(item, f"{code.name}: {exc.details()[:300]}")
            return
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.fail(item, f"no answer within {UNARY_DEADLINE_S} s")
            return
        raw = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
        if len(raw) != 1:
            self.fail(item, f"{code.name} with {len(raw)} {ERROR_TRAILER} trailers: {exc.details()[:300]}")
            return
        try:
            err = item.method.error.FromString(raw[0])
        except Exception as e:  # noqa: BLE001 - any decode failure is the finding
            self.fail(item, f"{code.name}: its trailer is not a {item.method.error.DESCRIPTOR.full_name}: {e}")
            return
        if err.message != exc.details():
            self.fail(item, f"{code.name}: trailer message {err.message[:100]!r} != status {exc.details()[:100]!r}")

    def check_response(self, item: FuzzInput, raw: bytes) -> None:
        try:
            msg = item.method.response.FromString(raw)
        except Exception as e:  # noqa: BLE001
            self.fail(item, f"a response that does not decode as {item.method.response.DESCRIPTOR.full_name}: {e}")
            return
        if item.method.name == "Generate" and msg.WhichOneof("event") is None:
            self.fail(item, f"a GenerateResponse without an event: {msg}")


async def exercise(channel: grpc.aio.Channel, item: FuzzInput, token: str | None, checker: Checker) -> None:
    metadata = ((("authorization", f"Bearer {token}"),) if token is not None else ()) + item.headers
    method: Method = item.method
    if not method.streaming:
        try:
            raw = await channel.unary_unary(method.path)(item.data, timeout=UNARY_DEADLINE_S, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            checker.check_refusal(item, exc)
            return
        checker.count(grpc.StatusCode.OK)
        checker.check_response(item, raw)
        return
    call = channel.unary_stream(method.path)(item.data, timeout=UNARY_DEADLINE_S, metadata=metadata)
    try:
        for _ in range(STREAM_MESSAGES):
            try:
                raw = await asyncio.wait_for(call.read(), STREAM_WINDOW_S)
            except TimeoutError:
                break
            if raw is grpc.aio.EOF:
                checker.count(await call.code())
                return
            checker.check_response(item, raw)
        call.cancel()
        checker.cancelled_by_us += 1
    except grpc.aio.AioRpcError as exc:
        checker.check_refusal(item, exc)


async def fuzz(target: str, inputs, seed: int) -> tuple[Checker, int]:
    """Send ``inputs`` over a few channels with WORKERS calls at a time; returns the checks and count."""
    checker, tokens, sent = Checker(), random.Random(seed ^ 0x5EED), 0
    channels = [grpc.aio.insecure_channel(target) for _ in range(CHANNELS)]
    feed = iter(inputs)

    async def worker(n: int) -> None:
        nonlocal sent
        channel = channels[n % CHANNELS]
        for item in feed:  # one shared iterator: inputs (and their tokens) are taken in order
            token = token_for(tokens)
            sent += 1
            await exercise(channel, item, token, checker)

    try:
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    finally:
        for c in channels:
            await c.close()
    return checker, sent


@contextlib.asynccontextmanager
async def fuzz_server(tmp_path, *extra: str):
    """serve_fake with keys, a LoRA root holding one adapter and an admission limit; yields
    (target, adapter dir, its log lines so far, the process)."""
    root = tmp_path / "loras"
    (root / "ad").mkdir(parents=True)
    (root / "ad" / "adapter_config.json").write_text('{"r": 8}')
    proc, port, lines = await start_fake("--api-key", CLIENT_KEY, "--admin-api-key", ADMIN_KEY,
                                         "--lora-root", str(root), "--max-in-flight", str(MAX_IN_FLIGHT),
                                         "--metrics-port", str(free_port()), *extra)

    async def pump():  # the log must be read as it comes, or the server blocks on a full pipe
        while line := await proc.stdout.readline():
            lines.append(line.decode(errors="replace"))

    reader = asyncio.ensure_future(pump())
    try:
        yield f"127.0.0.1:{port}", str(root / "ad"), lines, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await asyncio.wait_for(reader, 30)


def authed(target: str):
    channel = grpc.aio.insecure_channel(target)
    md = (("authorization", f"Bearer {ADMIN_KEY}"),)
    return channel, md


async def running_requests(stub, md) -> int:
    load = await stub.GetLoad(observability_pb2.GetLoadRequest(), metadata=md, timeout=10)
    return load.running_requests


async def settle_idle(stub, md) -> None:
    async def idle():
        return await running_requests(stub, md) == 0
    await eventually(idle, timeout=10, interval=0.05, message="engine requests still running after the fuzz")


async def assert_healthy_and_idle(target: str) -> None:
    channel, md = authed(target)
    async with channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        health = await stub.Health(lifecycle_pb2.HealthRequest(), metadata=md, timeout=10)
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY, health
        v01 = await V01Stub(channel).Health(lifecycle_pb2.HealthRequest(), metadata=md, timeout=10)
        assert v01.state == lifecycle_pb2.HEALTH_STATE_READY, v01
        probe = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert probe.status == health_pb2.HealthCheckResponse.SERVING
        await settle_idle(stub, md)
        # every admission slot is free: exactly MAX_IN_FLIGHT long streams are accepted, one more is not
        slow = {"fake.step_delay_ms": "50"}
        calls = [stub.Generate(gen_request("hi", request_id=f"slot-{i}", metadata=slow,
                                           stopping=generation_pb2.StoppingOptions(max_tokens=200)),
                               metadata=md, timeout=30) for i in range(MAX_IN_FLIGHT)]
        try:
            for call in calls:
                first = await call.read()
                assert first is not grpc.aio.EOF and first.WhichOneof("event") == "token", first
            over = stub.Generate(gen_request("hi", request_id="slot-over"), metadata=md, timeout=10)
            try:
                await over.read()
                raise AssertionError("a stream beyond --max-in-flight was accepted: slots are not counted")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        finally:
            for call in calls:
                call.cancel()
        await settle_idle(stub, md)


def report(name: str, checker: Checker, sent: int, elapsed: float, seed: int) -> None:
    print(f"\n{name}: {sent} inputs in {elapsed:.1f} s (seed {seed}; OPENENGINE_FUZZ_SEED to change); "
          f"statuses {dict(sorted(checker.statuses.items()))}; streams cancelled by the client "
          f"{checker.cancelled_by_us}; failures {len(checker.failures)}")


def assert_clean(checker: Checker, lines: list[str], seed: int) -> None:
    shown = "\n".join(checker.failures[:15])
    assert not checker.failures, f"{len(checker.failures)} wrong answers (seed {seed}):\n{shown}"
    tracebacks = [i for i, line in enumerate(lines) if "Traceback" in line]
    assert not tracebacks, "the server logged tracebacks:\n" + "".join(
        itertools.chain.from_iterable(lines[max(0, i - 2):i + 25] for i in tracebacks[:2]))


async def test_fuzzing_every_rpc_of_both_surfaces_gets_only_precise_answers(tmp_path):
    targets = [m for m in methods() if m.name != "Drain"]  # Drain ends the server's service: fuzzed below
    assert len(targets) == 27
    async with fuzz_server(tmp_path) as (target, adapter, lines, proc):
        started = time.monotonic()
        checker, sent = await fuzz(target, InputMaker(SEED, adapter).inputs(INPUTS, targets), SEED)
        report("fuzz", checker, sent, time.monotonic() - started, SEED)
        assert sent == INPUTS and proc.returncode is None
        assert_clean(checker, lines, SEED)
        assert checker.statuses.get("OK", 0) > INPUTS // 10, "too few inputs got past validation to mean much"
        assert checker.statuses.get("INVALID_ARGUMENT", 0) > INPUTS // 10
        await assert_healthy_and_idle(target)
    assert_clean(checker, lines, SEED)


async def test_fuzzed_drain_among_generates_leaves_nothing_running(tmp_path):
    seed = SEED + 1
    targets = [m for m in methods() if m.name in ("Drain", "Generate")]
    async with fuzz_server(tmp_path) as (target, adapter, lines, proc):
        started = time.monotonic()
        checker, sent = await fuzz(target, InputMaker(seed, adapter).inputs(600, targets), seed)
        report("drain fuzz", checker, sent, time.monotonic() - started, seed)
        assert proc.returncode is None
        assert_clean(checker, lines, seed)
        channel, md = authed(target)
        async with channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            await settle_idle(stub, md)
            health = await stub.Health(lifecycle_pb2.HealthRequest(), metadata=md, timeout=10)
            assert health.state in (lifecycle_pb2.HEALTH_STATE_READY, lifecycle_pb2.HEALTH_STATE_DRAINING)


# ---------------------------------------------------------------------- what the fuzz found, pinned


async def test_a_struct_holding_nan_or_infinity_is_invalid_argument_not_an_internal_error(oe):
    """A Struct's numbers are doubles on the wire, so NaN decodes; JSON cannot hold it (found by the fuzz:
    v0.1.0's Generate.extra answered UNKNOWN, Abort's kv_session.attributes_struct INTERNAL)."""
    from google.protobuf import struct_pb2
    from helpers import expect_status, rejection

    from openengine_adapters.v0_1 import generation_pb2 as v01_generation_pb2
    from openengine_adapters.v1 import kv_pb2

    for bad in (math.nan, math.inf):
        attributes = struct_pb2.Struct()
        attributes["x"] = bad
        abort = lifecycle_pb2.AbortRequest(kv_session=kv_pb2.KvSessionRef(session_id="s", attributes_struct=attributes))
        exc = await expect_status(oe.stub.Abort(abort), grpc.StatusCode.INVALID_ARGUMENT,
                                  "kv_session.attributes_struct: numbers must be finite")
        assert rejection(exc).message == exc.details()
        generate = oe.channel.unary_stream("/openengine.v1.Inference/Generate")
        request = v01_generation_pb2.GenerateRequest(prompt="hi", extra=attributes)
        await expect_status(generate(request.SerializeToString()), grpc.StatusCode.INVALID_ARGUMENT,
                            "extra: numbers must be finite")


async def test_a_v0_1_numeric_header_of_thousands_of_digits_is_invalid_argument_not_unknown(oe):
    """Found by the fuzz: ``openengine-priority`` of 6,000 digits answered UNKNOWN (Python's int()
    refuses more than 4,300 digits)."""
    from helpers import expect_status, rejection

    from openengine_adapters.v0_1 import generation_pb2 as v01_generation_pb2

    generate = oe.channel.unary_stream("/openengine.v1.Inference/Generate")
    request = v01_generation_pb2.GenerateRequest(prompt="hi").SerializeToString()
    for key in ("openengine-priority", "openengine-target-dp-rank"):
        exc = await expect_status(generate(request, metadata=((key, "9" * 6000),)), grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{key}: 9999", "(6000 digits) is out of the")
        assert rejection(exc).message == exc.details()
