"""One generic copier from seam dataclasses to messages, honouring proto3 presence.

The seam's dataclasses use the proto field names, so one copier serves every message:
``None`` stays absent, an explicit ``0``/``False`` is set (and so present), lists and maps are
copied, nested dataclasses recurse into their sub-message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import IntEnum


def fill(msg, obj, skip: frozenset[str] = frozenset()):
    """Copy a seam dataclass into the same-named fields of ``msg``; return ``msg``."""
    for f in dataclasses.fields(obj):
        if f.name in skip or not f.metadata.get("wire", True):
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            fill(getattr(msg, f.name), value)
        elif isinstance(value, Mapping):
            getattr(msg, f.name).update(value)
        elif isinstance(value, tuple | list):
            target = getattr(msg, f.name)
            if value and dataclasses.is_dataclass(value[0]):
                for item in value:
                    fill(target.add(), item)
            else:
                target.extend(int(v) if isinstance(v, IntEnum) else v for v in value)
        else:
            setattr(msg, f.name, int(value) if isinstance(value, IntEnum) else value)
    return msg
