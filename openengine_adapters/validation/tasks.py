"""Embed / Classify / Score requests -> seam params, enforcing the spec before acceptance.

Status rules (spec): unsupported task FAILED_PRECONDITION, unknown model NOT_FOUND, malformed
input or an unsupported explicit option INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import grpc

from openengine_adapters.backend import (
    ClassifyParams,
    EmbedParams,
    ModelCard,
    ScoreGroupInput,
    ScoreParams,
    TaskContext,
    TaskItem,
)
from openengine_adapters.errors import (
    ErrorCode,
    RequestRejected,
    invalid,
    not_found,
    unsupported,
)
from openengine_adapters.types import (
    EmbeddingEncoding,
    Granularity,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)
from openengine_adapters.v1 import classification_pb2, embedding_pb2, scoring_pb2, tasks_pb2
from openengine_adapters.validation.catalog import ModelCatalog
from openengine_adapters.validation.generate import parse_media_item
from openengine_adapters.validation.ids import check_request_id
from openengine_adapters.validation.inputs import check_media, check_token_ids, check_unique

_INPUT_TYPES = {
    "text": TaskInputType.TEXT,
    "token_ids": TaskInputType.TOKEN_IDS,
    "multimodal": TaskInputType.MULTIMODAL,
}


def _capability(card: ModelCard, task: str):
    cap = getattr(card.tasks, task, None) if card.tasks is not None else None
    if cap is None or not cap.supported:
        raise RequestRejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"model {card.names[0]!r} does not support the {task} task",
            ErrorCode.UNSUPPORTED_FEATURE,
        )
    return cap


def _context(ctx: tasks_pb2.TaskRequestContext, catalog: ModelCatalog, task: str,
             loaded_loras: Collection[str]):
    if not ctx.request_id:
        raise invalid("context.request_id: required and must be non-empty")
    check_request_id(ctx.request_id, "context.request_id")
    card = catalog.resolve(ctx.model, field="context.model", required=True)
    cap = _capability(card, task)
    priority = None
    if ctx.HasField("priority"):
        if not cap.supports_priority:
            raise unsupported(f"context.priority: priority is not advertised for {task}")
        priority = ctx.priority
    if ctx.lora_name:
        if not cap.supports_lora:
            raise unsupported(f"context.lora_name: LoRA is not advertised for {task}")
        if ctx.lora_name not in loaded_loras:
            raise not_found(f"context.lora_name: adapter {ctx.lora_name!r} is not loaded",
                            ErrorCode.MODEL_NOT_FOUND)
    context = TaskContext(ctx.request_id, card.names[0], ctx.lora_name, priority, dict(ctx.metadata))
    return card, cap, context


def _item(inp: tasks_pb2.TaskInput, field: str, cap) -> TaskItem:
    if not inp.item_id:
        raise invalid(f"{field}.item_id: required and must be non-empty")
    which = inp.WhichOneof("input")
    if which is None:
        raise invalid(f"{field}: exactly one input (text, token_ids, multimodal) must be set")
    kind = _INPUT_TYPES[which]
    if kind not in cap.input_types:
        raise unsupported(f"{field}.{which}: input type {kind.name} is not advertised")
    if which == "text":
        if not inp.text:
            raise invalid(f"{field}.text: must be non-empty")
        return TaskItem(inp.item_id, text=inp.text)
    if which == "token_ids":
        ids = tuple(inp.token_ids.ids)
        check_token_ids(ids, f"{field}.token_ids.ids")
        return TaskItem(inp.item_id, token_ids=ids)
    mm = inp.multimodal
    if not mm.media:
        raise invalid(f"{field}.multimodal.media: must contain at least one media item")
    check_media(mm.media, f"{field}.multimodal.media", cap.modalities)
    media = tuple(parse_media_item(m) for m in mm.media)
    prompt = mm.WhichOneof("prompt")
    if prompt == "token_ids":
        ids = tuple(mm.token_ids.ids)
        check_token_ids(ids, f"{field}.multimodal.token_ids.ids")
        return TaskItem(inp.item_id, token_ids=ids, media=media)
    return TaskItem(inp.item_id, text=mm.text if prompt == "text" else None, media=media)


def _items(inputs: Sequence[tasks_pb2.TaskInput], cap) -> tuple[TaskItem, ...]:
    if not inputs:
        raise invalid("inputs: the batch must be non-empty")
    if cap.max_batch_size is not None and len(inputs) > cap.max_batch_size:
        raise invalid(f"inputs: {len(inputs)} items exceed max_batch_size {cap.max_batch_size}")
    items = tuple(_item(inp, f"inputs[{i}]", cap) for i, inp in enumerate(inputs))
    check_unique((it.item_id for it in items), "inputs.item_id")
    return items


def _choice(opts, name: str, allowed: Sequence, enum, field: str):
    if not opts.HasField(name):
        return None
    value = getattr(opts, name)
    if value not in allowed:
        label = enum(value).name if value in enum._value2member_map_ else str(value)
        raise unsupported(f"{field}: {label} is not advertised")
    return enum(value)


def parse_embed(req: embedding_pb2.EmbedRequest, catalog: ModelCatalog,
                loaded_loras: Collection[str]) -> tuple[ModelCard, EmbedParams]:
    card, cap, context = _context(req.context, catalog, "embed", loaded_loras)
    items = _items(req.inputs, cap)
    o = req.options
    granularity = _choice(o, "granularity", cap.granularities, Granularity, "options.granularity")
    encoding = _choice(o, "encoding", cap.encodings, EmbeddingEncoding, "options.encoding")
    normalize = dims = None
    if o.HasField("normalize"):
        if not cap.supports_normalization:
            raise unsupported("options.normalize: normalization control is not advertised")
        normalize = o.normalize
    if o.HasField("dimensions"):
        if o.dimensions == 0:
            raise invalid("options.dimensions: must be > 0")
        if not cap.supports_dimension_override:
            raise unsupported("options.dimensions: dimension override is not advertised")
        if cap.dimension is not None and o.dimensions > cap.dimension:
            raise invalid(
                f"options.dimensions: {o.dimensions} exceeds the native dimension {cap.dimension} "
                "(reduction only, never padding)"
            )
        dims = o.dimensions
    return card, EmbedParams(context, items, granularity, normalize, dims, encoding)


def parse_classify(req: classification_pb2.ClassifyRequest, catalog: ModelCatalog,
                   loaded_loras: Collection[str]) -> tuple[ModelCard, ClassifyParams]:
    card, cap, context = _context(req.context, catalog, "classify", loaded_loras)
    items = _items(req.inputs, cap)
    o = req.options
    granularity = _choice(o, "granularity", cap.granularities, Granularity, "options.granularity")
    semantics = _choice(o, "output_semantics", cap.semantics, ValueSemantics,
                        "options.output_semantics")
    return card, ClassifyParams(context, items, granularity, semantics)


def parse_score(req: scoring_pb2.ScoreRequest, catalog: ModelCatalog,
                loaded_loras: Collection[str]) -> tuple[ModelCard, ScoreParams]:
    card, cap, context = _context(req.context, catalog, "score", loaded_loras)
    if not req.groups:
        raise invalid("groups: a score request needs at least one group")
    if cap.max_groups is not None and len(req.groups) > cap.max_groups:
        raise invalid(f"groups: {len(req.groups)} groups exceed max_groups {cap.max_groups}")
    groups = []
    for g, group in enumerate(req.groups):
        where = f"groups[{g}]"
        if not group.group_id:
            raise invalid(f"{where}.group_id: required and must be non-empty")
        if not group.HasField("query"):
            raise invalid(f"{where}.query: every group has exactly one query")
        if not group.candidates:
            raise invalid(f"{where}.candidates: every group has at least one candidate")
        limit = cap.max_candidates_per_group
        if limit is not None and len(group.candidates) > limit:
            raise invalid(f"{where}.candidates: {len(group.candidates)} exceed "
                          f"max_candidates_per_group {limit}")
        query = _item(group.query, f"{where}.query", cap)
        cands = tuple(_item(c, f"{where}.candidates[{i}]", cap) for i, c in enumerate(group.candidates))
        check_unique((it.item_id for it in (query, *cands)), f"{where}: item_id")
        groups.append(ScoreGroupInput(group.group_id, query, cands))
    check_unique((g.group_id for g in groups), "groups.group_id")
    o = req.options
    granularity = _choice(o, "granularity", cap.granularities, Granularity, "options.granularity")
    semantics = _choice(o, "output_semantics", cap.semantics, ValueSemantics,
                        "options.output_semantics")
    normalization = ScoreNormalization.UNSPECIFIED
    if o.normalization != ScoreNormalization.UNSPECIFIED:
        if o.normalization not in cap.normalizations:
            label = (ScoreNormalization(o.normalization).name
                     if o.normalization in ScoreNormalization._value2member_map_ else o.normalization)
            raise unsupported(f"options.normalization: {label} is not advertised")
        normalization = ScoreNormalization(o.normalization)
    labels = tuple(o.label_token_ids)
    if not labels and not cap.native_scoring:
        raise unsupported("options.label_token_ids: this model only scores label tokens; native scoring is "
                          "not available, so label_token_ids must be non-empty")
    if labels:
        if not cap.supports_label_token_scoring:
            raise unsupported("options.label_token_ids: label-token scoring is not advertised")
        check_unique(labels, "options.label_token_ids")
        if cap.max_label_token_ids is not None and len(labels) > cap.max_label_token_ids:
            raise invalid(f"options.label_token_ids: {len(labels)} ids exceed "
                          f"max_label_token_ids {cap.max_label_token_ids}")
    if o.instruction and not cap.supports_instruction:
        raise unsupported("options.instruction: instructions are not advertised for score")
    return card, ScoreParams(context, tuple(groups), granularity, semantics, normalization, labels,
                             o.instruction)
