"""Sampling determinism."""

from __future__ import annotations

import grpc

from conformance.context import G
from conformance.registry import Skip, check, expect


async def _ids(ctx, tag, sampling, n=1):
    req = ctx.request(tag, max_tokens=8, sampling=sampling)
    req.stopping.ignore_eos = True
    s = await ctx.run(req)
    expect(s.error is None, f"EngineError {s.error}")
    return {i: s.token_ids.get(i, []) for i in range(n)}


@check("sampling.greedy_deterministic", "role AGGREGATED")
async def greedy(ctx):
    """temperature=0 twice gives the same tokens."""
    ctx.require_generation()
    a = await _ids(ctx, "greedy", G.SamplingParams(temperature=0.0))
    b = await _ids(ctx, "greedy", G.SamplingParams(temperature=0.0))
    expect(a == b, f"greedy runs differ: {a[0]} vs {b[0]}")


@check("sampling.seeded_deterministic", "role AGGREGATED, temperature > 0 accepted")
async def seeded(ctx):
    """temperature>0 with the same seed twice gives the same tokens."""
    ctx.require_generation()
    if not await ctx.seed_supported():
        raise Skip("the target refuses sampling.seed (INVALID_ARGUMENT, checked)")
    sp = G.SamplingParams(temperature=1.0, top_p=1.0, seed=1234)
    a = await _ids(ctx, "seed", sp)
    b = await _ids(ctx, "seed", sp)
    expect(a == b, f"same seed, different tokens: {a[0]} vs {b[0]}")


@check("sampling.seeded_deterministic_n", "advertised max_num_sequences >= 2")
async def seeded_n(ctx):
    """num_sequences=2 with a seed twice gives the same tokens per output index."""
    ctx.require_generation()
    g = ctx.gen_caps()
    if not g.HasField("max_num_sequences") or g.max_num_sequences < 2:
        raise Skip("max_num_sequences not advertised >= 2")
    if not await ctx.seed_supported():
        raise Skip("the target refuses sampling.seed (INVALID_ARGUMENT, checked)")
    sp = G.SamplingParams(temperature=1.0, seed=99, num_sequences=2)
    a = await _ids(ctx, "seedn", sp, 2)
    b = await _ids(ctx, "seedn", sp, 2)
    expect(a == b, f"same seed, different tokens per index: {a} vs {b}")


KNOBS = {"top_p": 0.9, "top_k": 20, "min_p": 0.01, "frequency_penalty": 0.1, "presence_penalty": 0.1,
         "repetition_penalty": 1.05}


@check("sampling.explicit_params_accepted", "role AGGREGATED")
async def explicit_params(ctx):
    """Each common sampling knob (top_p, top_k, min_p, penalties) set explicitly is honoured or refused:
    "Unsupported explicit options are rejected, never silently ignored" -- a refusal is
    INVALID_ARGUMENT before acceptance naming the field (an engine whose sampler ignores a knob
    refuses it). The knobs it accepts, all set together with temperature, give a well-formed stream."""
    ctx.require_generation()
    accepted = {}
    for name, value in KNOBS.items():
        req = ctx.request(f"knob-{name}", max_tokens=4, sampling=G.SamplingParams(temperature=0.7, **{name: value}))
        try:
            async for _ in ctx.stub.Generate(req, timeout=ctx.options.check_timeout_s):
                pass
        except grpc.aio.AioRpcError as exc:
            expect(exc.code() == grpc.StatusCode.INVALID_ARGUMENT and f"sampling.{name}" in (exc.details() or ""),
                   f"sampling.{name}: refused with {exc.code().name} ({exc.details()}); a refusal must be "
                   f"INVALID_ARGUMENT naming sampling.{name}")
            continue
        accepted[name] = value
    sp = G.SamplingParams(temperature=0.7, **accepted, **await ctx.seed(5))
    await _ids(ctx, "knobs", sp)
