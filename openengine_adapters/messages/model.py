"""The model card as ``ModelInfo``: the discovery rules a card must keep, and the card as the
engine's role lets requests use it."""

from __future__ import annotations

import dataclasses
from enum import IntEnum

from openengine_adapters import backend as be
from openengine_adapters.messages import presence
from openengine_adapters.types import EngineRole
from openengine_adapters.v1 import model_pb2


def card_problems(obj, path: str = "") -> list[str]:
    """Where a model card breaks the discovery rules: UNSPECIFIED (0) in a capability list, or
    a reported limit/dimension that is not > 0."""
    problems = []
    for f in dataclasses.fields(obj):
        if not f.metadata.get("wire", True):
            continue
        value = getattr(obj, f.name)
        where = f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            problems += card_problems(value, where + ".")
        elif isinstance(value, tuple) and value and isinstance(value[0], IntEnum):
            if any(int(v) == 0 for v in value):
                problems.append(f"{where} contains UNSPECIFIED")
        elif isinstance(value, int) and not isinstance(value, bool) and value <= 0 and (
                f.name.startswith(("max_", "total_")) or f.name in ("dimension", "kv_block_size")):
            problems.append(f"{where} must be > 0, got {value}")
    return problems


def model_info(card: be.ModelCard, role: EngineRole = EngineRole.AGGREGATED,
               lenient: bool = False) -> model_pb2.ModelInfo:
    msg = presence.fill(model_pb2.ModelInfo(), card_for_role(card, role, lenient), frozenset({"served_model_name"}))
    msg.served_model_name = card.names[0]
    return msg


def card_for_role(card: be.ModelCard, role: EngineRole, lenient: bool = False) -> be.ModelCard:
    """The card as this engine's role lets requests use it: a PREFILL engine refuses output
    logprobs, guided decoding, several sequences and more than one token (the role rule in
    ``validation.generate``), so it reports them as unsupported or limited, not the model's
    support. ``lenient`` (v0.1.0): a PREFILL engine takes the decode leg's output logprobs and
    guided decoding (``validation.leniency``), so those report the model's support."""
    if role != EngineRole.PREFILL:
        return card
    gen = card.generation
    if gen is not None and lenient:
        gen = dataclasses.replace(gen, max_num_sequences=1)
    elif gen is not None:
        gen = dataclasses.replace(gen, output_logprobs=be.LogprobSupport(supported=False),
                                  guided_decoding=be.GuidedSupport(supported=False), max_num_sequences=1)
    return dataclasses.replace(card, generation=gen, max_output_tokens=1)
