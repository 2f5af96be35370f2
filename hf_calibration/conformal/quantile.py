"""The split-conformal threshold: the ceil((n + 1)(1 - alpha))-th smallest of n calibration scores.

With ``n`` calibration scores exchangeable with a new sample's, ``P(s_new <= q_hat) >= 1 - alpha`` for ``q_hat`` the
``k``-th smallest score, ``k = ceil((n + 1)(1 - alpha))`` (Vovk et al. 2005; Angelopoulos et al. 2021, Algorithm 2:
"the ceil((1 - alpha)(1 + n)) largest value", counted from the bottom), and ``<= 1 - alpha + 1 / (n + 1)`` when the
scores have no ties. When ``k > n`` no finite threshold has that guarantee: every set would be every class.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from hf_calibration._core.checks import check_float


def check_alpha(alpha) -> float:
    """``alpha`` as a float in (0, 1), else ``TypeError`` / ``ValueError`` naming the argument."""
    return check_float(alpha, "alpha", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)


def quantile_rank(n: int, alpha: float) -> int:
    """``k = ceil((n + 1)(1 - alpha))``, computed exactly on the decimal ``alpha`` prints as (0.7 is 7/10): in floats
    ``10 * (1 - 0.7)`` is 3.0000000000000004, whose ceiling would be 4 (and ``100 * (1 - 0.45)`` gives 56 for 55)."""
    return math.ceil((n + 1) * (1 - Fraction(repr(float(alpha)))))


def min_samples(alpha: float) -> int:
    """The fewest calibration samples for which ``k <= n``: ``ceil(1 / alpha) - 1`` (19 at alpha = 0.05)."""
    n = max(1, math.ceil(1 / Fraction(repr(float(alpha)))) - 1)
    while quantile_rank(n, alpha) > n:
        n += 1
    return n


def check_enough_samples(n: int, alpha: float, where: str = "calibration samples") -> int:
    """``k`` for ``n`` samples, or a ``ValueError`` saying that ``alpha`` needs more of them."""
    k = quantile_rank(n, alpha)
    if k > n:
        raise ValueError(
            f"Expected argument `alpha` >= 1/(n+1) = {1 / (n + 1):.4g} for n = {n} {where}, but got alpha = {alpha}: "
            f"ceil((n+1)(1-alpha)) = {k} > n, so no threshold has the guarantee and every set would hold every class. "
            f"Use at least {min_samples(alpha)} samples or a larger alpha."
        )
    return k


def conformal_quantile(scores: torch.Tensor, alpha: float) -> float:
    """``q_hat``: the ``ceil((n + 1)(1 - alpha))``-th smallest of the (n,) ``scores`` (``ValueError`` when ``k > n``)."""
    alpha = check_alpha(alpha)
    k = check_enough_samples(int(scores.shape[0]), alpha)
    return float(torch.kthvalue(scores.detach().double().cpu(), k).values)
