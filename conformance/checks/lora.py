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
    ctx.reported(ctx.mi(), "supports_lora", "LoadLora")
    await ctx.rejected(ctx.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="conf-a"), timeout=30),
                       C.FAILED_PRECONDITION, what="UnloadLora on a LoRA-disabled engine")
    await ctx.rejected(ctx.stub.ListLoras(lora_pb2.ListLorasRequest(), timeout=30),
                       C.FAILED_PRECONDITION, what="ListLoras on a LoRA-disabled engine")


@check("lora.lifecycle", "advertised supports_lora; --lora-dir DIR")
async def lifecycle(ctx):
    """The LoRA rules with a loadable adapter (``--lora-dir``, an absolute directory the target can load):
    "Loading the same ID, name, and path twice is idempotent" (already_loaded), "A conflicting ID, name, or
    path returns ALREADY_EXISTS", ListLoras lists it, Generate takes its lora_name, UnloadLora returns it,
    and then "An unknown adapter returns NOT_FOUND"."""
    if not ctx.mi().supports_lora:
        raise Skip("supports_lora not advertised (the refusal is lora.disabled_failed_precondition)")
    path = ctx.options.lora_dir
    if not path:
        raise Skip("no --lora-dir given (an absolute directory the target loads as a LoRA adapter)")
    listed = await ctx.stub.ListLoras(lora_pb2.ListLorasRequest(), timeout=30)
    used = {a.lora_id for a in listed.adapters}
    lid = next(i for i in range(7001, 8000) if i not in used)
    name = f"conformance-lora-{ctx.rid('l')}"
    first = await _load(ctx, lora_id=lid, lora_name=name, source_path=path)
    try:
        expect(not first.already_loaded, "a first LoadLora reports already_loaded")
        expect(first.adapter.lora_name == name and first.adapter.lora_id == lid,
               f"LoadLora answered {first.adapter}, loaded {lid}/{name}")
        again = await _load(ctx, lora_id=lid, lora_name=name, source_path=path)
        expect(again.already_loaded, "loading the same id, name and path twice is not reported as already_loaded")
        other = next(i for i in range(lid + 1, 9000) if i not in used)
        for what, adapter in (("the same name with another id", dict(lora_id=other, lora_name=name, source_path=path)),
                              ("the same id with another name", dict(lora_id=lid, lora_name=name + "-b",
                                                                     source_path=path)),
                              ("the same path with another id and name", dict(lora_id=other, lora_name=name + "-c",
                                                                              source_path=path))):
            await ctx.rejected(_load(ctx, **adapter), C.ALREADY_EXISTS, what=f"LoadLora with {what}")
        names = [a.lora_name for a in (await ctx.stub.ListLoras(lora_pb2.ListLorasRequest(), timeout=30)).adapters]
        expect(names.count(name) == 1, f"ListLoras lists {names}, expected {name!r} once")
        expect(not {name + "-b", name + "-c"} & set(names), f"a refused conflicting adapter is listed: {names}")
        if ctx.generates() and ctx.role == 1:
            await ctx.run(ctx.request("withlora", max_tokens=2, lora_name=name))
    finally:
        gone = await ctx.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name=name), timeout=30)
    expect(gone.adapter.lora_name == name, f"UnloadLora answered {gone.adapter}")
    await ctx.rejected(ctx.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name=name), timeout=30), C.NOT_FOUND,
                       what="UnloadLora of an unloaded adapter")
    if ctx.generates() and ctx.role == 1:
        await ctx.gen_rejected(ctx.request("unloaded", lora_name=name), C.NOT_FOUND, C.INVALID_ARGUMENT,
                               what="Generate with an unloaded lora_name")
