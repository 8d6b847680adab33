"""Sampling determinism."""

from __future__ import annotations

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


@check("sampling.explicit_params_accepted", "role AGGREGATED")
async def explicit_params(ctx):
    """The common sampling knobs (top_p, top_k, min_p, penalties) are accepted and the stream is well-formed."""
    ctx.require_generation()
    sp = G.SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.01, frequency_penalty=0.1,
                          presence_penalty=0.1, repetition_penalty=1.05, **await ctx.seed(5))
    await _ids(ctx, "knobs", sp)
