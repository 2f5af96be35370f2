"""Focal loss (Lin et al. 2017) and its sample-dependent schedule FLSD-53 (Mukhoti et al., NeurIPS 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_calibration._core.checks import check_float
from hf_calibration.losses._base import CalibrationLoss


def focal_per_sample(logits: torch.Tensor, labels: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """``-(1 - p_y)^γ · log p_y`` per sample; ``gamma`` is a float or a per-sample ``(N,)`` tensor.

    ``1 - p_y`` is computed as ``-expm1(log p_y)``, accurate when ``p_y`` is close to 1. Where ``p_y`` rounds
    to 1, ``(1 - p_y)^γ`` with 0 < γ < 1 has an infinite derivative, and autograd would multiply it by
    ``log p_y = 0`` (NaN); the loss's true gradient there tends to 0 (it is ``O((1 - p_y)^γ)``), and so it is
    computed: the power is taken only where ``1 - p_y > 0``.
    """
    log_p = F.log_softmax(logits, dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
    one_minus_p = -torch.expm1(log_p)
    if isinstance(gamma, torch.Tensor) or 0 < gamma < 1:
        positive = one_minus_p > 0
        modulating = torch.where(positive, torch.where(positive, one_minus_p, 1.0) ** gamma, 0.0)
    else:  # γ = 0 (torch's pow has a zero gradient there) or γ >= 1: finite derivative at 0
        modulating = one_minus_p**gamma
    return -modulating * log_p


class FocalLoss(CalibrationLoss):
    """Focal loss with a fixed γ: ``L_i = -(1 - p_{i,y_i})^γ · log p_{i,y_i}``. γ = 0 is cross-entropy.

    Args:
        gamma: focusing parameter γ >= 0 (default 3, the FL-3 baseline of Mukhoti et al.).

    Example:
        >>> import torch
        >>> loss = FocalLoss(gamma=2.0)
        >>> round(loss(torch.zeros(1, 2), torch.tensor([1])).item(), 4)  # (1/2)^2 · log 2
        0.1733
    """

    def __init__(self, gamma: float = 3.0, **kwargs):
        super().__init__(**kwargs)
        self.gamma = check_float(gamma, "gamma", minimum=0.0)

    def per_sample_loss(self, logits, labels, mask, features):
        return focal_per_sample(logits, labels, self.gamma)

    def _hparams(self):
        return {"gamma": self.gamma}


class FLSD53Loss(CalibrationLoss):
    """FLSD-53: focal loss whose γ depends on the sample's true-class probability.

    Schedule implemented (Mukhoti et al.'s ``FocalLossAdaptive`` with ``gamma=3``, whose table is
    ``{0.2: 5, 0.5: 3}`` and falls back to ``gamma`` above 0.5): γ_i = 5 if ``p_{i,y_i} < 0.2``, else 3
    (3 on [0.2, 0.5) and 3 on [0.5, 1]). The choice of γ uses the detached ``p_y`` (a step
    function has no gradient); the loss itself is differentiated through ``(1 - p_y)^γ`` as in
    the reference code.

    Example:
        >>> import torch
        >>> loss = FLSD53Loss()
        >>> round(loss(torch.zeros(1, 10), torch.tensor([0])).item(), 4)  # p_y = 0.1 < 0.2: 0.9^5 · log 10
        1.3597
    """

    threshold = 0.2
    gamma_low_confidence = 5.0
    gamma = 3.0

    def per_sample_loss(self, logits, labels, mask, features):
        with torch.no_grad():
            p_y = F.softmax(logits, dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
            gamma = torch.where(
                p_y < self.threshold,
                torch.full_like(p_y, self.gamma_low_confidence),
                torch.full_like(p_y, self.gamma),
            )
        return focal_per_sample(logits, labels, gamma)
