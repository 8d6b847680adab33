"""LoadLora under an allowed root (--lora-root): anything outside it, missing or not a directory gets
one answer, so LoadLora tells a caller nothing about which paths exist on the server."""

from __future__ import annotations

import os

import grpc
import pytest
from fake_backend import FakeBackend, default_card
from helpers import rejection, serve_backend, start_fake, stop_fake

from openengine_adapters.errors import RequestRejected
from openengine_adapters.security.channel import open_channel
from openengine_adapters.v1 import lora_pb2, openengine_pb2_grpc
from openengine_adapters.wire.v0_1.stub import V01Stub


def make_adapter(path) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    return str(path)


def load(path: str, lora_id: int = 1, name: str = "ad") -> lora_pb2.LoadLoraRequest:
    return lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=path))


async def test_only_directories_under_the_lora_root_load_and_refusals_do_not_tell_what_exists(tmp_path):
    root = tmp_path / "adapters"
    inside = make_adapter(root / "good")
    outside = make_adapter(tmp_path / "elsewhere" / "real")
    (root / "file").write_text("not a directory")
    os.symlink(outside, root / "escape")
    refused_paths = [
        outside,  # exists, outside the root
        str(tmp_path / "elsewhere" / "missing"),  # does not exist, outside
        str(root / "missing"),  # does not exist, inside
        str(root / "file"),  # not a directory
        str(root / "escape"),  # a symlink out of the root
        str(root / ".." / "elsewhere" / "real"),  # a climb out of the root
        "/etc",
    ]
    proc, port, log = await start_fake("--lora-root", str(root))
    try:
        assert any(f"LoRA adapter directories: under {root}" in line for line in log)
        async with open_channel(f"127.0.0.1:{port}") as channel:
            for stub in (openengine_pb2_grpc.OpenEngineStub(channel), V01Stub(channel)):
                answers = set()
                for path in refused_paths:
                    try:
                        await stub.LoadLora(load(path), timeout=5)
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, exc.details())
                        assert rejection(exc).message == exc.details()
                        answers.add(exc.details().replace(repr(path), "PATH"))
                    else:
                        raise AssertionError(f"{path} was loaded from outside the root")
                assert answers == {"adapter.source_path: PATH is not an adapter directory under this server's "
                                   "LoRA root (--lora-root)"}, answers
                loaded = await stub.LoadLora(load(inside + "/"), timeout=5)
                assert loaded.adapter.source_path == inside and not loaded.already_loaded
                await stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"), timeout=5)
    finally:
        await stop_fake(proc)


async def test_lora_disabled_is_failed_precondition_before_the_root_rule():
    """An engine without LoRA answers FAILED_PRECONDITION to LoadLora from any peer (the conformance
    check for it runs from the host into a container, which is not loopback)."""
    backend = FakeBackend(cards=[default_card(supports_lora=False)])
    async with serve_backend(backend) as h:
        class RemotePeer:  # the call's context as a non-loopback peer sees it
            def peer(self):
                return "ipv4:198.18.13.2:40000"

        adapter = lora_pb2.LoraAdapter(lora_id=1, lora_name="a", source_path="/tmp")
        request = lora_pb2.LoadLoraRequest(adapter=adapter)
        with pytest.raises(RequestRejected) as caught:  # the wire answers it with this status
            await h.service.LoadLora(request, RemotePeer())
        assert caught.value.status == grpc.StatusCode.FAILED_PRECONDITION
