"""GetModelInfo: selection, errors and capability invariants."""

from __future__ import annotations

import grpc

from conformance.registry import Skip, check, expect
from openengine_adapters.v1 import model_pb2

C = grpc.StatusCode


@check("model_info.empty_model_invalid_argument", "always")
async def empty_model(ctx):
    """GetModelInfo(model="") is INVALID_ARGUMENT (the field is required)."""
    await ctx.rejected(ctx.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=""), timeout=10),
                       C.INVALID_ARGUMENT, what='GetModelInfo("")')


@check("model_info.unknown_model_not_found", "always")
async def unknown_model(ctx):
    """GetModelInfo of a model not served is NOT_FOUND."""
    await ctx.rejected(ctx.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="conformance/no-such-model"),
                                             timeout=10), C.NOT_FOUND, what="GetModelInfo(unknown)")


@check("model_info.supported_models_resolve", "always")
async def supported_models_resolve(ctx):
    """Every EngineInfo.supported_models entry (and every advertised alias) resolves with GetModelInfo."""
    for name in ctx.engine_info.supported_models:
        mi = await ctx.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=name), timeout=10)
        expect(mi.model_id or mi.served_model_name, f"GetModelInfo({name!r}) has neither model_id nor served name")
        for alias in mi.served_model_aliases:
            other = await ctx.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=alias), timeout=10)
            expect(other.model_id == mi.model_id, f"alias {alias!r} resolves to another model ({other.model_id!r})")


def _lists(mi: model_pb2.ModelInfo):
    g = mi.generation
    yield "generation.prompt_logprobs.candidate_selection_modes", g.prompt_logprobs.candidate_selection_modes
    yield "generation.output_logprobs.candidate_selection_modes", g.output_logprobs.candidate_selection_modes
    yield "generation.guided_decoding.modes", g.guided_decoding.modes
    t = mi.tasks
    for task in ("embed", "classify", "score"):
        cap = getattr(t, task)
        for f in ("input_types", "granularities", "modalities"):
            yield f"tasks.{task}.{f}", getattr(cap, f)
    yield "tasks.embed.encodings", t.embed.encodings
    yield "tasks.classify.semantics", t.classify.semantics
    yield "tasks.score.semantics", t.score.semantics
    yield "tasks.score.normalizations", t.score.normalizations


@check("model_info.no_unspecified_in_lists", "always")
async def no_unspecified(ctx):
    """Capability lists never contain an UNSPECIFIED (zero) value, nor duplicates."""
    for name, values in _lists(ctx.mi()):
        expect(0 not in list(values), f"{name} contains UNSPECIFIED")
        expect(len(set(values)) == len(values), f"{name} has duplicates")


def _limits(mi: model_pb2.ModelInfo):
    for f in ("max_context_length", "max_output_tokens", "kv_block_size", "total_kv_blocks",
              "max_running_requests", "max_batched_tokens"):
        yield f, mi, f
    g = mi.generation
    yield "generation.max_num_sequences", g, "max_num_sequences"
    yield "generation.prompt_logprobs.max_top_n", g.prompt_logprobs, "max_top_n"
    yield "generation.output_logprobs.max_top_n", g.output_logprobs, "max_top_n"
    t = mi.tasks
    for f in ("dimension", "max_batch_size", "max_output_values_per_item"):
        yield f"tasks.embed.{f}", t.embed, f
    for f in ("max_batch_size", "max_output_values_per_item"):
        yield f"tasks.classify.{f}", t.classify, f
    for f in ("max_groups", "max_candidates_per_group", "max_output_values_per_candidate", "max_label_token_ids"):
        yield f"tasks.score.{f}", t.score, f


@check("model_info.limits_positive", "always")
async def limits_positive(ctx):
    """Every reported limit/dimension is > 0 (absent means unreported); max_output_tokens <= context."""
    mi = ctx.mi()
    for name, msg, f in _limits(mi):
        if msg.HasField(f):
            expect(getattr(msg, f) > 0, f"{name} is reported as 0")
    if mi.HasField("max_output_tokens") and mi.HasField("max_context_length"):
        expect(mi.max_output_tokens <= mi.max_context_length,
               f"max_output_tokens {mi.max_output_tokens} > max_context_length {mi.max_context_length}")


@check("model_info.capability_consistency", "always")
async def capability_consistency(ctx):
    """Lists are only non-empty where the capability says supported=true; modalities only with MULTIMODAL."""
    mi = ctx.mi()
    g = mi.generation
    for name, cap, lst in (("prompt_logprobs", g.prompt_logprobs, g.prompt_logprobs.candidate_selection_modes),
                           ("output_logprobs", g.output_logprobs, g.output_logprobs.candidate_selection_modes),
                           ("guided_decoding", g.guided_decoding, g.guided_decoding.modes)):
        if list(lst):
            expect(cap.supported, f"generation.{name} lists modes but supported is not true")
    for task in ("embed", "classify", "score"):
        cap = getattr(mi.tasks, task)
        if list(cap.modalities):
            expect(3 in list(cap.input_types),  # TASK_INPUT_TYPE_MULTIMODAL
                   f"tasks.{task}.modalities is set without TASK_INPUT_TYPE_MULTIMODAL input")
    if not mi.HasField("generation") and not mi.HasField("tasks"):
        raise Skip("the model advertises no generation or task capabilities")
