"""The wire contract: our openengine.v1 descriptors against the spec text, field by field.

The message/enum/service blocks of spec/openengine-api-v1.md are the source of truth. They are
extracted, compiled with grpc_tools.protoc into a FileDescriptorSet and compared with the
descriptors of the committed stubs (openengine_adapters.v1.*_pb2). Messages are also serialized
across the two schemas (a dynamic class built from the spec, and our generated class) to prove
byte-level interoperability. The committed stubs must be what tools/gen_proto.py produces now,
and the seam's IntEnums in openengine_adapters/types.py must mirror the proto enums exactly.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import pathlib
import re

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_tools import protoc

from openengine_adapters import types as oe_types

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec" / "openengine-api-v1.md"
SPEC_PROVENANCE = ROOT / "spec" / "PROVENANCE.md"
STUB_DIR = ROOT / "openengine_adapters" / "v1"
GEN_PROTO = ROOT / "tools" / "gen_proto.py"
PACKAGE = "openengine.v1"
SERVICE = f"{PACKAGE}.OpenEngine"
PROTOC_INCLUDE = pathlib.Path(grpc_tools.__file__).parent / "_proto"

_BLOCK_START = re.compile(r"^(message|enum|service) (\w+) \{")
_TYPE = descriptor_pb2.FieldDescriptorProto.Type.Name
_LABEL = descriptor_pb2.FieldDescriptorProto.Label.Name


# --------------------------------------------------------------------------- spec extraction


def extract_blocks(text: str) -> list[tuple[str, str, str]]:
    """Every top-level ``message|enum|service Name { ... }`` block: (kind, name, text)."""
    lines = text.splitlines()
    blocks: list[tuple[str, str, str]] = []
    i = 0
    while i < len(lines):
        m = _BLOCK_START.match(lines[i])
        if m is None:
            i += 1
            continue
        depth, body = 0, []
        while True:
            if i >= len(lines):
                raise AssertionError(f"unbalanced braces in spec block {m.group(2)}")
            line = lines[i]
            code = line.split("//", 1)[0]
            depth += code.count("{") - code.count("}")
            body.append(line)
            i += 1
            if depth == 0:
                break
        blocks.append((m.group(1), m.group(2), "\n".join(body)))
    return blocks


@pytest.fixture(scope="module")
def spec_blocks() -> list[tuple[str, str, str]]:
    return extract_blocks(SPEC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def spec_fds(spec_blocks, tmp_path_factory) -> descriptor_pb2.FileDescriptorSet:
    """The spec's blocks compiled by protoc (struct.proto included)."""
    tmp = tmp_path_factory.mktemp("spec_proto")
    src = tmp / "openengine_spec.proto"
    src.write_text(
        'syntax = "proto3";\n\npackage openengine.v1;\n\nimport "google/protobuf/struct.proto";\n\n'
        + "\n\n".join(body for _, _, body in spec_blocks) + "\n",
        encoding="utf-8",
    )
    out = tmp / "spec.fds"
    rc = protoc.main([
        "protoc", f"-I{tmp}", f"-I{PROTOC_INCLUDE}", "--include_imports",
        f"--descriptor_set_out={out}", src.name,
    ])
    assert rc == 0, f"protoc could not compile the spec's blocks (exit {rc})"
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@pytest.fixture(scope="module")
def spec_file(spec_fds) -> descriptor_pb2.FileDescriptorProto:
    (f,) = [f for f in spec_fds.file if f.package == PACKAGE]
    return f


@pytest.fixture(scope="module")
def spec_pool(spec_fds) -> descriptor_pool.DescriptorPool:
    """A pool of its own, so the spec's types never collide with the generated ones."""
    pool = descriptor_pool.DescriptorPool()
    for f in spec_fds.file:  # dependencies come first in --include_imports output
        pool.Add(f)
    return pool


# --------------------------------------------------------------------------- our descriptors


def our_modules():
    names = sorted(p.stem for p in STUB_DIR.glob("*_pb2.py"))
    return [importlib.import_module(f"openengine_adapters.v1.{n}") for n in names]


@pytest.fixture(scope="module")
def our_files() -> list[descriptor_pb2.FileDescriptorProto]:
    files = []
    for mod in our_modules():
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        files.append(fdp)
    return files


# --------------------------------------------------------------------------- normalization


def _collect(files) -> dict[str, tuple[str, object]]:
    """full name -> ('message'|'enum'|'service', proto) for every type in ``files``."""
    out: dict[str, tuple[str, object]] = {}

    def add_message(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{msg.name}"
        out[name] = ("message", msg)
        for nested in msg.nested_type:
            add_message(name, nested)
        for e in msg.enum_type:
            out[f"{name}.{e.name}"] = ("enum", e)

    for f in files:
        if f.package != PACKAGE:
            continue
        for msg in f.message_type:
            add_message(f.package, msg)
        for e in f.enum_type:
            out[f"{f.package}.{e.name}"] = ("enum", e)
        for s in f.service:
            out[f"{f.package}.{s.name}"] = ("service", s)
    return out


def _field_shape(field: descriptor_pb2.FieldDescriptorProto, msg: descriptor_pb2.DescriptorProto,
                 types: dict[str, tuple[str, object]]) -> dict:
    oneof = None
    if field.HasField("oneof_index"):
        oneof = msg.oneof_decl[field.oneof_index].name
    shape = {
        "number": field.number,
        "type": _TYPE(field.type),
        "label": _LABEL(field.label),
        "type_name": field.type_name,
        "proto3_optional": field.proto3_optional,
        "oneof": oneof,
        "map_entry": None,
    }
    if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
        kind, target = types.get(field.type_name.lstrip("."), (None, None))
        if kind == "message" and target.options.map_entry:
            key, value = sorted(target.field, key=lambda f: f.number)
            shape["map_entry"] = (
                (key.name, key.number, _TYPE(key.type), key.type_name),
                (value.name, value.number, _TYPE(value.type), value.type_name),
            )
    return shape


def normalize(files) -> dict[str, dict]:
    """A comparable, name-keyed picture of every message, enum and service."""
    types = _collect(files)
    out: dict[str, dict] = {}
    for name, (kind, proto) in types.items():
        if kind == "message":
            out[name] = {
                "kind": kind,
                "map_entry": proto.options.map_entry,
                "fields": {f.name: _field_shape(f, proto, types) for f in proto.field},
                "oneofs": sorted(o.name for o in proto.oneof_decl),
            }
        elif kind == "enum":
            out[name] = {"kind": kind, "values": {v.name: v.number for v in proto.value}}
        else:
            out[name] = {
                "kind": kind,
                "methods": {
                    m.name: {
                        "input_type": m.input_type,
                        "output_type": m.output_type,
                        "client_streaming": m.client_streaming,
                        "server_streaming": m.server_streaming,
                    }
                    for m in proto.method
                },
            }
    return out


@pytest.fixture(scope="module")
def spec_types(spec_file) -> dict[str, dict]:
    return normalize([spec_file])


@pytest.fixture(scope="module")
def our_types(our_files) -> dict[str, dict]:
    return normalize(our_files)


# --------------------------------------------------------------------------- tests: the spec text


def test_spec_blocks_are_extracted(spec_blocks):
    kinds = [k for k, _, _ in spec_blocks]
    names = [n for _, n, _ in spec_blocks]
    assert kinds.count("service") == 1
    assert len(names) == len(set(names)), "a type is defined twice in the spec"
    assert {"GenerateRequest", "EngineInfo", "KvSessionRef", "ErrorCode", "OpenEngine"} <= set(names)


def test_vendored_spec_is_the_one_its_provenance_records():
    """The spec text is vendored (tests read only the repository): it changes only with its record."""
    import hashlib

    recorded = re.search(r"^sha256: ([0-9a-f]{64})$", SPEC_PROVENANCE.read_text(), re.M)
    assert recorded, SPEC_PROVENANCE
    assert hashlib.sha256(SPEC.read_bytes()).hexdigest() == recorded.group(1), (
        f"{SPEC.relative_to(ROOT)} differs from the copy {SPEC_PROVENANCE.relative_to(ROOT)} records")


# --------------------------------------------------------------------------- tests: descriptors


def test_our_files_are_openengine_v1(our_files):
    for f in our_files:
        assert f.package == PACKAGE, f.name
        assert f.syntax in ("", "proto3"), f.name
        assert f.name.startswith("openengine/v1/") and f.name.endswith(".proto"), f.name
        for dep in f.dependency:
            assert dep.startswith("openengine/v1/") or dep == "google/protobuf/struct.proto", (
                f"{f.name} imports {dep}")


def test_our_types_resolve_in_default_pool(our_types):
    pool = descriptor_pool.Default()
    for name, t in our_types.items():
        finder = {"message": pool.FindMessageTypeByName, "enum": pool.FindEnumTypeByName,
                  "service": pool.FindServiceByName}[t["kind"]]
        assert finder(name).full_name == name


def test_same_type_names(spec_types, our_types):
    for kind in ("message", "enum", "service"):
        spec = {n for n, t in spec_types.items() if t["kind"] == kind}
        ours = {n for n, t in our_types.items() if t["kind"] == kind}
        assert not spec - ours, f"{kind}s in the spec but missing from our protos: {sorted(spec - ours)}"
        assert not ours - spec, f"{kind}s in our protos but not in the spec: {sorted(ours - spec)}"


def test_messages_match_spec(spec_types, our_types):
    problems = []
    for name, spec in sorted(spec_types.items()):
        ours = our_types.get(name)
        if spec["kind"] != "message" or ours is None:
            continue
        if spec["map_entry"] != ours["map_entry"]:
            problems.append(f"{name}: map_entry {ours['map_entry']} != spec {spec['map_entry']}")
        if spec["oneofs"] != ours["oneofs"]:
            problems.append(f"{name}: oneofs {ours['oneofs']} != spec {spec['oneofs']}")
        for fname in sorted(set(spec["fields"]) | set(ours["fields"])):
            s, o = spec["fields"].get(fname), ours["fields"].get(fname)
            if s is None:
                problems.append(f"{name}.{fname}: not in the spec (ours: {o})")
            elif o is None:
                problems.append(f"{name}.{fname}: missing from our proto (spec: {s})")
            elif s != o:
                diff = {k: (o[k], s[k]) for k in s if s[k] != o[k]}
                problems.append(f"{name}.{fname}: (ours, spec) differ in {diff}")
    assert not problems, "message definitions drift from the spec:\n  " + "\n  ".join(problems)


def test_enums_match_spec(spec_types, our_types):
    problems = []
    for name, spec in sorted(spec_types.items()):
        ours = our_types.get(name)
        if spec["kind"] == "enum" and ours is not None and spec["values"] != ours["values"]:
            problems.append(f"{name}: ours {ours['values']} != spec {spec['values']}")
    assert not problems, "enum definitions drift from the spec:\n  " + "\n  ".join(problems)


def test_service_matches_spec(spec_types, our_types):
    spec, ours = spec_types[SERVICE], our_types[SERVICE]
    assert len(spec["methods"]) == 17
    diff = {n: (ours["methods"].get(n), spec["methods"].get(n))
            for n in set(spec["methods"]) | set(ours["methods"])
            if ours["methods"].get(n) != spec["methods"].get(n)}
    assert not diff, f"OpenEngine methods drift from the spec, name -> (ours, spec): {diff}"
    streaming = {n for n, m in ours["methods"].items() if m["server_streaming"]}
    assert streaming == {"Generate", "Drain", "SubscribeKvEvents", "SubscribeRuntimeEvents"}
    assert not any(m["client_streaming"] for m in ours["methods"].values())


def test_generated_service_stub_has_every_method():
    from openengine_adapters.v1 import openengine_pb2, openengine_pb2_grpc

    service = openengine_pb2.DESCRIPTOR.services_by_name["OpenEngine"]
    assert service.full_name == SERVICE
    assert len(service.methods) == 17
    for m in service.methods:
        assert hasattr(openengine_pb2_grpc.OpenEngineServicer, m.name), m.name


# --------------------------------------------------------------------------- tests: byte interop

# Rich samples: oneofs, maps, optional zero/false presence, repeated packed scalars, nested
# messages, bytes, google.protobuf.Struct, enums.
SAMPLES: dict[str, dict] = {
    "GenerateRequest": {
        "request_id": "r-1", "model": "tiny", "token_ids": {"ids": [1, 2, 300, 70000]},
        "sampling": {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "seed": "18446744073709551615",
                     "num_sequences": 2},
        "stopping": {"max_tokens": 0, "min_tokens": 1, "ignore_eos": False,
                     "conditions": [{"stop_text": "\n"}, {"stop_token_id": 0}]},
        "response": {"return_prompt_logprobs": True, "prompt_candidates": {"top_n": 0},
                     "return_output_logprobs": False, "output_candidates": {"all": {}},
                     "prompt_logprob_start": 0},
        "kv": {"session": {"session_id": "s", "transfer_backend": "nixl", "dp_rank": 3,
                           "endpoints": [{"host": "10.0.0.1", "port": 7000, "protocol": "tcp"}],
                           "attributes_struct": {"room": 42, "ok": True, "list": [1, "a", None],
                                                 "nested": {"x": 1.5}}},
               "data_parallel_rank": 0, "bypass_prefix_cache": False, "cache_salt": ""},
        "guided": {"choice": {"choices": ["yes", "no"]}, "backend": "xgrammar"},
        "media": [{"modality": "MODALITY_AUDIO", "raw_bytes": "AAEC/w==", "mime_type": "audio/wav",
                   "uuid": "u"},
                  {"modality": "MODALITY_IMAGE", "url": "https://example.com/a.png"}],
        "lora_name": "l", "priority": -5, "metadata": {"b": "2", "a": "1"},
    },
    "GenerateResponse": {
        "request_id": "r-1",
        "finished": {"output_index": 0, "reason": "FINISH_REASON_STOP", "message": "",
                     "stop_match": {"eos_token_id": 0}},
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                  "cached_prompt_tokens": 0, "reasoning_tokens": 0},
    },
    "ModelInfo": {
        "model_id": "m", "served_model_name": "m", "served_model_aliases": ["a", "b"],
        "max_context_length": 4096, "total_kv_blocks": "123456789012", "tokenizer_modes": ["auto"],
        "supports_text_input": True, "supports_multimodal": False, "supports_lora": False,
        "generation": {"prompt_logprobs": {"supported": False},
                       "output_logprobs": {
                           "supported": True, "max_top_n": 20,
                           "candidate_selection_modes": ["CANDIDATE_TOKEN_SELECTION_MODE_TOP_N"]},
                       "guided_decoding": {"supported": True,
                                           "modes": ["GUIDED_DECODING_MODE_JSON_SCHEMA",
                                                     "GUIDED_DECODING_MODE_JSON_OBJECT"]},
                       "max_num_sequences": 4, "supports_priority": False},
        "reasoning_parser": "qwen3",
        "tasks": {"embed": {"supported": True, "input_types": ["TASK_INPUT_TYPE_TEXT"],
                            "encodings": ["EMBEDDING_ENCODING_SPARSE"], "dimension": 8,
                            "modalities": ["MODALITY_VIDEO"]},
                  "score": {"supported": False, "higher_is_better": True,
                            "normalizations": ["SCORE_NORMALIZATION_SOFTMAX"], "max_label_token_ids": 2}},
    },
    "LoadInfo": {
        "instance_id": "i", "timestamp_unix_nanos": "1700000000000000000", "running_requests": 0,
        "queued_requests": 0, "used_kv_blocks": "0", "decode_batch_size": 7,
        "ranks": [{"data_parallel_rank": 0, "running_requests": 0}, {"data_parallel_rank": 1}],
        "attributes": {"z": "26", "engine": "fake"},
    },
    "EmbedResponse": {
        "request_id": "e",
        "outputs": [
            {"item_id": "a", "input_index": 0, "granularity": "TASK_OUTPUT_GRANULARITY_TOKEN",
             "dense": {"shape": ["2", "2"], "values": [0.5, -1.25, 0.0, 3.0]}, "token_ids": [104, 105]},
            {"item_id": "b", "input_index": 1, "granularity": "TASK_OUTPUT_GRANULARITY_SEQUENCE",
             "sparse": {"shape": ["10"], "indices": ["0", "9"], "values": [1.0, 2.0]}},
        ],
        "usage": {"input_tokens": "4", "cached_input_tokens": "0"},
    },
    "ScoreResponse": {
        "request_id": "s", "granularity": "TASK_OUTPUT_GRANULARITY_SEQUENCE",
        "semantics": "TASK_VALUE_SEMANTICS_RELEVANCE", "higher_is_better": False,
        "normalization": "SCORE_NORMALIZATION_NONE", "label_token_ids": [5, 1],
        "groups": [{"group_id": "g", "group_index": 0,
                    "candidates": [{"candidate_id": "c", "candidate_index": 0,
                                    "scores": {"shape": ["1"], "values": [0.25]}}]}],
    },
    "SubscribeKvEventsResponse": {
        "batch": {"sequence_number": "9", "timestamp_unix_nanos": "1", "data_parallel_rank": 1,
                  "events": [
                      {"request_id": "r", "block_stored": {
                          "block_hashes": [{"value": "AAECAwQFBgc=", "encoding": "int64"}],
                          "parent_block_hash": {"value": "", "encoding": "bytes"},
                          "token_ids": [1, 2], "block_size": 16, "lora_id": "-1",
                          "medium": "STORAGE_MEDIUM_CPU_PINNED", "extra_keys": [{"values": ["x", "y"]}],
                          "group_idx": 2, "kv_cache_spec_kind": "sliding_window",
                          "kv_cache_spec_sliding_window": 128}},
                      {"block_removed": {"block_hashes": [{"value": "AQ==", "encoding": "bytes"}],
                                         "medium": "STORAGE_MEDIUM_DISK"}},
                      {"all_blocks_cleared": {}},
                  ]},
    },
    "DrainResponse": {
        "error": {"code": "ERROR_CODE_DRAINING", "message": "m", "retryable": True, "retry_after_ms": "0",
                  "details": {"in_flight_requests": 2, "why": ["a", {"b": False}]}},
        "in_flight_requests": 0, "open_kv_sessions": 0,
    },
    "EngineInfo": {
        "engine_name": "vllm", "engine_version": "1", "role": "ENGINE_ROLE_DECODE", "instance_id": "x",
        "supported_models": ["m"], "parallelism": {"tensor_parallel_size": 2, "data_parallel_rank": 0},
        "kv_connector": {"enabled": False, "supported_protocols": ["ucx"], "schema_version": 0},
        "schema_revision": 1, "minimum_client_revision": 1, "schema_release": "0" * 40,
    },
}


def _our_class(name: str):
    return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(
        f"{PACKAGE}.{name}"))


def _spec_class(pool: descriptor_pool.DescriptorPool, name: str):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def _as_dict(msg) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_spec_bytes_parse_identically_in_our_schema(spec_pool, name):
    spec_msg = json_format.ParseDict(SAMPLES[name], _spec_class(spec_pool, name)())
    wire = spec_msg.SerializeToString(deterministic=True)
    ours = _our_class(name).FromString(wire)
    assert ours.SerializeToString(deterministic=True) == wire
    # Equal bytes alone would also hold for fields our schema only keeps as unknown fields.
    assert _as_dict(ours) == _as_dict(spec_msg)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_our_bytes_parse_identically_in_spec_schema(spec_pool, name):
    ours = json_format.ParseDict(SAMPLES[name], _our_class(name)())
    wire = ours.SerializeToString(deterministic=True)
    spec_msg = _spec_class(spec_pool, name).FromString(wire)
    assert spec_msg.SerializeToString(deterministic=True) == wire
    assert _as_dict(spec_msg) == _as_dict(ours)


def test_explicit_zero_presence_survives_the_wire(spec_pool):
    """proto3 optional zero/false is on the wire and present on the other side."""
    spec_info = _spec_class(spec_pool, "LoadInfo")(running_requests=0)
    ours = _our_class("LoadInfo").FromString(spec_info.SerializeToString())
    assert ours.HasField("running_requests") and ours.running_requests == 0
    assert not ours.HasField("queued_requests")
    caps = _our_class("GenerationCapabilities")(supports_priority=False)
    back = _spec_class(spec_pool, "GenerationCapabilities").FromString(caps.SerializeToString())
    assert back.HasField("supports_priority") and back.supports_priority is False
    assert not back.HasField("supports_cache_salt")


# --------------------------------------------------------------------------- tests: stub freshness


def _load_gen_proto():
    spec = importlib.util.spec_from_file_location("_oe_gen_proto", GEN_PROTO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sub", ["v1", "v0_1"])
def test_committed_stubs_are_fresh(tmp_path, sub):
    """Both contracts' committed stubs are what tools/gen_proto.py makes from proto/ now."""
    gen = _load_gen_proto()
    written = [p for p in gen.generate(tmp_path) if p.parent.name == sub]
    fresh = {p.name: p.read_bytes() for p in written}
    assert {p.name for p in (tmp_path / sub).iterdir()} == set(fresh)
    committed = {p.name: p.read_bytes() for p in (STUB_DIR.parent / sub).iterdir() if p.is_file()}
    hint = f"the committed stubs in openengine_adapters/{sub} are stale: run `nox -s proto`"
    missing, extra = sorted(set(fresh) - set(committed)), sorted(set(committed) - set(fresh))
    assert not missing, f"{hint} (generated but not committed: {missing})"
    assert not extra, f"{hint} (committed but no longer generated: {extra})"
    stale = sorted(n for n in fresh if fresh[n] != committed[n])
    assert not stale, f"{hint} (differs: {stale})"


# --------------------------------------------------------------------------- tests: seam enums

# Python IntEnum in openengine_adapters/types.py -> the openengine.v1 enum it mirrors.
MIRRORS: dict[type[enum.IntEnum], str] = {
    oe_types.EngineRole: "EngineRole",
    oe_types.CandidateMode: "CandidateTokenSelectionMode",
    oe_types.GuidedMode: "GuidedDecodingMode",
    oe_types.TaskInputType: "TaskInputType",
    oe_types.Granularity: "TaskOutputGranularity",
    oe_types.EmbeddingEncoding: "EmbeddingEncoding",
    oe_types.ValueSemantics: "TaskValueSemantics",
    oe_types.ScoreNormalization: "ScoreNormalization",
    oe_types.Modality: "Modality",
    oe_types.FinishReason: "FinishReason",
    oe_types.HealthState: "HealthState",
    oe_types.StorageMedium: "StorageMedium",
    oe_types.RuntimeEventType: "RuntimeEventType",
    oe_types.ErrorCode: "ErrorCode",
}


def _prefix(proto_enum: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", proto_enum).upper() + "_"


def test_every_seam_int_enum_is_checked():
    defined = {obj for obj in vars(oe_types).values()
               if isinstance(obj, type) and issubclass(obj, enum.IntEnum) and obj is not enum.IntEnum
               and obj.__module__ == oe_types.__name__}
    assert defined == set(MIRRORS), f"unmapped IntEnums: {sorted(c.__name__ for c in defined - set(MIRRORS))}"


@pytest.mark.parametrize("py_enum", list(MIRRORS), ids=lambda e: e.__name__)
def test_seam_enum_mirrors_proto(py_enum, spec_types):
    full = f"{PACKAGE}.{MIRRORS[py_enum]}"
    desc = descriptor_pool.Default().FindEnumTypeByName(full)
    proto_values = {v.name: v.number for v in desc.values}
    prefix = _prefix(MIRRORS[py_enum])
    seam_values = {prefix + m.name: int(m.value) for m in py_enum}
    assert seam_values == proto_values
    assert seam_values == spec_types[full]["values"]

