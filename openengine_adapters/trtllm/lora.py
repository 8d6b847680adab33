"""LoRA on TensorRT-LLM, which has no runtime LoRA API: a lazy registry. LoadLora validates and
registers a ``LoRARequest``; TensorRT-LLM reads the weights on the first request using it.

A mixin of ``TrtllmBackend``.
"""

from __future__ import annotations

import json
import os

from openengine_adapters import backend as be
from openengine_adapters.errors import invalid, precondition

LORA_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class LazyLoraRegistry:
    """The LoRA RPCs of ``TrtllmBackend``."""

    async def load_lora(self, adapter: be.LoraAdapterInfo) -> None:
        """Validate and register; TensorRT-LLM reads the weights on the first request using it.

        TensorRT-LLM caches adapter weights by ``lora_int_id`` until evicted, so an id once
        used for one directory is refused for another (it could serve the stale weights).
        """
        path = adapter.source_path
        config = os.path.join(path, "adapter_config.json")
        if not os.path.isfile(config):
            raise invalid(f"adapter.source_path: {path!r} has no adapter_config.json (not a PEFT LoRA adapter)")
        try:
            with open(config, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise invalid(f"adapter.source_path: unreadable adapter_config.json: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid("adapter.source_path: adapter_config.json is not a JSON object")
        if not any(os.path.isfile(os.path.join(path, w)) for w in LORA_WEIGHT_FILES):
            raise invalid(f"adapter.source_path: {path!r} has no weights ({' or '.join(LORA_WEIGHT_FILES)})")
        previous = self._lora_ids_used.get(adapter.lora_id)
        if previous is not None and previous != path:
            raise invalid(f"adapter.lora_id: {adapter.lora_id} was used for {previous!r}; TensorRT-LLM may "
                          "still cache those weights under this id, choose a new id")
        from tensorrt_llm.executor.request import LoRARequest

        self._loras[adapter.lora_name] = LoRARequest(adapter.lora_name, adapter.lora_id, path)
        self._lora_info[adapter.lora_name] = adapter
        self._lora_ids_used[adapter.lora_id] = path

    async def unload_lora(self, adapter: be.LoraAdapterInfo) -> None:
        """Refused (FAILED_PRECONDITION, retryable) while a request uses the adapter; otherwise
        the name is unregistered (TensorRT-LLM evicts cached weights itself)."""
        busy = self._lora_in_use.get(adapter.lora_name, 0)
        if busy:
            raise precondition(f"lora_name: adapter {adapter.lora_name!r} is in use by {busy} running "
                               "request(s); unload it after they finish", retry_after_ms=100)
        self._loras.pop(adapter.lora_name, None)
        self._lora_info.pop(adapter.lora_name, None)

    async def list_loras(self) -> list[be.LoraAdapterInfo]:
        return list(self._lora_info.values())
