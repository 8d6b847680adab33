"""Holding back text that may be the start of a stop string.

Engines with cumulative output (SGLang, TensorRT-LLM) can show a partial stop string before they
match the whole one; their translators stream text only up to where a stop could begin.
"""

from __future__ import annotations

from collections.abc import Sequence


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
