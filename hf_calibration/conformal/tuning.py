"""RAPS's ``k_reg`` and ``lambda`` chosen on a tuning split of the calibration data, as Angelopoulos et al. (2021) do
(their reference code's ``pick_kreg`` and ``pick_lamda_size``, with its 30 % tuning split).

* ``k_reg``: the (1 - alpha) quantile (the next-higher order statistic) of the 0-based rank of the true label, plus 1:
  the set size that top-k would need for 1 - alpha coverage, beyond which classes are penalised.
* ``lambda``: the value of ``LAMBDA_GRID`` whose RAPS sets are smallest on average, each calibrated and measured on the
  tuning split (ties keep the smaller lambda).

The conformal threshold is then computed on the rest of the calibration data, which the tuning never saw, so the
coverage guarantee holds as for fixed parameters.
"""

from __future__ import annotations

import numpy as np
import torch

from hf_calibration.conformal.quantile import quantile_rank
from hf_calibration.conformal.scores import label_ranks, rank_penalty, ranked_scores, sort_probabilities

LAMBDA_GRID: tuple[float, ...] = (0.001, 0.01, 0.1, 0.2, 0.5)  # the paper's grid for the size criterion


def choose_k_reg(probs: torch.Tensor, labels: torch.Tensor, alpha: float) -> int:
    """``k_reg`` from the ranks of the true labels: ``quantile(rank - 1, 1 - alpha, "higher") + 1``."""
    ranks = (label_ranks(probs, labels) - 1).cpu().numpy()
    return int(np.quantile(ranks, 1 - alpha, method="higher")) + 1


def choose_penalty(
    probs: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    k_reg: int,
    u_calibrate: torch.Tensor | None,
    u_predict: torch.Tensor | None,
    *,
    allow_empty: bool = False,
    grid: tuple[float, ...] = LAMBDA_GRID,
) -> tuple[float, dict[float, float]]:
    """``(lambda, {lambda: mean set size})``: the grid value with the smallest mean RAPS set on the tuning data.

    Every lambda is scored with the same uniform draws (``u_calibrate`` for the threshold, ``u_predict`` for the sets;
    None for non-randomised RAPS), so the comparison is not decided by noise. A tuning split too small for ``alpha``
    uses its largest score as the threshold.
    """
    n = probs.shape[0]
    k = min(quantile_rank(n, alpha), n)
    ordered, order = sort_probabilities(probs)  # one sort serves every lambda: the penalty only adds by rank
    label_rank = (order == labels[:, None]).int().argmax(dim=1)  # 0-based
    rows = torch.arange(n, device=probs.device)
    calibrate = ranked_scores(ordered, u_calibrate)[rows, label_rank]
    predict = ranked_scores(ordered, u_predict)
    sizes: dict[float, float] = {}
    for lam in grid:
        extra = rank_penalty(ordered.shape[1], k_reg, lam, dtype=ordered.dtype, device=ordered.device)
        q_hat = torch.kthvalue((calibrate + extra[label_rank]).cpu(), k).values.to(probs.device)
        size = ((predict + extra) <= q_hat).sum(dim=1)
        if not allow_empty:
            size = size.clamp_min(1)  # an empty set gets its top class
        sizes[lam] = float(size.double().mean())
    best = min(grid, key=lambda lam: (sizes[lam], grid.index(lam)))
    return best, sizes


def choose_k_reg_rows(ranks: np.ndarray, alpha: float) -> int:
    """``choose_k_reg`` from the 1-based ranks of the true labels (``_kernels.label_scores``)."""
    return int(np.quantile(np.asarray(ranks) - 1, 1 - alpha, method="higher")) + 1


def choose_penalty_rows(
    z: np.ndarray,
    rows: np.ndarray,
    labels: np.ndarray,
    alpha: float,
    k_reg: int,
    u_calibrate,
    u_predict,
    *,
    allow_empty: bool = False,
    from_probs: bool = False,
    grid: tuple[float, ...] = LAMBDA_GRID,
):
    """``choose_penalty`` on the rows ``rows`` of the logits ``z`` by the compiled kernels (no (N, K) array): the label
    scores and ranks once (the penalty only adds by rank), then each lambda's threshold and mean set size."""
    from hf_calibration.conformal._kernels import label_scores, set_rows

    n = rows.shape[0]
    k = min(quantile_rank(n, alpha), n)
    base, ranks = label_scores(z, labels, "aps", rows=rows, u=u_calibrate, from_probs=from_probs)
    sizes: dict[float, float] = {}
    for lam in grid:
        scores = base + lam * np.maximum(ranks.astype(np.float64) - k_reg, 0.0)
        q_hat = float(np.partition(scores, k - 1)[k - 1])
        _, size, _ = set_rows(
            z,
            "raps",
            q_hat,
            rows=rows,
            u=u_predict,
            k_reg=k_reg,
            penalty=lam,
            allow_empty=allow_empty,
            from_probs=from_probs,
            masks=False,
        )
        sizes[lam] = float(size.mean())
    best = min(grid, key=lambda lam: (sizes[lam], grid.index(lam)))
    return best, sizes
