"""Score results from per-pair values, which the adapters differ only in how they obtain.

- label-token scoring (causal engines): per (query, candidate) pair, the next-token
  log-probabilities of the requested label tokens, optionally softmaxed across the labels
  (SCORE_NORMALIZATION_SOFTMAX);
- cross-encoder relevance: one relevance logit per pair, higher is better."""

from __future__ import annotations

import math
from collections.abc import Sequence

from openengine_adapters import backend as be
from openengine_adapters.errors import invalid
from openengine_adapters.types import Granularity, ScoreNormalization, ValueSemantics


def softmax(values: Sequence[float]) -> list[float]:
    m = max(values)
    exps = [math.exp(v - m) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def label_logprobs(logits: Sequence[float], labels: Sequence[int]) -> list[float]:
    """The log-probabilities of ``labels`` under one position's raw logits (log_softmax)."""
    outside = [t for t in labels if not 0 <= t < len(logits)]
    if outside:
        raise invalid(f"options.label_token_ids: token {outside[0]} is outside the model's vocabulary "
                      f"({len(logits)} logits)")
    m = max(logits)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in logits))
    return [logits[t] - lse for t in labels]


def label_score_result(p: be.ScoreParams, per_pair: Sequence[Sequence[float]], input_tokens: int
                       ) -> be.ScoreResult:
    """``per_pair`` holds one list of label log-probabilities per candidate, groups flattened in
    request order."""
    norm = ScoreNormalization.SOFTMAX if p.normalization == ScoreNormalization.SOFTMAX else ScoreNormalization.NONE
    pairs = iter(per_pair)
    groups = []
    for group in p.groups:
        row = []
        for _ in group.candidates:
            values = list(next(pairs))
            if norm == ScoreNormalization.SOFTMAX:
                values = softmax(values)
            row.append(be.CandidateScore(be.DenseTensor((len(values),), values)))
        groups.append(row)
    semantics = ValueSemantics.PROBABILITIES if norm == ScoreNormalization.SOFTMAX else ValueSemantics.LOG_PROBABILITIES
    return be.ScoreResult(groups, Granularity.SEQUENCE, semantics, norm, label_token_ids=p.label_token_ids,
                          usage=be.TaskUsageData(input_tokens))


def relevance_score_result(p: be.ScoreParams, values: Sequence[float], input_tokens: int) -> be.ScoreResult:
    """``values`` holds one relevance value per candidate, groups flattened in request order."""
    pairs = iter(values)
    groups = [[be.CandidateScore(be.DenseTensor((1,), [float(next(pairs))])) for _ in g.candidates]
              for g in p.groups]
    return be.ScoreResult(groups, Granularity.SEQUENCE, ValueSemantics.RELEVANCE, ScoreNormalization.NONE,
                          higher_is_better=True, usage=be.TaskUsageData(input_tokens))
