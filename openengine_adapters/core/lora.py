"""LoRA adapters: LoadLora, UnloadLora, ListLoras, and the table of loaded adapters that Generate
and the tasks check a request's ``lora_name`` against."""

from __future__ import annotations

import os

import grpc

from openengine_adapters.backend import LoraAdapterInfo
from openengine_adapters.core.state import CoreState
from openengine_adapters.errors import RequestRejected, invalid, not_found, permission_denied, rejected
from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import lora_pb2
from openengine_adapters.validation.peer import is_loopback


def lora_load_refusal(root: str | None, peer: str) -> RequestRejected | None:
    """With no adapter root, only loopback may name directories on this host for LoadLora."""
    if root is None and not is_loopback(peer):
        return permission_denied("LoadLora from the network needs an allowed adapter root on this server "
                                 "(--lora-root); without one only loopback may load adapters")
    return None


def _lora_message(info: LoraAdapterInfo) -> lora_pb2.LoraAdapter:
    return lora_pb2.LoraAdapter(lora_id=info.lora_id, lora_name=info.lora_name,
                                source_path=info.source_path)


class LoraRpcs(CoreState):
    def _require_lora(self) -> None:
        if not any(card.supports_lora for card in self.catalog.cards):
            raise RequestRejected(grpc.StatusCode.FAILED_PRECONDITION,
                                  "LoRA is not enabled on this engine", ErrorCode.UNSUPPORTED_FEATURE)

    async def LoadLora(self, request: lora_pb2.LoadLoraRequest, context):
        self._require_lora()
        if refusal := lora_load_refusal(self.options.lora_root, context.peer()):
            raise refusal
        a = request.adapter
        if not request.HasField("adapter"):
            raise invalid("adapter: required")
        if a.lora_id <= 0:
            raise invalid("adapter.lora_id: must be positive")
        if not a.lora_name:
            raise invalid("adapter.lora_name: must be non-empty")
        if not os.path.isabs(a.source_path):
            raise invalid("adapter.source_path: must be an absolute path")
        # one directory has one identity however it is spelled (trailing slash, symlink, ..)
        source = os.path.realpath(a.source_path)
        root = self.options.lora_root and os.path.realpath(self.options.lora_root)
        # outside the root, missing, or not a directory: one answer, so it tells nothing about the disk
        if (root and os.path.commonpath((root, source)) != root) or not os.path.isdir(source):
            raise invalid(f"adapter.source_path: {a.source_path!r} is not an adapter directory "
                          + ("under this server's LoRA root (--lora-root)" if root else "visible to the engine"))
        info = LoraAdapterInfo(a.lora_id, a.lora_name, source)
        async with self._lora_lock:
            for other in self._loras.values():
                if other == info:
                    return lora_pb2.LoadLoraResponse(adapter=_lora_message(other), already_loaded=True)
                clash = [name for name, mine, theirs in (
                    ("lora_id", info.lora_id, other.lora_id),
                    ("lora_name", info.lora_name, other.lora_name),
                    ("source_path", info.source_path, other.source_path)) if mine == theirs]
                if clash:
                    raise rejected(
                        ErrorCode.DUPLICATE_REQUEST,  # ALREADY_EXISTS, with the trailer code that maps to it
                        f"adapter: {', '.join(clash)} already used by loaded adapter "
                        f"{other.lora_name!r} (id {other.lora_id}, path {other.source_path!r})")
            await self.backend.load_lora(info)
            self._loras[info.lora_name] = info
        return lora_pb2.LoadLoraResponse(adapter=_lora_message(info), already_loaded=False)

    async def UnloadLora(self, request: lora_pb2.UnloadLoraRequest, context):
        self._require_lora()
        if not request.lora_name:
            raise invalid("lora_name: must be non-empty")
        async with self._lora_lock:
            info = self._loras.get(request.lora_name)
            if info is None:
                raise not_found(f"lora_name: no loaded adapter {request.lora_name!r}",
                                ErrorCode.MODEL_NOT_FOUND)
            await self.backend.unload_lora(info)
            del self._loras[info.lora_name]
        return lora_pb2.UnloadLoraResponse(adapter=_lora_message(info))

    async def ListLoras(self, request, context):
        self._require_lora()
        return lora_pb2.ListLorasResponse(adapters=[
            _lora_message(a) for a in sorted(self._loras.values(), key=lambda a: a.lora_id)])

