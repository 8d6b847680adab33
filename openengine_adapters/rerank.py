"""Gateway reranking from a ScoreResponse, exactly as the spec allows it.

Only when every candidate has exactly one score and ``higher_is_better`` is present: a stable
sort in that direction, ties broken by ``candidate_index``, then the gateway's own ``top_n``;
documents come from the gateway's request state, never from the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters.v1 import scoring_pb2


@dataclass(frozen=True)
class RankedCandidate:
    candidate_index: int
    candidate_id: str
    score: float
    document: Any = None


class NotRankable(ValueError):
    """The response does not carry what reranking needs."""


def rerank(response: scoring_pb2.ScoreResponse, group_index: int = 0, top_n: int | None = None,
           documents: Sequence[Any] | None = None) -> list[RankedCandidate]:
    if not response.HasField("higher_is_better"):
        raise NotRankable("higher_is_better is absent: the score direction is unknown")
    if top_n is not None and top_n < 0:
        raise ValueError("top_n must be >= 0")
    group = next((g for g in response.groups if g.group_index == group_index), None)
    if group is None:
        raise NotRankable(f"no group with group_index {group_index}")
    ranked = []
    for cand in group.candidates:
        if len(cand.scores.values) != 1:
            raise NotRankable(f"candidate {cand.candidate_id!r} has {len(cand.scores.values)} scores, "
                              "reranking needs exactly one")
        if not cand.HasField("candidate_index"):
            raise NotRankable(f"candidate {cand.candidate_id!r} has no candidate_index")
        doc = documents[cand.candidate_index] if documents is not None else None
        ranked.append(RankedCandidate(cand.candidate_index, cand.candidate_id, cand.scores.values[0], doc))
    sign = -1.0 if response.higher_is_better else 1.0
    ranked.sort(key=lambda r: (sign * r.score, r.candidate_index))
    return ranked if top_n is None else ranked[:top_n]
