"""LoadLora / UnloadLora / ListLoras and the use of loaded adapters (spec: "LoRA lifecycle")."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fake_backend import GREEDY_TEXT, FakeBackend, default_card
from helpers import collect, expect_status, gen_request, rejection, serve_backend
from stream_contract import check_generate_stream

from openengine_adapters.backend import LoraAdapterInfo
from openengine_adapters.v1 import lora_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXISTS = grpc.StatusCode.ALREADY_EXISTS
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def adapter_dir(root, name: str = "adapter") -> str:
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text('{"r": 8}')
    return str(d)


def load_req(lora_id: int = 1, name: str = "ad", path: str = "/nonexistent") -> lora_pb2.LoadLoraRequest:
    return lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
        lora_id=lora_id, lora_name=name, source_path=path))


async def listed(h) -> list[tuple[int, str, str]]:
    resp = await h.stub.ListLoras(lora_pb2.ListLorasRequest())
    return [(a.lora_id, a.lora_name, a.source_path) for a in resp.adapters]


def shifted(n: int) -> str:
    """What the fake generates greedily with any LoRA: every greedy token shifted by one."""
    return "".join(chr(ord(GREEDY_TEXT[i % len(GREEDY_TEXT)]) + 1) for i in range(n))


# --------------------------------------------------------------------------- LoadLora validation


def _file(tmp_path) -> str:
    f = tmp_path / "adapter.safetensors"
    f.write_text("x")
    return str(f)


INVALID_LOADS = [
    ("id-zero", lambda p: load_req(0, "ad", adapter_dir(p)), ["adapter.lora_id", "positive"]),
    ("id-negative", lambda p: load_req(-3, "ad", adapter_dir(p)), ["adapter.lora_id", "positive"]),
    ("empty-name", lambda p: load_req(1, "", adapter_dir(p)), ["adapter.lora_name"]),
    ("relative-path", lambda p: load_req(1, "ad", "adapters/ad"), ["adapter.source_path", "absolute"]),
    ("empty-path", lambda p: load_req(1, "ad", ""), ["adapter.source_path"]),
    ("path-is-a-file", lambda p: load_req(1, "ad", _file(p)), ["adapter.source_path", "directory"]),
    ("path-does-not-exist", lambda p: load_req(1, "ad", str(p / "missing")),
     ["adapter.source_path", "directory"]),
    ("no-adapter", lambda p: lora_pb2.LoadLoraRequest(), ["adapter"]),
]


@pytest.mark.parametrize(("make", "fragments"), [pytest.param(*r[1:], id=r[0]) for r in INVALID_LOADS])
async def test_load_rejects_invalid_adapter(oe, tmp_path, make, fragments):
    exc = await expect_status(oe.stub.LoadLora(make(tmp_path)), INVALID, *fragments)
    assert rejection(exc) is not None
    assert await listed(oe) == []
    assert oe.fake.loras == {}, "the engine was never asked to load it"


# --------------------------------------------------------------------------- load, idempotency, conflicts


async def test_load_then_identical_load_is_idempotent(oe, tmp_path):
    path = adapter_dir(tmp_path)
    first = await oe.stub.LoadLora(load_req(7, "ad", path))
    assert first.already_loaded is False
    assert (first.adapter.lora_id, first.adapter.lora_name, first.adapter.source_path) == (7, "ad", path)
    assert oe.fake.loras["ad"] == LoraAdapterInfo(7, "ad", path)
    again = await oe.stub.LoadLora(load_req(7, "ad", path))
    assert again.already_loaded is True
    assert again.adapter == first.adapter
    assert await listed(oe) == [(7, "ad", path)]


async def test_concurrent_identical_loads_register_once(oe, tmp_path):
    path = adapter_dir(tmp_path)
    results = await asyncio.gather(*(oe.stub.LoadLora(load_req(1, "ad", path)) for _ in range(4)))
    assert sorted(r.already_loaded for r in results) == [False, True, True, True]
    assert await listed(oe) == [(1, "ad", path)]


@pytest.mark.parametrize(("lora_id", "name", "same_path", "field"), [
    (1, "other", False, "lora_id"),
    (2, "ad", False, "lora_name"),
    (2, "other", True, "source_path"),
    (1, "ad", False, "lora_id"),          # same id and name, different path
    (1, "other", True, "lora_id"),        # same id and path, different name
])
async def test_conflicting_adapter_is_already_exists(oe, tmp_path, lora_id, name, same_path, field):
    path = adapter_dir(tmp_path, "a")
    other_path = adapter_dir(tmp_path, "b")
    await oe.stub.LoadLora(load_req(1, "ad", path))
    req = load_req(lora_id, name, path if same_path else other_path)
    exc = await expect_status(oe.stub.LoadLora(req), EXISTS, field, "'ad'")
    assert rejection(exc) is not None
    assert await listed(oe) == [(1, "ad", path)], "the loaded adapter is untouched"
    assert list(oe.fake.loras) == ["ad"]


async def test_same_directory_spelled_differently_conflicts(oe, tmp_path):
    path = adapter_dir(tmp_path)
    await oe.stub.LoadLora(load_req(1, "ad", path))
    await expect_status(oe.stub.LoadLora(load_req(2, "other", path + "/")), EXISTS, "source_path")


async def test_engine_rejection_registers_nothing(oe, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    exc = await expect_status(oe.stub.LoadLora(load_req(1, "ad", str(bare))), INVALID,
                              "adapter_config.json")
    assert rejection(exc) is not None
    assert await listed(oe) == []
    assert oe.fake.loras == {}
    await expect_status(oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad")), NOT_FOUND)
    await expect_status(oe.stub.Generate(gen_request(lora_name="ad")), NOT_FOUND, "lora_name")
    # The same id/name/path are all still free.
    (bare / "adapter_config.json").write_text("{}")
    ok = await oe.stub.LoadLora(load_req(1, "ad", str(bare)))
    assert ok.already_loaded is False


async def test_list_loras_sorted_by_id(oe, tmp_path):
    assert await listed(oe) == []
    for lora_id, name in ((5, "five"), (2, "two"), (9, "nine"), (3, "three")):
        await oe.stub.LoadLora(load_req(lora_id, name, adapter_dir(tmp_path, name)))
    assert [(i, n) for i, n, _ in await listed(oe)] == [(2, "two"), (3, "three"), (5, "five"), (9, "nine")]
    await oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="three"))
    assert [i for i, _, _ in await listed(oe)] == [2, 5, 9]


async def test_adapters_loaded_before_start_are_listed(tmp_path):
    fake = FakeBackend()
    fake.loras["pre"] = LoraAdapterInfo(4, "pre", adapter_dir(tmp_path))
    async with serve_backend(fake) as h:
        assert [(i, n) for i, n, _ in await listed(h)] == [(4, "pre")]
        req = gen_request("hi", request_id="pre-gen", lora_name="pre")
        check_generate_stream(req, await collect(h.stub, req))


# --------------------------------------------------------------------------- UnloadLora


async def test_unload_unknown_and_empty_name(oe):
    await expect_status(oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ghost")), NOT_FOUND,
                        "lora_name", "ghost")
    await expect_status(oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest()), INVALID, "lora_name")


async def test_unload_removes_adapter_and_frees_its_identity(oe, tmp_path):
    path = adapter_dir(tmp_path)
    await oe.stub.LoadLora(load_req(1, "ad", path))
    resp = await oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"))
    assert (resp.adapter.lora_id, resp.adapter.lora_name, resp.adapter.source_path) == (1, "ad", path)
    assert await listed(oe) == []
    assert oe.fake.loras == {}
    await expect_status(oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad")), NOT_FOUND)
    again = await oe.stub.LoadLora(load_req(1, "ad", path))
    assert again.already_loaded is False


# --------------------------------------------------------------------------- Generate with adapters


async def test_generate_with_loaded_then_unloaded_adapter(oe, tmp_path):
    await expect_status(oe.stub.Generate(gen_request(lora_name="ad")), NOT_FOUND, "lora_name", "ad")
    await oe.stub.LoadLora(load_req(1, "ad", adapter_dir(tmp_path)))

    req = gen_request("hi", request_id="with-lora", lora_name="ad")
    s = check_generate_stream(req, await collect(oe.stub, req))
    assert s.text[0] == shifted(16), "the fake engine saw the adapter"
    assert oe.fake.seen_params[-1].lora_name == "ad"

    base = gen_request("hi", request_id="no-lora")
    assert check_generate_stream(base, await collect(oe.stub, base)).text[0] == (GREEDY_TEXT * 2)[:16]

    await oe.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"))
    exc = await expect_status(oe.stub.Generate(gen_request(lora_name="ad", request_id="after")),
                              NOT_FOUND, "lora_name", "ad")
    assert rejection(exc) is not None


# --------------------------------------------------------------------------- LoRA-disabled engine


async def test_lora_disabled_engine_is_failed_precondition(serve, tmp_path):
    async with serve(None, cards=[default_card(supports_lora=False)]) as h:
        path = adapter_dir(tmp_path)
        for call in (h.stub.LoadLora(load_req(1, "ad", path)),
                     h.stub.LoadLora(load_req(0, "", "relative")),  # before argument checks
                     h.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad")),
                     h.stub.UnloadLora(lora_pb2.UnloadLoraRequest()),
                     h.stub.ListLoras(lora_pb2.ListLorasRequest())):
            exc = await expect_status(call, PRECONDITION, "LoRA")
            assert rejection(exc) is not None
        assert h.fake.loras == {}


async def test_generate_with_lora_on_lora_disabled_model(serve):
    async with serve(None, cards=[default_card(supports_lora=False)]) as h:
        await expect_status(h.stub.Generate(gen_request(lora_name="ad")), INVALID, "lora_name")
        req = gen_request("hi", request_id="plain")
        check_generate_stream(req, await collect(h.stub, req))


async def test_generate_with_lora_on_disabled_model_of_lora_engine(serve, tmp_path):
    """One model supports LoRA, another does not: the adapter is only usable on the first."""
    other = default_card(model_id="fake/plain", served_model_name="plain", served_model_aliases=(),
                         supports_lora=False)
    async with serve(None, cards=[default_card(), other]) as h:
        await h.stub.LoadLora(load_req(1, "ad", adapter_dir(tmp_path)))
        await expect_status(h.stub.Generate(gen_request(model="plain", lora_name="ad")), INVALID,
                            "lora_name")
        req = gen_request("hi", model="tiny", request_id="ok", lora_name="ad")
        assert check_generate_stream(req, await collect(h.stub, req)).text[0] == shifted(16)
