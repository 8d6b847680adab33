"""Embed, Classify and Score: shapes, order, indexes, tensor invariants and rejections."""

from __future__ import annotations

import math

import grpc

from conformance.checks.task_calls import (
    TEXTS,
    batch_request,
    native_score,
    require_task,
    score_options,
    task_capability,
    task_context,
    task_input,
)
from conformance.context import finite
from conformance.registry import CheckFailed, Skip, check, expect
from openengine_adapters.v1 import classification_pb2, embedding_pb2, scoring_pb2, tasks_pb2

C = grpc.StatusCode
T = tasks_pb2


def check_dense(t: T.DenseFloatTensor, what: str) -> None:
    shape = list(t.shape)
    expect(shape, f"{what}: empty shape (a scalar is [1])")
    expect(all(d > 0 for d in shape), f"{what}: zero dimension in shape {shape}")
    expect(math.prod(shape) == len(t.values), f"{what}: product of shape {shape} != {len(t.values)} values")
    expect(finite(t.values), f"{what}: non-finite value")


def check_sparse(t: T.SparseFloatTensor, what: str) -> None:
    shape = list(t.shape)
    expect(shape and all(d > 0 for d in shape), f"{what}: bad shape {shape}")
    expect(len(t.indices) == len(t.values), f"{what}: {len(t.indices)} indices vs {len(t.values)} values")
    idx = list(t.indices)
    expect(all(a < b for a, b in zip(idx, idx[1:], strict=False)), f"{what}: indices not strictly increasing")
    expect(not idx or idx[-1] < math.prod(shape), f"{what}: index beyond the shape {shape}")
    expect(finite(t.values), f"{what}: non-finite value")


def check_usage(u: T.TaskUsage) -> None:
    if u.HasField("cached_input_tokens"):
        expect(u.cached_input_tokens <= u.input_tokens, "usage.cached_input_tokens exceeds input_tokens")


def _items(outputs, inputs, what):
    expect(len(outputs) == len(inputs), f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
    for i, (o, inp) in enumerate(zip(outputs, inputs, strict=True)):
        expect(o.item_id == inp.item_id, f"{what}: output {i} item_id {o.item_id!r} != {inp.item_id!r} (order)")
        expect(o.HasField("input_index"), f"{what}: output {i} has no input_index (present even for 0)")
        expect(o.input_index == i, f"{what}: output {i} input_index {o.input_index}")


def _embedding(o, what, dim=None) -> None:
    kind = o.WhichOneof("embedding")
    expect(kind is not None, f"{what}: no embedding tensor")
    expect(o.granularity != T.TASK_OUTPUT_GRANULARITY_UNSPECIFIED, f"{what}: granularity UNSPECIFIED")
    t = getattr(o, kind)
    (check_dense if kind == "dense" else check_sparse)(t, what)
    rank = 1 if o.granularity == T.TASK_OUTPUT_GRANULARITY_SEQUENCE else 2
    expect(len(t.shape) == rank, f"{what}: shape {list(t.shape)} for granularity "
           f"{T.TaskOutputGranularity.Name(o.granularity)}")
    if rank == 2 and list(o.token_ids):
        expect(len(o.token_ids) == t.shape[0], f"{what}: {len(o.token_ids)} token_ids for {t.shape[0]} rows")
    if dim is not None:
        expect(t.shape[-1] == dim, f"{what}: dimension {t.shape[-1]} != requested/advertised {dim}")


async def _embed(ctx, cap, tag, **opts):
    inputs = [task_input(ctx, cap, f"item-{i}", text) for i, text in enumerate(TEXTS)]
    req = embedding_pb2.EmbedRequest(context=task_context(ctx, tag), inputs=inputs,
                                     options=embedding_pb2.EmbedOptions(**opts))
    return req, await ctx.stub.Embed(req, timeout=ctx.options.check_timeout_s)


# Embed -------------------------------------------------------------------------------------------------

@check("tasks.embed_basic", "advertised tasks.embed")
async def embed_basic(ctx):
    """Default Embed: one output per input in order, input_index present incl. 0, valid tensors."""
    cap = require_task(ctx, "embed")
    req, resp = await _embed(ctx, cap, "embed")
    expect(resp.request_id == req.context.request_id, "request_id not echoed")
    _items(resp.outputs, req.inputs, "Embed")
    for i, o in enumerate(resp.outputs):
        dim = cap.dimension if cap.HasField("dimension") and o.granularity == T.TASK_OUTPUT_GRANULARITY_SEQUENCE \
            else None
        _embedding(o, f"Embed output {i}", dim)
    check_usage(resp.usage)


@check("tasks.embed_granularities", "advertised tasks.embed granularities (others rejected)")
async def embed_granularities(ctx):
    """Each advertised granularity is honoured exactly; an unadvertised one is INVALID_ARGUMENT."""
    cap = require_task(ctx, "embed")
    for g in (T.TASK_OUTPUT_GRANULARITY_SEQUENCE, T.TASK_OUTPUT_GRANULARITY_TOKEN):
        name = T.TaskOutputGranularity.Name(g)
        if g in cap.granularities:
            req, resp = await _embed(ctx, cap, "embgran", granularity=g)
            _items(resp.outputs, req.inputs, f"Embed {name}")
            for i, o in enumerate(resp.outputs):
                expect(o.granularity == g, f"asked {name}, got {T.TaskOutputGranularity.Name(o.granularity)}")
                _embedding(o, f"Embed {name} output {i}")
        else:
            await ctx.rejected(_embed(ctx, cap, "embgran", granularity=g), C.INVALID_ARGUMENT,
                               what=f"Embed granularity {name} (not advertised)")


@check("tasks.embed_encodings", "advertised tasks.embed encodings (others rejected)")
async def embed_encodings(ctx):
    """Each advertised encoding is honoured exactly; an unadvertised one is INVALID_ARGUMENT."""
    cap = require_task(ctx, "embed")
    for enc, field in ((T.EMBEDDING_ENCODING_DENSE, "dense"), (T.EMBEDDING_ENCODING_SPARSE, "sparse")):
        name = T.EmbeddingEncoding.Name(enc)
        if enc in cap.encodings:
            req, resp = await _embed(ctx, cap, "embenc", encoding=enc)
            for i, o in enumerate(resp.outputs):
                expect(o.WhichOneof("embedding") == field, f"asked {name}, got {o.WhichOneof('embedding')}")
                _embedding(o, f"Embed {name} output {i}")
        else:
            await ctx.rejected(_embed(ctx, cap, "embenc", encoding=enc), C.INVALID_ARGUMENT,
                               what=f"Embed encoding {name} (not advertised)")


@check("tasks.embed_normalize", "advertised tasks.embed supports_normalization (else rejected)")
async def embed_normalize(ctx):
    """"An explicit granularity, normalization, or encoding request must be implemented exactly or
    rejected": normalize=true gives unit L2 norm; normalize=false gives the same direction (the vector that
    normalize=true scales), or is refused; without supports_normalization an explicit normalize is
    INVALID_ARGUMENT."""
    cap = require_task(ctx, "embed")
    if not cap.supports_normalization:
        await ctx.rejected(_embed(ctx, cap, "embnorm", normalize=True), C.INVALID_ARGUMENT,
                           what="Embed normalize (not advertised)")
        ctx.reported(cap, "supports_normalization", "Embed normalize")
        return
    _, resp = await _embed(ctx, cap, "embnorm", normalize=True)
    for i, o in enumerate(resp.outputs):
        if o.WhichOneof("embedding") == "dense" and o.granularity == T.TASK_OUTPUT_GRANULARITY_SEQUENCE:
            norm = math.sqrt(sum(v * v for v in o.dense.values))
            expect(abs(norm - 1.0) < 1e-3, f"output {i}: L2 norm {norm:.5f} with normalize=true")
    if T.TASK_OUTPUT_GRANULARITY_TOKEN in cap.granularities:  # each token's vector, not only a sequence's
        _, tok = await _embed(ctx, cap, "embnormtok", normalize=True, granularity=T.TASK_OUTPUT_GRANULARITY_TOKEN,
                              encoding=T.EMBEDDING_ENCODING_DENSE if T.EMBEDDING_ENCODING_DENSE in cap.encodings
                              else T.EMBEDDING_ENCODING_UNSPECIFIED)
        for i, o in enumerate(tok.outputs):
            if o.WhichOneof("embedding") == "dense" and len(o.dense.shape) == 2:
                width = o.dense.shape[1]
                for r in range(o.dense.shape[0]):
                    row = o.dense.values[r * width:(r + 1) * width]
                    norm = math.sqrt(sum(v * v for v in row))
                    expect(abs(norm - 1.0) < 1e-3, f"TOKEN output {i} row {r}: L2 norm {norm:.5f} with "
                           "normalize=true (normalization applies to each token's vector)")
    try:
        _, raw = await _embed(ctx, cap, "embraw", normalize=False)
    except grpc.aio.AioRpcError as exc:
        expect(exc.code() == C.INVALID_ARGUMENT, f"normalize=false failed with {exc.code().name}: {exc.details()}")
        return
    for i, (a, b) in enumerate(zip(resp.outputs, raw.outputs, strict=True)):
        if a.WhichOneof("embedding") == b.WhichOneof("embedding") == "dense":
            na = math.sqrt(sum(v * v for v in a.dense.values))
            nb = math.sqrt(sum(v * v for v in b.dense.values))
            if na and nb:
                cos = sum(x * y for x, y in zip(a.dense.values, b.dense.values, strict=True)) / (na * nb)
                expect(cos > 0.999, f"output {i}: normalize=false points elsewhere than normalize=true (cos {cos:.4f})")


@check("tasks.embed_dimensions", "advertised tasks.embed supports_dimension_override (else rejected)")
async def embed_dimensions(ctx):
    """dimensions=k (< native) reduces the output to k values; unadvertised override is INVALID_ARGUMENT;
    dimensions=0 is INVALID_ARGUMENT."""
    cap = require_task(ctx, "embed")
    await ctx.rejected(_embed(ctx, cap, "embdim0", dimensions=0), C.INVALID_ARGUMENT, what="Embed dimensions 0")
    if not cap.supports_dimension_override:
        await ctx.rejected(_embed(ctx, cap, "embdim", dimensions=2), C.INVALID_ARGUMENT,
                           what="Embed dimensions (override not advertised)")
        ctx.reported(cap, "supports_dimension_override", "Embed dimensions")
        return
    req, resp = await _embed(ctx, cap, "embdim", dimensions=2, granularity=T.TASK_OUTPUT_GRANULARITY_SEQUENCE)
    for i, o in enumerate(resp.outputs):
        _embedding(o, f"Embed dimensions=2 output {i}", 2)


@check("tasks.embed_normalize_false_reduced",
       "advertised tasks.embed supports_normalization and supports_dimension_override")
async def embed_normalize_false_reduced(ctx):
    """Revision 1, Non-generative task API: "An explicit ... normalization ... request must be implemented exactly";
    "dimensions ... requests dimensionality reduction": normalize=false asks for the vectors without
    normalization, so a reduced vector (dimensions=2) that is unit length for every input was normalized after
    the reduction, against the request. (Without a reduction a client cannot tell an ignored normalize=false
    from a model whose own vectors are unit length; a reduction of unit vectors is not unit length unless
    renormalized.)"""
    cap = require_task(ctx, "embed")
    if not (cap.supports_normalization and cap.supports_dimension_override):
        raise Skip("needs both supports_normalization and supports_dimension_override")
    if cap.HasField("dimension") and cap.dimension <= 2:
        raise Skip(f"the native dimension {cap.dimension} leaves nothing to reduce")
    inputs = [task_input(ctx, cap, f"item-{i}", text) for i, text in enumerate(TEXTS + ["A third input, longer "
                                                                                      "than the other two."])]
    req = embedding_pb2.EmbedRequest(context=task_context(ctx, "embraw2"), inputs=inputs,
                                     options=embedding_pb2.EmbedOptions(normalize=False, dimensions=2,
                                                                        granularity=T.TASK_OUTPUT_GRANULARITY_SEQUENCE))
    try:
        resp = await ctx.stub.Embed(req, timeout=ctx.options.check_timeout_s)
    except grpc.aio.AioRpcError as exc:
        expect(exc.code() == C.INVALID_ARGUMENT,
               f"normalize=false with dimensions=2 failed with {exc.code().name}: {exc.details()}")
        return
    norms = []
    for i, o in enumerate(resp.outputs):
        _embedding(o, f"Embed normalize=false dimensions=2 output {i}", 2)
        values = _dense_values(o)
        norms.append(math.sqrt(sum(v * v for v in values)))
    expect(not all(abs(n - 1.0) < 1e-6 for n in norms),
           f"normalize=false with dimensions=2 gave unit-length vectors for every input (norms {norms}): the "
           "reduced vectors were normalized although normalize=false was asked")


def _dense_values(o) -> list[float]:
    """An embedding's values as a dense list (a sparse tensor filled in)."""
    if o.WhichOneof("embedding") == "dense":
        return list(o.dense.values)
    out = [0.0] * math.prod(o.sparse.shape)
    for k, v in zip(o.sparse.indices, o.sparse.values, strict=True):
        out[k] = v
    return out


@check("tasks.embed_encodings_agree", "advertised tasks.embed encodings DENSE and SPARSE")
async def embed_encodings_agree(ctx):
    """An encoding chooses the representation, not the values (revision 1, Non-generative task API: "An explicit ...
    encoding request must be implemented exactly"), so the SPARSE answer filled in is the DENSE answer of the
    same request (same shape, same values within 1e-4)."""
    cap = require_task(ctx, "embed")
    if not {T.EMBEDDING_ENCODING_DENSE, T.EMBEDDING_ENCODING_SPARSE} <= set(cap.encodings):
        raise Skip("DENSE and SPARSE are not both advertised")
    _, dense = await _embed(ctx, cap, "embdense", encoding=T.EMBEDDING_ENCODING_DENSE)
    _, sparse = await _embed(ctx, cap, "embsparse", encoding=T.EMBEDDING_ENCODING_SPARSE)
    for i, (a, b) in enumerate(zip(dense.outputs, sparse.outputs, strict=True)):
        expect(list(a.dense.shape) == list(b.sparse.shape),
               f"output {i}: DENSE shape {list(a.dense.shape)} != SPARSE shape {list(b.sparse.shape)}")
        va, vb = _dense_values(a), _dense_values(b)
        worst = max((abs(x - y) for x, y in zip(va, vb, strict=True)), default=0.0)
        expect(worst < 1e-4, f"output {i}: the SPARSE values differ from the DENSE ones by up to {worst:.5f}")


# shared rejections ---------------------------------------------------------------------------------------

def _rejection_checks(task: str):
    @check(f"tasks.{task}_rejects_malformed", f"advertised tasks.{task}")
    async def malformed(ctx):
        """Empty batch, duplicate item ids and a missing request_id are INVALID_ARGUMENT;
        an unknown model is NOT_FOUND."""
        cap = require_task(ctx, task)
        await ctx.rejected(batch_request(ctx, task, cap, "empty", inputs=[]), C.INVALID_ARGUMENT,
                           what=f"{task} with an empty batch")
        dup = [task_input(ctx, cap, "same", TEXTS[0]), task_input(ctx, cap, "same", TEXTS[1])]
        if task == "score":
            dup = [task_input(ctx, cap, "q", TEXTS[0])] + [task_input(ctx, cap, "same", t) for t in TEXTS]
        await ctx.rejected(batch_request(ctx, task, cap, "dup", inputs=dup), C.INVALID_ARGUMENT,
                           what=f"{task} with duplicate item ids")
        call = batch_request(ctx, task, cap, "noid")
        await call  # warm: a valid request must work
        req_fn = {"embed": (ctx.stub.Embed, embedding_pb2.EmbedRequest),
                  "classify": (ctx.stub.Classify, classification_pb2.ClassifyRequest),
                  "score": (ctx.stub.Score, scoring_pb2.ScoreRequest)}[task]
        if task == "score":
            msg = req_fn[1](context=T.TaskRequestContext(model=ctx.model), options=score_options(cap),
                            groups=[scoring_pb2.ScoreGroup(group_id="g", query=task_input(ctx, cap, "q", TEXTS[0]),
                                                           candidates=[task_input(ctx, cap, "c", TEXTS[1])])])
        else:
            msg = req_fn[1](context=T.TaskRequestContext(model=ctx.model), inputs=[task_input(ctx, cap, "a", TEXTS[0])])
        await ctx.rejected(req_fn[0](msg, timeout=30), C.INVALID_ARGUMENT, what=f"{task} without request_id")
        msg.context.request_id = ctx.rid("unknownmodel")
        msg.context.model = "conformance/no-such-model"
        await ctx.rejected(req_fn[0](msg, timeout=30), C.NOT_FOUND, what=f"{task} for an unknown model")

    @check(f"tasks.{task}_unadvertised_options", f"advertised tasks.{task}")
    async def unadvertised(ctx):
        """priority / lora_name are INVALID_ARGUMENT when the task does not advertise them."""
        cap = require_task(ctx, task)
        tested = 0
        if not cap.supports_priority:
            await ctx.rejected(batch_request(ctx, task, cap, "prio", priority=1), C.INVALID_ARGUMENT,
                               what=f"{task} priority (not advertised)")
            ctx.reported(cap, "supports_priority", f"{task} priority")
            tested += 1
        if not cap.supports_lora:
            await ctx.rejected(batch_request(ctx, task, cap, "lora", lora_name="conformance-lora"),
                               C.INVALID_ARGUMENT, what=f"{task} lora_name (not advertised)")
            ctx.reported(cap, "supports_lora", f"{task} lora_name")
            tested += 1
        if not tested:
            raise Skip("priority and lora are both advertised")

    @check(f"tasks.{task}_unsupported", f"tasks.{task} not advertised")
    async def unsupported(ctx):
        """A task the model does not advertise is FAILED_PRECONDITION."""
        if task_capability(ctx, task) is not None:
            raise Skip(f"{task} is advertised")
        cap = T.ScoreCapabilities(input_types=[T.TASK_INPUT_TYPE_TEXT])
        await ctx.rejected(batch_request(ctx, task, cap, "unsup"), C.FAILED_PRECONDITION,
                           what=f"{task} on a model without it")


for _task in ("embed", "classify", "score"):
    _rejection_checks(_task)


# Classify -----------------------------------------------------------------------------------------------

async def _classify(ctx, cap, tag, **opts):
    inputs = [task_input(ctx, cap, f"item-{i}", t) for i, t in enumerate(TEXTS)]
    req = classification_pb2.ClassifyRequest(context=task_context(ctx, tag), inputs=inputs,
                                             options=classification_pb2.ClassifyOptions(**opts))
    return req, await ctx.stub.Classify(req, timeout=ctx.options.check_timeout_s)


def _classification(o, what):
    expect(o.semantics != T.TASK_VALUE_SEMANTICS_UNSPECIFIED, f"{what}: semantics UNSPECIFIED")
    expect(o.granularity != T.TASK_OUTPUT_GRANULARITY_UNSPECIFIED, f"{what}: granularity UNSPECIFIED")
    check_dense(o.scores, what)
    rank = 1 if o.granularity == T.TASK_OUTPUT_GRANULARITY_SEQUENCE else 2
    expect(len(o.scores.shape) == rank, f"{what}: shape {list(o.scores.shape)} for granularity "
           f"{T.TaskOutputGranularity.Name(o.granularity)}")
    if list(o.labels):
        expect(len(o.labels) == o.scores.shape[-1], f"{what}: {len(o.labels)} labels for {o.scores.shape[-1]} classes")
    if rank == 2 and list(o.token_ids):
        expect(len(o.token_ids) == o.scores.shape[0], f"{what}: token_ids not aligned with rows")
    value_range(o.scores.values, o.semantics, what)


def value_range(values, semantics, what: str) -> None:
    """What a value semantics admits: probabilities lie in [0, 1], log-probabilities are at most 0."""
    if semantics == T.TASK_VALUE_SEMANTICS_PROBABILITIES:
        expect(all(-1e-6 <= v <= 1 + 1e-6 for v in values), f"{what}: a probability outside [0, 1]")
    if semantics == T.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES:
        expect(all(v <= 1e-6 for v in values), f"{what}: a log-probability above 0")


def softmax(values) -> list[float]:
    top = max(values)
    e = [math.exp(v - top) for v in values]
    return [v / sum(e) for v in e]


def _sigmoid(values) -> list[float]:
    return [1.0 / (1.0 + math.exp(-v)) if v >= -700 else 0.0 for v in values]


def close(a, b, tol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


# two requests on a real engine differ run to run (CPU kernels: up to 0.2% seen); a wrong transform is far off
TRANSFORM_TOL = 0.01


@check("tasks.classify_basic", "advertised tasks.classify")
async def classify_basic(ctx):
    """Default Classify: order, input_index incl. 0, valid tensors, non-UNSPECIFIED semantics, labels aligned."""
    cap = require_task(ctx, "classify")
    req, resp = await _classify(ctx, cap, "cls")
    expect(resp.request_id == req.context.request_id, "request_id not echoed")
    _items(resp.outputs, req.inputs, "Classify")
    for i, o in enumerate(resp.outputs):
        _classification(o, f"Classify output {i}")
    check_usage(resp.usage)


@check("tasks.classify_semantics", "advertised tasks.classify semantics (others rejected)")
async def classify_semantics(ctx):
    """Each advertised output_semantics is reported back exactly; an unadvertised one is INVALID_ARGUMENT."""
    cap = require_task(ctx, "classify")
    for sem in T.TaskValueSemantics.values():
        if sem == 0:
            continue
        name = T.TaskValueSemantics.Name(sem)
        if sem in cap.semantics:
            _, resp = await _classify(ctx, cap, "clssem", output_semantics=sem)
            for i, o in enumerate(resp.outputs):
                expect(o.semantics == sem, f"asked {name}, output {i} reports {T.TaskValueSemantics.Name(o.semantics)}")
                _classification(o, f"Classify {name} output {i}")
        else:
            await ctx.rejected(_classify(ctx, cap, "clssem", output_semantics=sem), C.INVALID_ARGUMENT,
                               what=f"Classify semantics {name} (not advertised)")
    bad = next(g for g in (T.TASK_OUTPUT_GRANULARITY_TOKEN, T.TASK_OUTPUT_GRANULARITY_SEQUENCE)
               if g not in cap.granularities) if len(cap.granularities) < 2 else None
    if bad is not None:
        await ctx.rejected(_classify(ctx, cap, "clsgran", granularity=bad), C.INVALID_ARGUMENT,
                           what=f"Classify granularity {T.TaskOutputGranularity.Name(bad)} (not advertised)")


@check("tasks.classify_semantics_agree", "advertised tasks.classify LOGITS and PROBABILITIES (or LOG_PROBABILITIES)")
async def classify_semantics_agree(ctx):
    """Revision 1, Non-generative task API: "An explicit value must be supported" and is implemented exactly, so the
    semantics describe one classification: PROBABILITIES are the softmax (single-label) or the sigmoid
    (multi-label) of the LOGITS, and LOG_PROBABILITIES their logarithm (within 0.01: two requests on a real
    engine differ slightly)."""
    cap = require_task(ctx, "classify")
    wanted = [T.TASK_VALUE_SEMANTICS_LOGITS, T.TASK_VALUE_SEMANTICS_PROBABILITIES,
              T.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES]
    have = [sem for sem in wanted if sem in cap.semantics]
    if len(have) < 2:
        raise Skip("fewer than two of LOGITS, PROBABILITIES, LOG_PROBABILITIES are advertised")
    answers = {}
    for sem in have:
        _, resp = await _classify(ctx, cap, "clsagree", output_semantics=sem,
                                  granularity=T.TASK_OUTPUT_GRANULARITY_SEQUENCE
                                  if T.TASK_OUTPUT_GRANULARITY_SEQUENCE in cap.granularities else 0)
        answers[sem] = [list(o.scores.values) for o in resp.outputs]
    for i in range(len(TEXTS)):
        probs = {}
        if T.TASK_VALUE_SEMANTICS_PROBABILITIES in answers:
            probs["PROBABILITIES"] = answers[T.TASK_VALUE_SEMANTICS_PROBABILITIES][i]
        if T.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES in answers:
            logp = answers[T.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES][i]
            probs["exp(LOG_PROBABILITIES)"] = [math.exp(v) for v in logp]
        if T.TASK_VALUE_SEMANTICS_LOGITS in answers:
            logits = answers[T.TASK_VALUE_SEMANTICS_LOGITS][i]
            for name, p in probs.items():
                expect(close(p, softmax(logits), TRANSFORM_TOL) or close(p, _sigmoid(logits), TRANSFORM_TOL),
                       f"output {i}: {name} {[round(v, 4) for v in p]} is neither softmax nor sigmoid of LOGITS "
                       f"{[round(v, 4) for v in logits]}: one of the semantics is not implemented exactly")
        elif len(probs) == 2:
            a, b = probs.values()
            expect(close(a, b, TRANSFORM_TOL), f"output {i}: PROBABILITIES {a} != exp(LOG_PROBABILITIES) {b}")


# Score --------------------------------------------------------------------------------------------------

async def _labels(ctx, cap) -> list[int]:
    n = min(2, cap.max_label_token_ids) if cap.HasField("max_label_token_ids") else 2
    ids = []
    try:
        if ctx.mi().supports_text_input and ctx.role == 1 and ctx.generates():
            ids = sorted(set((await ctx.baseline()).token_ids))
    except (AssertionError, grpc.aio.AioRpcError):
        ids = []
    ids = (ids + [i for i in (5, 6, 7, 8) if i not in ids])[:n]
    return ids


async def _score(ctx, cap, tag, **opts):
    groups = []
    for g in range(2):
        groups.append(scoring_pb2.ScoreGroup(
            group_id=f"group-{g}", query=task_input(ctx, cap, "query", f"Query number {g}?"),
            candidates=[task_input(ctx, cap, f"cand-{c}", f"Candidate {c} for query {g}.") for c in range(2)]))
    req = scoring_pb2.ScoreRequest(context=task_context(ctx, tag), groups=groups,
                                   options=scoring_pb2.ScoreOptions(**opts))
    return req, await ctx.stub.Score(req, timeout=ctx.options.check_timeout_s)


def _check_score(req, resp, width=None):
    expect(resp.request_id == req.context.request_id, "request_id not echoed")
    expect(resp.semantics != T.TASK_VALUE_SEMANTICS_UNSPECIFIED, "ScoreResponse.semantics UNSPECIFIED")
    expect(resp.granularity != T.TASK_OUTPUT_GRANULARITY_UNSPECIFIED, "ScoreResponse.granularity UNSPECIFIED")
    expect(len(resp.groups) == len(req.groups), f"{len(resp.groups)} groups for {len(req.groups)}")
    for gi, (go, gq) in enumerate(zip(resp.groups, req.groups, strict=True)):
        expect(go.group_id == gq.group_id, f"group {gi} id {go.group_id!r} != {gq.group_id!r} (order)")
        expect(go.HasField("group_index") and go.group_index == gi, f"group {gi}: group_index missing or wrong")
        expect(len(go.candidates) == len(gq.candidates), f"group {gi}: {len(go.candidates)} candidates")
        for ci, (co, cq) in enumerate(zip(go.candidates, gq.candidates, strict=True)):
            what = f"group {gi} candidate {ci}"
            expect(co.candidate_id == cq.item_id, f"{what}: id {co.candidate_id!r} != {cq.item_id!r} (order)")
            expect(co.HasField("candidate_index") and co.candidate_index == ci,
                   f"{what}: candidate_index missing or wrong")
            check_dense(co.scores, what)
            value_range(co.scores.values, resp.semantics, what)
            if width is not None and resp.granularity == T.TASK_OUTPUT_GRANULARITY_SEQUENCE:
                expect(list(co.scores.shape) == [width], f"{what}: shape {list(co.scores.shape)}, expected [{width}]")
    check_usage(resp.usage)


@check("tasks.score_native", "advertised tasks.score with a model-native score")
async def score_native(ctx):
    """Native scoring (no label tokens): groups/candidates in order with present indexes incl. 0."""
    cap = require_task(ctx, "score")
    if not native_score(cap):
        raise Skip("the model advertises only label-token scoring")
    req, resp = await _score(ctx, cap, "score")
    _check_score(req, resp)
    expect(not list(resp.label_token_ids), "label_token_ids echoed for native scoring")


@check("tasks.score_label_tokens", "advertised tasks.score supports_label_token_scoring (else rejected)")
async def score_label_tokens(ctx):
    """label_token_ids scoring echoes the ids in order, one value per label; duplicates are INVALID_ARGUMENT.
    Without the capability, label_token_ids is INVALID_ARGUMENT."""
    cap = require_task(ctx, "score")
    labels = await _labels(ctx, cap)
    if not cap.supports_label_token_scoring:
        await ctx.rejected(_score(ctx, cap, "lbl", label_token_ids=labels), C.INVALID_ARGUMENT,
                           what="Score label_token_ids (not advertised)")
        ctx.reported(cap, "supports_label_token_scoring", "Score label_token_ids")
        return
    req, resp = await _score(ctx, cap, "lbl", label_token_ids=labels)
    _check_score(req, resp, width=len(labels))
    expect(list(resp.label_token_ids) == labels, f"label_token_ids echoed {list(resp.label_token_ids)} != {labels}")
    await ctx.rejected(_score(ctx, cap, "lbldup", label_token_ids=[labels[0], labels[0]]), C.INVALID_ARGUMENT,
                       what="Score with duplicate label_token_ids")


async def _normalizations(ctx, cap, labels: list[int], what: str) -> None:
    """Each normalization honoured or refused; on label-token scoring SOFTMAX is the softmax of the NONE vector
    (revision 1, Non-generative task API: "NONE requests native unnormalized values, and SOFTMAX requests
    normalization across each returned label vector": one is the other normalized, whatever the native values
    are, logits or log- probabilities)."""
    answers = {}
    for norm in (T.SCORE_NORMALIZATION_NONE, T.SCORE_NORMALIZATION_SOFTMAX):
        name = T.ScoreNormalization.Name(norm)
        if norm in cap.normalizations:
            try:
                req, resp = await _score(ctx, cap, "norm", normalization=norm, label_token_ids=labels)
            except grpc.aio.AioRpcError as exc:
                raise CheckFailed(f"{what} {name} is advertised but failed: {exc.code().name}: {exc.details()}") \
                    from None
            _check_score(req, resp, width=len(labels) or None)
            expect(resp.normalization == norm, f"{what}: asked {name}, got "
                   f"{T.ScoreNormalization.Name(resp.normalization)}")
            if norm == T.SCORE_NORMALIZATION_SOFTMAX and labels:
                for g in resp.groups:
                    for c in g.candidates:
                        total = sum(c.scores.values)
                        expect(abs(total - 1.0) < 1e-3, f"{what}: SOFTMAX label vector sums to {total}")
            answers[norm] = [list(c.scores.values) for g in resp.groups for c in g.candidates]
        else:
            await ctx.rejected(_score(ctx, cap, "norm", normalization=norm, label_token_ids=labels),
                               C.INVALID_ARGUMENT, what=f"{what} {name} (not advertised)")
    if labels and len(answers) == 2:
        for k, (native, normed) in enumerate(zip(*answers.values(), strict=True)):
            expect(close(normed, softmax(native), TRANSFORM_TOL),
                   f"{what}: candidate {k}: SOFTMAX {[round(v, 4) for v in normed]} is not the softmax of NONE "
                   f"{[round(v, 4) for v in native]} (NONE must be the native unnormalized values)")


@check("tasks.score_normalizations", "advertised tasks.score normalizations (others rejected)")
async def score_normalizations(ctx):
    """Each advertised normalization is honoured and reported back (on label-token scoring when advertised,
    where SOFTMAX is defined); an unadvertised one is INVALID_ARGUMENT."""
    cap = require_task(ctx, "score")
    labels = await _labels(ctx, cap) if cap.supports_label_token_scoring else []
    await _normalizations(ctx, cap, labels, "label-token Score normalization" if labels else "Score normalization")


@check("tasks.score_native_normalizations", "advertised tasks.score native score and label-token scoring")
async def score_native_normalizations(ctx):
    """The advertised normalizations also apply to model-native scoring (no label tokens): honoured or
    INVALID_ARGUMENT, never an INTERNAL failure after acceptance."""
    cap = require_task(ctx, "score")
    if not (cap.supports_label_token_scoring and native_score(cap)):
        raise Skip("covered by tasks.score_normalizations (only one scoring kind advertised)")
    await _normalizations(ctx, cap, [], "native Score normalization")


@check("tasks.score_rejects_malformed_groups", "advertised tasks.score")
async def score_groups(ctx):
    """Duplicate group ids, a group without candidates and an unadvertised instruction are INVALID_ARGUMENT."""
    cap = require_task(ctx, "score")
    opts = score_options(cap)
    q = task_input(ctx, cap, "q", TEXTS[0])
    c = task_input(ctx, cap, "c", TEXTS[1])
    cases = [
        ("duplicate group ids", [scoring_pb2.ScoreGroup(group_id="g", query=q, candidates=[c]),
                                 scoring_pb2.ScoreGroup(group_id="g", query=q, candidates=[c])], opts),
        ("a group without candidates", [scoring_pb2.ScoreGroup(group_id="g", query=q)], opts),
    ]
    if not cap.supports_instruction:
        io = scoring_pb2.ScoreOptions()
        io.CopyFrom(opts)
        io.instruction = "Judge relevance."
        cases.append(("an instruction (not advertised)", [scoring_pb2.ScoreGroup(group_id="g", query=q,
                                                                                 candidates=[c])], io))
    for what, groups, o in cases:
        req = scoring_pb2.ScoreRequest(context=task_context(ctx, "badgroup"), groups=groups, options=o)
        await ctx.rejected(ctx.stub.Score(req, timeout=30), C.INVALID_ARGUMENT, what=f"Score with {what}")
    if not cap.supports_instruction:
        ctx.reported(cap, "supports_instruction", "Score instruction")
