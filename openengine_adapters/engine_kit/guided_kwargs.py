"""A guided-decoding constraint as engine keyword arguments.

vLLM's ``StructuredOutputsParams`` and TensorRT-LLM's ``GuidedDecodingParams`` take the same names
(json, regex, grammar, structural_tag, choice, json_object); TensorRT-LLM has no ``choice``, so
there it is lowered to a regex alternation of escaped literals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openengine_adapters.backend import Guided
from openengine_adapters.types import GuidedMode

_REGEX_SPECIAL = frozenset("\\^$.|?*+()[]{}/-")
_FIELD = {GuidedMode.JSON_SCHEMA: "json", GuidedMode.REGEX: "regex", GuidedMode.EBNF_GRAMMAR: "grammar",
          GuidedMode.STRUCTURAL_TAG: "structural_tag"}


def choice_regex(choices: Sequence[str]) -> str:
    """An alternation matching exactly one of the choices."""
    return "(" + "|".join("".join("\\" + c if c in _REGEX_SPECIAL else c for c in ch) for ch in choices) + ")"


def guide_kwargs(g: Guided, *, choice_as_regex: bool = False) -> dict[str, Any]:
    if g.mode == GuidedMode.CHOICE:
        return {"regex": choice_regex(g.value)} if choice_as_regex else {"choice": list(g.value)}
    if g.mode == GuidedMode.JSON_OBJECT:
        return {"json_object": True}
    return {_FIELD[g.mode]: g.value}
