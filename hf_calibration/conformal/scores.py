"""Conformity scores of every class: THR (LAC), APS and RAPS; a class is in the set when its score is <= the threshold.

With ``p`` a row of probabilities, ``r(y)`` the rank of class ``y`` once the row is sorted in decreasing order
(1 = most probable) and ``p_(j)`` the ``j``-th largest probability:

* ``thr`` (LAC; Sadinle, Lei & Wasserman 2019): ``s(x, y) = 1 - p_y``.
* ``aps`` (Romano, Sesia & Candès 2020, as written in Angelopoulos et al. 2021, Algorithm 2 with lambda = 0):
  ``s(x, y) = sum_{j <= r(y)} p_(j) - u * p_(r(y))``.
* ``raps`` (Angelopoulos, Bates, Malik & Jordan 2021, Algorithms 2-3):
  ``s(x, y) = sum_{j <= r(y)} p_(j) - u * p_(r(y)) + lambda * max(r(y) - k_reg, 0)``.

``u`` is one Uniform(0, 1) draw per sample (``None``: the non-randomised score, ``u = 0``). As in the paper,
it scales the class's own probability only, never the penalty, and one draw serves every class of a row, so
the scores of a row never decrease with the rank and an APS / RAPS set is always the ``L`` most probable classes:
the paper's randomised Algorithm 3 (``L`` classes, the ``L``-th kept when ``U < V``) is ``{y : s(x, y; u) <= tau}``
with ``U = 1 - u``.
(TorchCP draws one ``u`` per class at prediction time, so its randomised sets need not be a top-``L`` prefix.)

Tied probabilities are ranked by class index (a stable sort), so equal inputs always give equal sets.
"""

from __future__ import annotations

from typing import Literal

import torch

Method = Literal["thr", "aps", "raps"]
METHODS: tuple[str, ...] = ("thr", "aps", "raps")


def rank_penalty(num_classes: int, k_reg: int, penalty: float, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """RAPS's regulariser by rank: ``lambda * max(j - k_reg, 0)`` for ranks ``j = 1..K`` (a (K,) tensor).

    Built from Python floats (K is fixed), so a tracer records it as a ``dtype`` constant: a Python scalar times a
    tensor is exported with the scalar as a float32 constant (0.1 becoming 0.10000000149, scores 6e-9 off at rank 5)."""
    return torch.tensor(
        [float(penalty) * max(j - k_reg, 0) for j in range(1, num_classes + 1)], dtype=dtype, device=device
    )


def ranked_scores(
    ordered: torch.Tensor, u: torch.Tensor | None = None, *, k_reg: int = 0, penalty: float = 0.0
) -> torch.Tensor:
    """APS / RAPS scores of the ranks, from probabilities already sorted in decreasing order along each row: entry
    ``(i, j)`` is the score of the class of rank ``j + 1`` (non-decreasing along each row).

    The cumulative mass is capped at 1, and is exactly 1 at the last rank: what it is, whatever the rounding of the
    sums (so the non-randomised scores of a saturated tail tie exactly, as they do in exact arithmetic)."""
    cumulated = torch.cumsum(ordered, dim=1).clamp(max=1.0)
    # the last rank set by concatenation, not an indexed write: what tracers (ONNX, torch.export) take as it is
    scores = torch.cat([cumulated[:, :-1], torch.ones_like(cumulated[:, -1:])], dim=1)
    if u is not None:
        scores = scores - u[:, None] * ordered
    if penalty:
        scores = scores + rank_penalty(ordered.shape[1], k_reg, penalty, dtype=ordered.dtype, device=ordered.device)
    return scores


def sort_probabilities(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ordered, order)``: each row in decreasing order, ties by class index, and the class of each rank."""
    return torch.sort(probs, dim=1, descending=True, stable=True)


def conformity_scores(
    probs: torch.Tensor, method: Method, u: torch.Tensor | None = None, *, k_reg: int = 0, penalty: float = 0.0
) -> torch.Tensor:
    """The (N, K) score of every class for (N, K) probabilities (float64 recommended), on their device.

    Args:
        probs: rows of class probabilities.
        method: ``"thr"``, ``"aps"`` or ``"raps"`` (``aps`` is ``raps`` with ``penalty = 0``).
        u: (N,) uniform draws in [0, 1] for the randomised APS / RAPS score; None for the non-randomised one.
        k_reg, penalty: RAPS's ``k_reg`` and ``lambda`` (ignored unless ``method == "raps"``).
    """
    return _scores(probs, method, u, k_reg, penalty, graph=False)


def label_ranks(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The 1-based rank of each row's label among its classes (ties ranked by class index, as in the scores)."""
    order = sort_probabilities(probs)[1]
    return (order == labels[:, None]).int().argmax(dim=1) + 1


def sets_from_scores(
    scores: torch.Tensor, q_hat: float, *, allow_empty: bool = False, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """The (N, K) boolean sets ``{y : s(x, y) <= q_hat}``; with ``allow_empty=False`` an empty set gets its most probable
    class, as the paper's code does by default (``allow_zero_sets=False``): the first largest of ``probs`` (what the
    compiled kernels take), else the lowest score. Pass ``probs`` for APS / RAPS: scores capped at 1 tie on a saturated
    row (a top probability of 1.0), where the lowest score is class 0, not the most probable class."""
    sets = scores <= q_hat
    if not allow_empty:
        empty = ~sets.any(dim=1)
        if bool(empty.any()):
            rows = empty.nonzero()[:, 0]
            sets[rows, _top_class(scores[rows], None if probs is None else probs[rows])] = True
    return sets


def _top_class(scores: torch.Tensor, probs: torch.Tensor | None, keepdim: bool = False) -> torch.Tensor:
    """Each row's most probable class: the first largest probability, else the first lowest score."""
    return scores.argmin(dim=1, keepdim=keepdim) if probs is None else probs.argmax(dim=1, keepdim=keepdim)


PAIRWISE_MAX_K = 2048  # up to this K the traced order ranks classes by pairwise comparison (N K^2 booleans)


def sort_probabilities_graph(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sort_probabilities` for tracers (the ONNX exporter has no stable sort), with the same order.

    Up to ``PAIRWISE_MAX_K`` classes, each class's rank is the number of classes before it (a larger probability, or an
    equal one at a lower index): exactly the stable sort's order, ties included, which piecewise calibrators (isotonic,
    histogram binning) produce in numbers. Beyond, ``torch.topk`` (ONNX TopK), whose order of tied probabilities is
    the runtime's."""
    k = probs.shape[1]
    if k > PAIRWISE_MAX_K:
        return torch.topk(probs, k, dim=1, largest=True, sorted=True)
    index = torch.arange(k, device=probs.device)
    before = (probs[:, :, None] > probs[:, None, :]) | (
        (probs[:, :, None] == probs[:, None, :]) & (index[:, None] < index[None, :])
    )
    rank = before.sum(dim=1)  # (N, K): the rank of each class, 0 for the most probable
    order = torch.zeros_like(rank).scatter(1, rank, index.expand_as(rank))  # the class at each rank
    return probs.gather(1, order), order


def conformity_scores_graph(
    probs: torch.Tensor, method: Method, u: torch.Tensor | None = None, *, k_reg: int = 0, penalty: float = 0.0
) -> torch.Tensor:
    """:func:`conformity_scores` for tracers (``torch.export``, ONNX): the same scores (:func:`ranked_scores`, its cap
    at 1 included), the order from :func:`sort_probabilities_graph`."""
    return _scores(probs, method, u, k_reg, penalty, graph=True)


def _scores(
    probs: torch.Tensor, method: Method, u: torch.Tensor | None, k_reg: int, penalty: float, graph: bool
) -> torch.Tensor:
    """:func:`conformity_scores` (``graph``: :func:`conformity_scores_graph`): the scores of the ranked classes put
    back in class order, by an in-place scatter or, for tracers, an out-of-place one."""
    if method == "thr":
        return torch.rsub(probs, 1.0)
    if method not in METHODS:
        raise ValueError(f"Expected argument `method` to be one of {list(METHODS)}, but got {method!r}.")
    ordered, order = sort_probabilities_graph(probs) if graph else sort_probabilities(probs)
    ranked = ranked_scores(ordered, u, k_reg=k_reg, penalty=penalty if method == "raps" else 0.0)
    if graph:
        return torch.zeros_like(ranked).scatter(1, order, ranked)
    return torch.empty_like(ranked).scatter_(1, order, ranked)


def sets_from_scores_graph(
    scores: torch.Tensor, q_hat: float | torch.Tensor, *, allow_empty: bool = False, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`sets_from_scores` without a branch on values, for tracers (``torch.export``, ONNX): the same sets."""
    sets = scores <= q_hat
    if allow_empty:
        return sets
    top = torch.arange(scores.shape[1], device=scores.device) == _top_class(scores, probs, keepdim=True)
    return sets | (top & ~sets.any(dim=1, keepdim=True))
