"""Capability-card fragments every engine builds alike, and the feature set a card implies."""

from __future__ import annotations

from openengine_adapters import backend as be
from openengine_adapters.types import (
    Feature,
    Granularity,
    GuidedMode,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)

TEXT_INPUTS = (TaskInputType.TEXT, TaskInputType.TOKEN_IDS)
# every guided mode (choice lowered to a regex, json_object to the {"type": "object"} schema)
ALL_GUIDED = tuple(GuidedMode)[1:]
# the task capabilities of a card and the feature each one needs
TASK_FEATURES = (("embed", Feature.EMBED), ("classify", Feature.CLASSIFY), ("score", Feature.SCORE))


def label_score_support(*, priority: bool = False, lora: bool = False,
                        max_label_token_ids: int | None = None) -> be.ScoreSupport:
    """Score on a causal LM: the log-probabilities of the label tokens as the next token after
    query + candidate (softmaxed across the labels on request by ``scores.label_score_result``)."""
    return be.ScoreSupport(
        supported=True, input_types=TEXT_INPUTS, granularities=(Granularity.SEQUENCE,),
        semantics=(ValueSemantics.LOG_PROBABILITIES, ValueSemantics.PROBABILITIES),
        normalizations=(ScoreNormalization.NONE, ScoreNormalization.SOFTMAX),
        supports_label_token_scoring=True, supports_instruction=False, supports_priority=priority,
        supports_lora=lora, max_label_token_ids=max_label_token_ids, native_scoring=False)


def guided_support(modes: tuple[GuidedMode, ...] | None, backend: str | None = None) -> be.GuidedSupport:
    """The guided modes an engine's grammar backend (``backend``, named per engine) builds;
    ``None``: no grammar backend."""
    return be.GuidedSupport(True, modes, backend) if modes else be.GuidedSupport(False)


def features(card: be.ModelCard, *, generate: bool, runtime_events: bool, kv_events: bool = False,
             kv_event_sources: bool = False) -> frozenset[Feature]:
    """The backend features a card implies: Abort and GetLoad always, Generate when the engine
    generates, each task the card offers, LoRA when it supports adapters, and the event streams
    the adapter runs."""
    out = {Feature.ABORT, Feature.LOAD}
    if generate:
        out.add(Feature.GENERATE)
    if runtime_events:
        out.add(Feature.RUNTIME_EVENTS)
    if card.supports_lora:
        out.add(Feature.LORA)
    for name, feature in TASK_FEATURES:
        if card.tasks is not None and getattr(card.tasks, name) is not None:
            out.add(feature)
    if kv_events:
        out.add(Feature.KV_EVENTS)
    if kv_event_sources:
        out.add(Feature.KV_EVENT_SOURCES)
    return frozenset(out)
