"""Full-batch float64 fits of per-label logistic maps (Platt, temperature, beta): one LBFGS over every label at once.

Each label ``l`` has its own parameters and its own objective, the mean binary cross-entropy over its kept samples,
``mean_i [softplus(g_il) - t_il g_il]`` (``t`` the 0/1 label, or Platt's smoothed target). The labels' objectives share
no parameter, so the sum of them is minimised by each label's own optimum: one ``torch.optim.LBFGS`` (strong-Wolfe line
search) on the sum fits them all, one pass over the ``(N, L)`` logits per evaluation. A map shared by every label
minimises the mean over labels of those objectives (each label weighs the same, whatever its number of kept samples).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def platt_targets(y: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Platt (1999)'s smoothed targets, per label: ``(N_+ + 1) / (N_+ + 2)`` for a positive, ``1 / (N_- + 2)`` for a
    negative (as scikit-learn's ``CalibratedClassifierCV(method="sigmoid")``): the maximum a-posteriori estimate under a
    uniform prior, which keeps a separable label's fit finite."""
    positives = (y * mask).sum(axis=0)
    negatives = mask.sum(axis=0) - positives
    return np.where(y > 0.5, (positives + 1) / (positives + 2), 1 / (negatives + 2))


def minimise_bce(
    params: torch.Tensor,
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    targets: np.ndarray,
    mask: np.ndarray,
    *,
    shared: bool = False,
    max_iter: int = 200,
) -> tuple[torch.Tensor, float]:
    """Minimise the per-label mean binary cross-entropy of ``logits_fn(params)`` (an ``(N, L)`` tensor) against
    ``targets`` over the kept elements ``mask``: summed over labels, or averaged over them when ``shared``.
    Returns the fitted parameters (a detached float64 tensor) and the objective there."""
    t = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float64))
    kept = mask.sum(axis=0).astype(np.float64)
    weights = mask / np.maximum(kept, 1.0)
    if shared:
        weights = weights / mask.shape[1]
    w = torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float64))
    x = params.detach().clone().to(torch.float64).requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [x],
        lr=1.0,
        max_iter=max_iter,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=20,
    )

    def objective() -> torch.Tensor:
        g = logits_fn(x)
        return (w * (torch.nn.functional.softplus(g) - t * g)).sum()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        final = float(objective())
    return x.detach(), final
