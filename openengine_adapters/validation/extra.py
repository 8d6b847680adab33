"""``GenerateRequest.extra`` (v0.1.0): engine-specific keys, checked against what the adapter declares.

The spec: an engine MAY ignore keys it does not recognize and a request stays valid with ``extra``
empty. A key the adapter does apply is refused with INVALID_ARGUMENT when its JSON type is wrong,
never guessed at. Struct numbers are doubles: an ``int`` key takes only integral values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from openengine_adapters.backend import ExtraKey
from openengine_adapters.errors import invalid

_INT_LIMIT = 2**53  # Struct numbers are IEEE-754 doubles: exact to here


def request_struct(struct, field: str) -> dict:
    """A request's ``google.protobuf.Struct`` as plain JSON values. NaN and infinities decode (they
    are doubles on the wire) but JSON cannot hold them, so protobuf's conversion raises: refused
    here naming the field, not answered as an internal error."""
    try:
        return json_format.MessageToDict(struct)
    except ValueError as exc:
        raise invalid(f"{field}: numbers must be finite (NaN and infinities have no JSON form)") from exc


def _is_int(value: Any) -> bool:
    return (isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)
            and float(value).is_integer() and abs(value) <= _INT_LIMIT)


_CHECKS = {
    "bool": (lambda v: isinstance(v, bool), "a boolean", lambda v: v),
    "int": (_is_int, "an integral number", int),
    "number": (lambda v: isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v),
               "a finite number", float),
    "string": (lambda v: isinstance(v, str), "a string", lambda v: v),
    "int_list": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integral numbers",
                 lambda v: [int(x) for x in v]),
    "string_list": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings",
                    list),
}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def parse_extra(extra: Mapping[str, Any], known: Mapping[str, ExtraKey]) -> dict[str, Any]:
    """The known keys of ``extra`` with Python values of their declared kind; unknown keys dropped."""
    out = {}
    for name, value in extra.items():
        key = known.get(name)
        if key is None:
            continue
        ok, want, convert = _CHECKS[key.kind]
        if not ok(value):
            raise invalid(f"extra.{name}: must be {want} ({key.doc}), got a {_json_type(value)}")
        out[name] = convert(value)
    return out


def describe(known: Mapping[str, ExtraKey]) -> dict[str, Any]:
    """The declared keys as ModelInfo.extra advertises them: ``{name: {"type": kind, "doc": doc}}``."""
    return {name: {"type": key.kind, "doc": key.doc} for name, key in sorted(known.items())}
