"""The near-tie rule for comparing an engine's choices with a reference's.

Two correct implementations differ by small numerical noise (for shaderlm: f16 KV cache rounding, GPU
math functions, summation order). If every logit may move by up to `tol`, then two candidates whose
reference logits are less than `tol` apart may legitimately swap; candidates further apart may not.

Greedy decoding: compare step by step until the first step whose reference top-1/top-2 margin is below
`tol`. That step may flip, and every later step depends on it, so nothing from there on is compared.
Rankings: rank k of a sorted top-k list is determined when it is at least `tol` away from both neighbours.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np


def comparable_steps(ref_margins: Sequence[float], tol: float) -> int:
    """How many leading greedy steps must match: the index of the first step whose reference top-1/top-2
    margin is below `tol` (a near-tie), or all of them when there is none."""
    for i, m in enumerate(ref_margins):
        if m < tol:
            return i
    return len(ref_margins)


class Divergence(NamedTuple):
    step: int
    ref_token: int
    got_token: Optional[int]  # None when the engine returned too few tokens
    margin: float             # reference top-1 minus top-2 logit at that step


def first_divergence(ref_ids: Sequence[int], ref_margins: Sequence[float], got_ids: Sequence[int],
                     tol: float) -> Optional[Divergence]:
    """The first step before the first near-tie where `got_ids` differs from `ref_ids` (None: they agree
    wherever they must)."""
    for i in range(comparable_steps(ref_margins, tol)):
        got = int(got_ids[i]) if i < len(got_ids) else None
        if got != int(ref_ids[i]):
            return Divergence(i, int(ref_ids[i]), got, float(ref_margins[i]))
    return None


def determined_ranks(ref_sorted: Sequence[float], next_logit: float, tol: float) -> np.ndarray:
    """For reference logits sorted in descending order (the top-k) and the largest logit below them:
    a bool mask of the ranks whose token is determined, i.e. at least `tol` from both neighbours."""
    v = np.append(np.asarray(ref_sorted, dtype=np.float64), float(next_logit))
    gaps = v[:-1] - v[1:]                      # gaps[k] = v[k] - v[k+1]
    above = np.concatenate([[np.inf], gaps[:-1]])
    return (above >= tol) & (gaps >= tol)
