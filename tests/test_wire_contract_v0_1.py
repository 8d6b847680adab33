"""The v0.1.0 wire contract: the vendored canonical protos against our shifted stubs, field by field.

``proto/upstream-v0.1.0`` (upstream 4def7c5 plus the release's drain removals) is compiled by protoc
here, unshifted, and every message, field (number, type, label, presence, oneof), enum value and RPC
(path, streaming) is compared with the descriptors of ``openengine_adapters.v0_1``, whose only
difference may be the message package. Pinned facts guard the renumberings a careless re-vendor
would lose, and every ``server_mapping.PASSTHROUGH`` pair is proved wire-identical (the surface sends
those messages by their bytes).
"""

from __future__ import annotations

import pathlib

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_tools import protoc

from openengine_adapters.v0_1 import (
    error_pb2,
    generation_pb2,
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    openengine_pb2,
    server_pb2,
)
from openengine_adapters.wire.v0_1.server_mapping import PASSTHROUGH

ROOT = pathlib.Path(__file__).resolve().parent.parent
CANONICAL = ROOT / "proto" / "upstream-v0.1.0"
MODULES = (error_pb2, generation_pb2, kv_pb2, lifecycle_pb2, lora_pb2, model_pb2, openengine_pb2, server_pb2)
CANONICAL_PACKAGE, SHIFTED_PACKAGE = "openengine.v1", "openengine.v1.upstream"


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> descriptor_pb2.FileDescriptorSet:
    out = tmp_path_factory.mktemp("v0_1") / "set.pb"
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(CANONICAL)) for p in (CANONICAL / "openengine" / "v1").glob("*.proto"))
    assert protoc.main(["protoc", f"-I{CANONICAL}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={out}", *protos]) == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _unshift(name: str) -> str:
    return name.replace(f".{SHIFTED_PACKAGE}.", f".{CANONICAL_PACKAGE}.")


def _field_facts(f: descriptor_pb2.FieldDescriptorProto, oneofs) -> tuple:
    return (f.name, f.number, f.type, f.label, _unshift(f.type_name), f.proto3_optional,
            oneofs[f.oneof_index] if f.HasField("oneof_index") else None)


def _messages(files) -> dict[str, tuple]:
    out = {}

    def walk(prefix, msg):
        oneofs = [o.name for o in msg.oneof_decl]
        out[f"{prefix}{msg.name}"] = tuple(sorted(_field_facts(f, oneofs) for f in msg.field))
        for nested in msg.nested_type:
            walk(f"{prefix}{msg.name}.", nested)

    for fd in files:
        for msg in fd.message_type:
            walk("", msg)
    return out


def _enums(files) -> dict[str, dict[str, int]]:
    return {e.name: {v.name: v.number for v in e.value} for fd in files for e in fd.enum_type}


def _services(files) -> dict[str, tuple]:
    return {f"{fd.package}.{s.name}": tuple(sorted(
        (m.name, _unshift(m.input_type), _unshift(m.output_type), m.client_streaming, m.server_streaming)
        for m in s.method)) for fd in files for s in fd.service}


def _ours() -> list[descriptor_pb2.FileDescriptorProto]:
    files = []
    for module in MODULES:
        fd = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fd)
        files.append(fd)
    return files


def _upstream(fds) -> list[descriptor_pb2.FileDescriptorProto]:
    return [f for f in fds.file if f.name.startswith("openengine/")]


def test_every_message_matches_the_canonical_protos(canonical):
    assert _messages(_ours()) == _messages(_upstream(canonical))


def test_every_enum_matches_the_canonical_protos(canonical):
    assert _enums(_ours()) == _enums(_upstream(canonical))


def test_services_and_rpc_paths_match(canonical):
    assert _services(_ours()) == _services(_upstream(canonical))
    assert openengine_pb2.DESCRIPTOR.package == CANONICAL_PACKAGE, "method paths carry the canonical package"
    paths = {f"/{s.full_name}/{m.name}" for s in openengine_pb2.DESCRIPTOR.services_by_name.values()
             for m in s.methods}
    assert paths == {"/openengine.v1.Inference/Generate"} | {f"/openengine.v1.Control/{m}" for m in (
        "GetServerInfo", "GetModelInfo", "GetLoad", "Health", "Abort", "LoadLora", "UnloadLora", "ListLoras",
        "GetKvEventSources", "SubscribeKvEvents")}


def test_the_release_renumberings_are_pinned():
    assert error_pb2.ErrorCode.Value("ERROR_CODE_INTERNAL") == 11
    assert "ERROR_CODE_DRAINING" not in error_pb2.ErrorCode.keys()
    assert lifecycle_pb2.HealthState.Value("HEALTH_STATE_NOT_READY") == 4
    assert "HEALTH_STATE_DRAINING" not in lifecycle_pb2.HealthState.keys()
    conn = kv_pb2.KvConnectorInfo.DESCRIPTOR.fields_by_name
    assert conn["schema_version"].number == 8 and "supports_drain" not in conn
    kv = generation_pb2.KvOptions.DESCRIPTOR.fields_by_name
    assert (kv["bypass_prefix_cache"].number, kv["cache_salt"].number) == (2, 3) and "data_parallel_rank" not in kv
    gen = generation_pb2.GenerateRequest.DESCRIPTOR.fields_by_name
    assert gen["extra"].number == 12 and gen["extra"].message_type.full_name == "google.protobuf.Struct"
    assert "priority" not in gen and "metadata" not in gen
    assert model_pb2.ModelInfo.DESCRIPTOR.fields_by_name["extra"].number == 28
    assert server_pb2.ServerInfo.DESCRIPTOR.fields_by_name["extra"].number == 12
    assert server_pb2.LoadInfo.DESCRIPTOR.fields_by_name["attributes"].message_type.full_name == \
        "google.protobuf.Struct"
    assert server_pb2.ParallelismInfo.DESCRIPTOR.fields_by_name["decode_context_parallel_size"].number == 6


def _shape(desc, seen=None) -> tuple:
    """A message's wire shape: numbers, wire types, labels and nested shapes (names of types aside)."""
    seen = seen if seen is not None else set()
    if desc.full_name in seen:
        return ("recursive",)
    seen = seen | {desc.full_name}
    fields = []
    for f in sorted(desc.fields, key=lambda f: f.number):
        nested = _shape(f.message_type, seen) if f.message_type is not None else None
        enum = f.enum_type
        values = tuple(sorted((v.number, v.name.split("_", 2)[-1]) for v in enum.values)) if enum else None
        fields.append((f.number, f.name, f.type, f.is_repeated, f.has_presence, nested, values))
    return tuple(fields)


@pytest.mark.parametrize("v0_1_type", list(PASSTHROUGH), ids=lambda t: t.DESCRIPTOR.name)
def test_passthrough_pairs_are_wire_identical(v0_1_type):
    assert _shape(v0_1_type.DESCRIPTOR) == _shape(PASSTHROUGH[v0_1_type].DESCRIPTOR)


def test_token_events_are_the_same_bytes_in_both_contracts():
    """The per-token path sends revision-1 GenerateResponses on the v0.1.0 surface untranslated."""
    from openengine_adapters.v1 import generation_pb2 as rev1

    rev1_fields = rev1.GenerateResponse.DESCRIPTOR.fields_by_name
    for name, field in generation_pb2.GenerateResponse.DESCRIPTOR.fields_by_name.items():
        assert rev1_fields[name].number == field.number
        assert rev1_fields[name].type == field.type
        if name != "error" and field.message_type is not None:
            assert _shape(field.message_type) == _shape(rev1_fields[name].message_type)
    assert set(rev1_fields) == set(generation_pb2.GenerateResponse.DESCRIPTOR.fields_by_name)


def test_both_contracts_share_one_default_pool():
    pool = descriptor_pool.Default()
    assert pool.FindServiceByName("openengine.v1.OpenEngine")
    assert pool.FindServiceByName("openengine.v1.Inference").methods_by_name["Generate"].input_type.full_name == \
        "openengine.v1.upstream.GenerateRequest"
