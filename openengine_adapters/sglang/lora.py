"""LoRA on SGLang: its tokenizer manager loads and unloads adapters at runtime; the adapter keeps
the registered adapters for ListLoras and for refusing a request naming an unloaded one.

A mixin of ``SglangBackend``.
"""

from __future__ import annotations

from openengine_adapters import backend as be
from openengine_adapters.errors import invalid, precondition


class SglangLora:
    """The LoRA RPCs of ``SglangBackend``."""

    async def load_lora(self, adapter: be.LoraAdapterInfo) -> None:
        from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput

        try:
            result = await self.tm.load_lora_adapter(
                LoadLoRAAdapterReqInput(lora_name=adapter.lora_name, lora_path=adapter.source_path), None)
        except (ValueError, TypeError, OSError) as exc:
            raise invalid(f"adapter.source_path: SGLang could not load the adapter: {exc}") from None
        if result is not None and getattr(result, "success", True) is False:
            raise invalid(f"adapter: SGLang refused to load the adapter: {getattr(result, 'error_message', '')}")
        self._loras[adapter.lora_name] = adapter

    async def unload_lora(self, adapter: be.LoraAdapterInfo) -> None:
        from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

        result = await self.tm.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=adapter.lora_name), None)
        if result is not None and getattr(result, "success", True) is False:
            raise precondition(f"lora_name: SGLang refused to unload: {getattr(result, 'error_message', '')}")
        self._loras.pop(adapter.lora_name, None)

    async def list_loras(self) -> list[be.LoraAdapterInfo]:
        return list(self._loras.values())
