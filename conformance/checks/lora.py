"""LoRA lifecycle RPCs: argument validation, or FAILED_PRECONDITION when LoRA is not supported."""

from __future__ import annotations

import grpc

from conformance.registry import Skip, check, expect
from openengine_adapters.v1 import lora_pb2

C = grpc.StatusCode


def _load(ctx, **adapter):
    return ctx.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(**adapter)), timeout=30)


@check("lora.load_rejects_invalid", "advertised supports_lora")
async def load_invalid(ctx):
    """LoadLora with lora_id 0, an empty name, or a relative path is INVALID_ARGUMENT."""
    if not ctx.mi().supports_lora:
        raise Skip("supports_lora not advertised")
    await ctx.rejected(_load(ctx, lora_id=0, lora_name="conf-a", source_path="/nonexistent/conf-a"),
                       C.INVALID_ARGUMENT, what="LoadLora lora_id 0")
    await ctx.rejected(_load(ctx, lora_id=-5, lora_name="conf-a", source_path="/nonexistent/conf-a"),
                       C.INVALID_ARGUMENT, what="LoadLora negative lora_id")
    await ctx.rejected(_load(ctx, lora_id=91, lora_name="", source_path="/nonexistent/conf-a"),
                       C.INVALID_ARGUMENT, what="LoadLora empty lora_name")
    await ctx.rejected(_load(ctx, lora_id=91, lora_name="conf-a", source_path="relative/adapter"),
                       C.INVALID_ARGUMENT, what="LoadLora relative source_path")


@check("lora.unload_unknown_not_found", "advertised supports_lora")
async def unload_unknown(ctx):
    """UnloadLora of an adapter that is not loaded is NOT_FOUND; ListLoras answers."""
    if not ctx.mi().supports_lora:
        raise Skip("supports_lora not advertised")
    listed = await ctx.stub.ListLoras(lora_pb2.ListLorasRequest(), timeout=30)
    names = [a.lora_name for a in listed.adapters]
    expect(len(set(names)) == len(names), f"ListLoras has duplicate names {names}")
    await ctx.rejected(ctx.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="conformance-no-such-adapter"),
                                           timeout=30), C.NOT_FOUND, what="UnloadLora unknown adapter")


@check("lora.disabled_failed_precondition", "supports_lora false")
async def disabled(ctx):
    """Without supports_lora, LoadLora, UnloadLora and ListLoras are FAILED_PRECONDITION."""
    if ctx.mi().supports_lora:
        raise Skip("supports_lora is advertised")
    await ctx.rejected(_load(ctx, lora_id=1, lora_name="conf-a", source_path="/nonexistent/conf-a"),
                       C.FAILED_PRECONDITION, what="LoadLora on a LoRA-disabled engine")
    await ctx.rejected(ctx.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="conf-a"), timeout=30),
                       C.FAILED_PRECONDITION, what="UnloadLora on a LoRA-disabled engine")
    await ctx.rejected(ctx.stub.ListLoras(lora_pb2.ListLorasRequest(), timeout=30),
                       C.FAILED_PRECONDITION, what="ListLoras on a LoRA-disabled engine")
