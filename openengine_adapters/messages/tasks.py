"""Task results as ``EmbedResponse``, ``ClassifyResponse`` and ``ScoreResponse``, checking every
output invariant.

A backend result that breaks the contract (wrong count, bad tensor, UNSPECIFIED semantics...)
is an INTERNAL failure of the call, never a malformed success.
"""

from __future__ import annotations

import math

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import EmbeddingEncoding, ErrorCode, Granularity, ValueSemantics
from openengine_adapters.v1 import (
    classification_pb2,
    embedding_pb2,
    scoring_pb2,
    tasks_pb2,
)


def _broken(message: str) -> EngineFailure:
    return EngineFailure(ErrorCode.INTERNAL, f"engine returned an invalid result: {message}")


def _check_shape(shape, where: str) -> int:
    if not shape:
        raise _broken(f"{where}: empty shape (a scalar is shape [1])")
    size = 1
    for dim in shape:
        if dim <= 0:
            raise _broken(f"{where}: every dimension must be > 0, got {list(shape)}")
        size *= dim
    return size


_FLT_MAX = 3.4028234663852886e38  # values are FP32 on the wire: larger magnitudes become inf


def _check_finite(values, where: str) -> None:
    if not all(math.isfinite(v) and -_FLT_MAX <= v <= _FLT_MAX for v in values):
        raise _broken(f"{where}: every value must be finite (as FP32)")


def dense(t: be.DenseTensor, where: str, limit: int | None = None) -> tasks_pb2.DenseFloatTensor:
    values = list(t.values)
    if _check_shape(t.shape, where) != len(values):
        raise _broken(f"{where}: shape {list(t.shape)} does not match {len(values)} values")
    _check_finite(values, where)
    if limit is not None and len(values) > limit:
        raise _broken(f"{where}: {len(values)} values exceed the advertised limit {limit}")
    return tasks_pb2.DenseFloatTensor(shape=t.shape, values=values)


def sparse(t: be.SparseTensor, where: str, limit: int | None = None) -> tasks_pb2.SparseFloatTensor:
    size = _check_shape(t.shape, where)
    indices, values = list(t.indices), list(t.values)
    if len(indices) != len(values):
        raise _broken(f"{where}: {len(indices)} indices but {len(values)} values")
    if any(b <= a for a, b in zip(indices, indices[1:], strict=False)):
        raise _broken(f"{where}: indices must be unique and strictly increasing")
    if indices and (indices[0] < 0 or indices[-1] >= size):
        raise _broken(f"{where}: every index must be in [0, {size})")
    _check_finite(values, where)
    if limit is not None and len(values) > limit:
        raise _broken(f"{where}: {len(values)} nonzero values exceed the advertised limit {limit}")
    return tasks_pb2.SparseFloatTensor(shape=t.shape, indices=indices, values=values)


def _check_token_ids(token_ids, shape, granularity: Granularity, where: str) -> None:
    if not token_ids:
        return
    if granularity != Granularity.TOKEN or len(token_ids) != shape[0]:
        raise _broken(f"{where}.token_ids: must align with the token dimension of a TOKEN tensor")


def _check_rank(shape, granularity: Granularity, where: str) -> None:
    want = {Granularity.SEQUENCE: 1, Granularity.TOKEN: 2}.get(granularity)
    if want is None:
        raise _broken(f"{where}.granularity: must be SEQUENCE or TOKEN")
    if len(shape) != want:
        raise _broken(f"{where}: a {granularity.name} tensor has {want} dimension(s), got {list(shape)}")


def _usage(u: be.TaskUsageData) -> tasks_pb2.TaskUsage:
    if u.cached_input_tokens is not None and u.cached_input_tokens > u.input_tokens:
        raise _broken("usage.cached_input_tokens exceeds input_tokens")
    msg = tasks_pb2.TaskUsage(input_tokens=u.input_tokens)
    if u.cached_input_tokens is not None:
        msg.cached_input_tokens = u.cached_input_tokens
    return msg


def _count(outputs, inputs, what: str) -> None:
    if len(outputs) != len(inputs):
        raise _broken(f"{len(outputs)} {what} for {len(inputs)} inputs")


def embed_response(p: be.EmbedParams, r: be.EmbedResult, cap: be.EmbedSupport
                   ) -> embedding_pb2.EmbedResponse:
    _count(r.outputs, p.inputs, "embeddings")
    resp = embedding_pb2.EmbedResponse(request_id=p.context.request_id, usage=_usage(r.usage))
    for i, (item, out) in enumerate(zip(p.inputs, r.outputs, strict=True)):
        where = f"outputs[{i}]"
        sparse_out = isinstance(out.tensor, be.SparseTensor)
        tensor = (sparse if sparse_out else dense)(out.tensor, where, cap.max_output_values_per_item)
        if p.granularity is not None and out.granularity != p.granularity:
            raise _broken(f"{where}: asked for {p.granularity.name}, got {out.granularity.name}")
        _check_rank(out.tensor.shape, out.granularity, where)
        want = p.dimensions if p.dimensions is not None else cap.dimension
        if want is not None and out.tensor.shape[-1] != want:
            raise _broken(f"{where}: expected dimension {want}, got {out.tensor.shape[-1]}")
        if p.encoding is not None and sparse_out != (p.encoding == EmbeddingEncoding.SPARSE):
            raise _broken(f"{where}: asked for encoding {p.encoding.name}, got "
                          f"{'SPARSE' if sparse_out else 'DENSE'}")
        _check_token_ids(out.token_ids, out.tensor.shape, out.granularity, where)
        o = resp.outputs.add(item_id=item.item_id, input_index=i, granularity=int(out.granularity),
                             token_ids=out.token_ids)
        (o.sparse if sparse_out else o.dense).CopyFrom(tensor)
    return resp


def classify_response(p: be.ClassifyParams, r: be.ClassifyResult, cap: be.ClassifySupport
                      ) -> classification_pb2.ClassifyResponse:
    _count(r.outputs, p.inputs, "classifications")
    resp = classification_pb2.ClassifyResponse(request_id=p.context.request_id, usage=_usage(r.usage))
    for i, (item, out) in enumerate(zip(p.inputs, r.outputs, strict=True)):
        where = f"outputs[{i}]"
        if out.semantics == ValueSemantics.UNSPECIFIED:
            raise _broken(f"{where}.semantics: must report the actual semantics")
        if p.semantics is not None and out.semantics != p.semantics:
            raise _broken(f"{where}: asked for {p.semantics.name}, got {out.semantics.name}")
        if p.granularity is not None and out.granularity != p.granularity:
            raise _broken(f"{where}: asked for {p.granularity.name}, got {out.granularity.name}")
        _check_rank(out.scores.shape, out.granularity, where)
        if out.labels and len(out.labels) != out.scores.shape[-1]:
            raise _broken(f"{where}.labels: {len(out.labels)} labels for {out.scores.shape[-1]} classes")
        _check_token_ids(out.token_ids, out.scores.shape, out.granularity, where)
        resp.outputs.add(
            item_id=item.item_id, input_index=i, granularity=int(out.granularity),
            semantics=int(out.semantics),
            scores=dense(out.scores, where, cap.max_output_values_per_item),
            labels=out.labels, token_ids=out.token_ids,
        )
    return resp


def score_response(p: be.ScoreParams, r: be.ScoreResult, cap: be.ScoreSupport
                   ) -> scoring_pb2.ScoreResponse:
    if len(r.groups) != len(p.groups):
        raise _broken(f"{len(r.groups)} score groups for {len(p.groups)} requested")
    if r.semantics == ValueSemantics.UNSPECIFIED:
        raise _broken("semantics: must report the actual semantics")
    if p.semantics is not None and r.semantics != p.semantics:
        raise _broken(f"semantics: asked for {p.semantics.name}, got {r.semantics.name}")
    if p.granularity is not None and r.granularity != p.granularity:
        raise _broken(f"granularity: asked for {p.granularity.name}, got {r.granularity.name}")
    if p.normalization and r.normalization != p.normalization:
        raise _broken(f"normalization: asked for {p.normalization.name}, got {r.normalization.name}")
    if tuple(r.label_token_ids) != p.label_token_ids:
        raise _broken("label_token_ids: must repeat the requested ids in order")
    resp = scoring_pb2.ScoreResponse(
        request_id=p.context.request_id, granularity=int(r.granularity),
        semantics=int(r.semantics), normalization=int(r.normalization),
        label_token_ids=p.label_token_ids, usage=_usage(r.usage),
    )
    if r.higher_is_better is not None:
        resp.higher_is_better = r.higher_is_better
    for g, (group, outs) in enumerate(zip(p.groups, r.groups, strict=True)):
        if len(outs) != len(group.candidates):
            raise _broken(f"groups[{g}]: {len(outs)} scores for {len(group.candidates)} candidates")
        go = resp.groups.add(group_id=group.group_id, group_index=g)
        for c, (cand, out) in enumerate(zip(group.candidates, outs, strict=True)):
            where = f"groups[{g}].candidates[{c}]"
            _check_rank(out.scores.shape, r.granularity, where)
            if p.label_token_ids and out.scores.shape[-1] != len(p.label_token_ids):
                raise _broken(f"{where}: one score per label token expected")
            _check_token_ids(out.token_ids, out.scores.shape, r.granularity, where)
            go.candidates.add(
                candidate_id=cand.item_id, candidate_index=c,
                scores=dense(out.scores, where, cap.max_output_values_per_candidate),
                token_ids=out.token_ids,
            )
    return resp
