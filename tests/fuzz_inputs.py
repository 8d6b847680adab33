"""Fuzz inputs for every RPC of both surfaces, reproducible from one seed (tests/test_fuzz.py).

Each input is the bytes a client sends as one request, made one of three ways from a valid seed
request of the method: fields mutated in the message (numbers at and past their range, NaN and
infinities, empty, huge and odd strings, unknown enum values, repeated fields and maps blown up,
oneofs switched, sub-messages cleared or filled at random), the encoding corrupted (truncated,
bits flipped, bytes inserted or duplicated, a length prefix lying, unknown fields appended), or raw
random bytes. The same seed gives the same inputs in the same order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf import descriptor, json_format, message_factory
from google.protobuf.message import Message

from openengine_adapters.v0_1 import error_pb2 as v01_error_pb2
from openengine_adapters.v0_1 import openengine_pb2 as v01_openengine_pb2
from openengine_adapters.v1 import error_pb2, openengine_pb2

FD = descriptor.FieldDescriptor
INT32 = (0, 1, -1, 2**31 - 1, -(2**31), 1000, 1 << 20)
INT64 = (0, 1, -1, 2**63 - 1, -(2**63), 2**53 + 1)
UINT32 = (0, 1, 2**31, 2**32 - 1, 513, 1 << 20)
UINT64 = (0, 1, 2**63, 2**64 - 1, 2**53 + 1)
FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, -1.0, 1e308, -1e308, 5e-324, 2.5, 1e6)
ODD_TEXT = ("", "\x00", "é" * 3, "\u202e\u200b", "🙂" * 5, "../../../etc/passwd", "/", " ", "tiny", "tiny-alias",
            "%s%n{}", "a\nb", "\ud7ff\ue000")
INTS = {FD.TYPE_INT32: INT32, FD.TYPE_SINT32: INT32, FD.TYPE_SFIXED32: INT32,
        FD.TYPE_INT64: INT64, FD.TYPE_SINT64: INT64, FD.TYPE_SFIXED64: INT64,
        FD.TYPE_UINT32: UINT32, FD.TYPE_FIXED32: UINT32, FD.TYPE_UINT64: UINT64, FD.TYPE_FIXED64: UINT64}
HEADER_KEYS = ("openengine-priority", "openengine-target-dp-rank", "openengine-routing-key", "openengine-other",
               "traceparent", "tracestate", "x-app", "x-app-bin", "openengine-priority-bin")
HEADER_VALUES = ("", "0", "-1", "1", "2147483648", "-2147483649", "18446744073709551616", "1.5", " 7", "abc",
                 "@long@", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ff-00-00-00", "~!@#$%^&*()")
MAX_INPUT_BYTES = 2 * 1024 * 1024  # blown-up inputs stay well under the server's message limit

# Valid requests of each method name (JSON field names; a name a surface does not have is ignored),
# the starting points of message mutations. LORA_DIR is replaced by the adapter the test provides.
LORA_DIR = "@lora@"
SEEDS: dict[str, list[dict]] = {
    "Generate": [
        {"prompt": "hello", "stopping": {"maxTokens": 4}},
        {"model": "tiny", "tokenIds": {"ids": [104, 105, 106]}, "stopping": {"maxTokens": 3, "minTokens": 1},
         "sampling": {"temperature": 0.7, "topP": 0.9, "topK": 5, "seed": 7, "numSequences": 2}},
        {"prompt": "hello world", "stopping": {"maxTokens": 5, "conditions": [{"stopText": "o"}, {"stopTokenId": 3}],
                                               "includeStopInOutput": True},
         "response": {"returnPromptLogprobs": True, "promptCandidates": {"topN": 2}, "promptLogprobStart": 1,
                      "returnOutputLogprobs": True, "outputCandidates": {"tokenIds": {"ids": [104]}}}},
        {"prompt": "pick", "guided": {"choice": {"choices": ["yes", "no"]}}, "stopping": {"maxTokens": 3},
         "kv": {"bypassPrefixCache": True, "cacheSalt": "s"}, "priority": 3, "metadata": {"k": "v"},
         "extra": {"k": "v"}},
        {"prompt": "json", "guided": {"jsonObject": {}}, "stopping": {"maxTokens": 2}, "loraName": "ad"},
        {"prompt": "img", "media": [{"modality": 1, "url": "http://127.0.0.1:9/x.png"}], "stopping": {"maxTokens": 1}},
    ],
    "Embed": [{"context": {"model": "tiny"}, "inputs": [{"itemId": "a", "text": "abc"},
                                                        {"itemId": "b", "tokenIds": {"ids": [5, 6]}}],
               "options": {"normalize": True, "dimensions": 4, "granularity": 1}}],
    "Classify": [{"context": {"model": "tiny", "priority": 1}, "inputs": [{"itemId": "a", "text": "good"}],
                  "options": {"granularity": 1}}],
    "Score": [{"context": {"model": "tiny"}, "groups": [{"groupId": "g", "query": {"itemId": "q", "text": "a"},
                                                          "candidates": [{"itemId": "c", "text": "b"}]}],
               "options": {"labelTokenIds": [5]}}],
    "GetEngineInfo": [{}],
    "GetServerInfo": [{}],
    "GetModelInfo": [{"model": "tiny"}, {}],
    "GetLoad": [{"includePerRank": True}, {}],
    "Health": [{}, {"includeInferenceProbe": True, "model": "tiny"}, {"role": 1}],
    "Abort": [{"requestId": "fz-1"}, {"allRequests": {}}, {"kvSession": {"sessionId": "s"}}],
    "Drain": [{"stopAcceptingNewRequests": True, "deadlineMs": 50, "abortAfterDeadline": True}, {}],
    "LoadLora": [{"adapter": {"loraId": 1, "loraName": "ad", "sourcePath": LORA_DIR}}],
    "UnloadLora": [{"loraName": "ad"}],
    "ListLoras": [{}],
    "GetKvConnectorInfo": [{}],
    "GetKvEventSources": [{"dataParallelRanks": [0]}, {}],
    "SubscribeKvEvents": [{"includeSnapshot": True}, {"dataParallelRanks": [0], "startSequenceNumber": 1}],
    "SubscribeRuntimeEvents": [{"types": [1, 2]}, {}],
}


@dataclass(frozen=True)
class Method:
    """One RPC: its full name, whether it streams responses, its message types and error type."""

    path: str
    streaming: bool
    request: type[Message]
    response: type[Message]
    error: type[Message]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


def methods() -> list[Method]:
    """Every RPC of revision 1 (openengine.v1.OpenEngine) and of v0.1.0 (Inference + Control)."""
    out = []
    for pb2, services, error in ((openengine_pb2, ("OpenEngine",), error_pb2.EngineError),
                                 (v01_openengine_pb2, ("Inference", "Control"), v01_error_pb2.EngineError)):
        for name in services:
            service = pb2.DESCRIPTOR.services_by_name[name]
            for m in service.methods:
                out.append(Method(f"/{service.full_name}/{m.name}", m.server_streaming,
                                  message_factory.GetMessageClass(m.input_type),
                                  message_factory.GetMessageClass(m.output_type), error))
    return out


@dataclass(frozen=True)
class FuzzInput:
    index: int
    method: Method
    kind: str  # what was done to it, for the report of a failure
    data: bytes
    headers: tuple[tuple[str, str | bytes], ...] = ()  # request metadata besides the credentials


class InputMaker:
    def __init__(self, seed: int, lora_dir: str = "/nonexistent") -> None:
        self.rng = random.Random(seed)
        self.lora_dir = lora_dir
        self.huge = False  # huge strings and bytes only where one value is set, never in blown-up fields

    # ------------------------------------------------------------------ values

    def huge_text(self) -> str:
        n = self.rng.choice((4096, 8000, 65536, 300_000))
        return self.rng.choice(("x", "é", "🙂", "ab")) * (n // 2)

    def text(self) -> str:
        r = self.rng.random()
        if r < 0.25 and self.huge:
            return self.huge_text()
        if r < 0.5:
            return "".join(chr(self.rng.randrange(1, 0x2FFF)) for _ in range(self.rng.randrange(1, 40)))
        return self.rng.choice(ODD_TEXT)

    def scalar(self, field: descriptor.FieldDescriptor):
        t = field.type
        if t in INTS:
            if self.rng.random() < 0.8:
                return self.rng.choice(INTS[t])
            lo, hi = min(INTS[t]), max(INTS[t])
            return self.rng.randint(lo, hi)
        if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
            return self.rng.choice(FLOATS) if self.rng.random() < 0.8 else self.rng.uniform(-10, 10)
        if t == FD.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t == FD.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return self.rng.choice(known + [-1, 99, 2**31 - 1, -(2**31), max(known) + 1])
        if t == FD.TYPE_STRING:
            return self.text()
        if t == FD.TYPE_BYTES:
            return self.rng.randbytes(self.rng.choice((0, 1, 16, 4096, 200_000) if self.huge else (0, 1, 16)))
        raise AssertionError(f"unhandled field type {t}")

    # ------------------------------------------------------------------ messages

    def seed_message(self, method: Method) -> Message:
        seeds = SEEDS[method.name]
        raw = self.rng.choice(seeds)
        msg = method.request()
        json_format.ParseDict(_replace_lora(raw, self.lora_dir), msg, ignore_unknown_fields=True)
        return msg

    def fill(self, msg: Message, depth: int = 0) -> Message:
        """Set a random subset of ``msg``'s fields to random values (sub-messages to depth 3)."""
        for field in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.5:
                continue
            self._set_random(msg, field, depth)
        return msg

    def _set_random(self, msg: Message, field: descriptor.FieldDescriptor, depth: int, count: int | None = None):
        if _is_map(field):
            target = getattr(msg, field.name)
            key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            for _ in range(count if count is not None else self.rng.randrange(1, 4)):
                key = self.scalar(key_f)
                if value_f.message_type:
                    self.fill(target[key], depth + 1)
                else:
                    target[key] = self.scalar(value_f)
            return
        if field.is_repeated:
            target = getattr(msg, field.name)
            n = count if count is not None else self.rng.randrange(1, 4)
            if field.message_type:
                element = message_factory.GetMessageClass(field.message_type)
                template = self.fill(element(), depth + 1) if depth < 3 else None
                for _ in range(n):
                    item = target.add()
                    if template is not None:
                        item.CopyFrom(template)
            else:
                value = self.scalar(field)
                target.extend([value if count is not None else self.scalar(field) for _ in range(n)])
            return
        if field.message_type:
            if depth < 3:
                getattr(msg, field.name).SetInParent()
                self.fill(getattr(msg, field.name), depth + 1)
            return
        setattr(msg, field.name, self.scalar(field))

    def _fields(self, msg: Message, out: list) -> list:
        """Every (message, field) below ``msg`` a mutation may touch: set fields' sub-messages are
        walked; unset fields of messages present are candidates too."""
        for field in msg.DESCRIPTOR.fields:
            out.append((msg, field))
            if field.message_type and not _is_map(field):
                if field.is_repeated:
                    for item in getattr(msg, field.name)[:3]:
                        self._fields(item, out)
                elif msg.HasField(field.name):
                    self._fields(getattr(msg, field.name), out)
        return out

    def mutate(self, msg: Message) -> str:
        fields = self._fields(msg, [])
        if not fields:
            return "no fields"
        parent, field = self.rng.choice(fields)
        r = self.rng.random()
        try:
            if field.is_repeated and r < 0.35:  # blown up
                n = self.rng.choice((200, 5000, 60_000)) if not field.message_type else self.rng.choice((50, 2000))
                self._set_random(parent, field, 2, count=n)
                return f"{field.full_name} x{n}"
            if field.message_type and not field.is_repeated and r < 0.5:
                if parent.HasField(field.name) and self.rng.random() < 0.5:
                    parent.ClearField(field.name)
                    return f"{field.full_name} cleared"
                self._set_random(parent, field, 1)
                return f"{field.full_name} random"
            if field.message_type or field.is_repeated:
                self._set_random(parent, field, 2)
                return f"{field.full_name} added"
            self.huge = True
            try:
                value = self.scalar(field)
            finally:
                self.huge = False
            setattr(parent, field.name, value)
            return f"{field.full_name}={_short(value)}"
        except (ValueError, TypeError, OverflowError) as exc:  # protobuf's own range checks
            return f"{field.full_name} refused by protobuf ({type(exc).__name__})"

    # ------------------------------------------------------------------ encodings

    def corrupt(self, data: bytes) -> tuple[str, bytes]:
        rng, b = self.rng, bytearray(data)
        how = rng.choice(("truncate", "flip", "insert", "duplicate", "length", "unknown", "wiretype"))
        if how == "truncate" and b:
            return how, bytes(b[:rng.randrange(len(b))])
        if how == "flip" and b:
            for _ in range(rng.randrange(1, 9)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            return how, bytes(b)
        if how == "insert":
            at = rng.randrange(len(b) + 1)
            return how, bytes(b[:at] + rng.randbytes(rng.randrange(1, 16)) + b[at:])
        if how == "duplicate" and b:
            at, n = rng.randrange(len(b)), rng.randrange(1, 64)
            return how, bytes(b[:at] + b[at:at + n] * rng.randrange(2, 50) + b[at:])
        if how == "length":  # a length-delimited field claiming more than there is
            return how, bytes(b) + bytes([(rng.randrange(1, 16) << 3) | 2]) + _varint(rng.choice((5, 2**31, 2**63)))
        if how == "unknown":
            tag = rng.choice((999, 2**29 - 1, 19000, 15))
            return how, bytes(b) + _varint(tag << 3 | 2) + _varint(4) + b"abcd"
        # a known field number with the wrong wire type
        return "wiretype", bytes(b) + _varint((rng.randrange(1, 14) << 3) | rng.choice((0, 1, 5, 3, 4, 6, 7))) + b"\x01"

    # ------------------------------------------------------------------ request metadata

    def headers(self) -> tuple[tuple[str, str | bytes], ...]:
        """Request metadata v0.1.0 reads (its routing, admission and trace keys), with odd values,
        repeated, or beside application keys and binary headers; together under gRPC's 8 KiB
        header limit, beyond which the transport refuses a call before any handler runs."""
        rng, out = self.rng, []
        for _ in range(rng.randrange(1, 4)):
            key = rng.choice(HEADER_KEYS)
            if key.endswith("-bin"):
                value = rng.randbytes(rng.choice((0, 1, 64, 1500)))
            else:
                value = rng.choice(HEADER_VALUES)
                if value == "@long@":
                    value = "9" * rng.choice((20, 400, 4500))
            out.append((key, value))
        while sum(len(k) + len(v) for k, v in out) > 6000:
            out.pop()
        return tuple(out)

    # ------------------------------------------------------------------ inputs

    def make(self, index: int, method: Method) -> FuzzInput:
        r = self.rng.random()
        if r < 0.12:
            data = self.rng.randbytes(self.rng.choice((0, 1, 2, 5, 16, 64, 512, 4096)))
            return FuzzInput(index, method, "random bytes", data)
        if r < 0.25:
            msg = self.fill(method.request())
            kind = "random message"
        else:
            msg = self.seed_message(method)
            kind = "; ".join(self.mutate(msg) for _ in range(self.rng.choice((1, 1, 2, 3))))
        data = msg.SerializeToString()
        if len(data) > MAX_INPUT_BYTES:
            data = data[:MAX_INPUT_BYTES]
            kind += "; cut to the size limit"
        if self.rng.random() < 0.3 or kind.startswith("no fields"):
            how, data = self.corrupt(data)
            kind += f"; {how}"
        headers = self.headers() if self.rng.random() < 0.15 else ()
        if headers:
            kind += f"; headers {[k for k, _ in headers]}"
        return FuzzInput(index, method, kind, data, headers)

    def inputs(self, count: int, targets: list[Method]) -> Iterator[FuzzInput]:
        """``count`` inputs spread over ``targets`` (Generate, the most complex, weighted 4x), made
        as they are taken (all at once would hold a few hundred MB)."""
        weights = [4 if m.name == "Generate" else 1 for m in targets]
        for i in range(count):
            yield self.make(i, self.rng.choices(targets, weights)[0])


def _is_map(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _replace_lora(value, lora_dir: str):
    if isinstance(value, dict):
        return {k: _replace_lora(v, lora_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_lora(v, lora_dir) for v in value]
    return lora_dir if value == LORA_DIR else value


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} chars)"
