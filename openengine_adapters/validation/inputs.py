"""Checks shared by generation and the tasks: token ids, media items, numbers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from openengine_adapters.errors import invalid, unsupported
from openengine_adapters.types import Modality
from openengine_adapters.v1 import input_pb2

_MODALITY_VALUES = frozenset(int(m) for m in Modality)


def check_token_ids(ids: Sequence[int], field: str) -> None:
    if not ids:
        raise invalid(f"{field}: must contain at least one token id")


def check_unique(values: Iterable, field: str) -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise invalid(f"{field}: duplicate value {value!r}")
        seen.add(value)


def check_finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise invalid(f"{field}: must be a finite number, got {value}")


def media_modality(item: input_pb2.MediaItem) -> Modality:
    """The item's modality; 0 is an image for forward compatibility (spec)."""
    if item.modality not in _MODALITY_VALUES:
        raise invalid(f"modality: unknown value {item.modality}")
    return Modality.IMAGE if item.modality == 0 else Modality(item.modality)


def check_media(
    items: Sequence[input_pb2.MediaItem], field: str, allowed: Iterable[Modality] | None
) -> None:
    """Every item has exactly one well-formed source and an allowed modality.

    ``allowed`` None means the model accepts no media at all.
    """
    if not items:
        return
    if allowed is None:
        raise unsupported(f"{field}: this model does not accept media (supports_multimodal is not true)")
    allowed = frozenset(allowed)
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        try:
            modality = media_modality(item)
        except Exception as exc:
            raise invalid(f"{where}.{exc}") from None
        if allowed and modality not in allowed:
            raise unsupported(f"{where}.modality: {modality.name} is not an advertised modality")
        source = item.WhichOneof("source")
        if source is None:
            raise invalid(f"{where}: exactly one source (url, data_uri, raw_bytes) must be set")
        if source == "url":
            if not item.url.startswith(("http://", "https://")):
                raise invalid(f"{where}.url: must be an http(s):// URL")
        elif source == "data_uri":
            head, sep, payload = item.data_uri.partition(",")
            if not head.startswith("data:") or not sep or ";base64" not in head or not payload:
                raise invalid(f"{where}.data_uri: must be data:<mime>;base64,<payload>")
        elif not item.raw_bytes:
            raise invalid(f"{where}.raw_bytes: must be non-empty")
