"""Margin-based label smoothing, MbLS (Liu et al., CVPR 2022; FeDLaS paper Eqs. 5-6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_calibration._core.checks import check_float
from hf_calibration.losses._base import CalibrationLoss
from hf_calibration.losses.cross_entropy import nll_per_sample


def margin_penalty_per_sample(logits: torch.Tensor, margin: float) -> torch.Tensor:
    """``R_i = mean_k relu(max_j z_ij - z_ik - m)``: the logit-gap penalty of Eq. 6, averaged over classes.

    The mean over k (not the sum of Eq. 6) follows the official MbLS code, so λ keeps its published meaning.
    """
    gaps = logits.max(dim=-1, keepdim=True).values - logits
    return F.relu(gaps - margin).mean(dim=-1)


class MbLSLoss(CalibrationLoss):
    """MbLS: ``L_i = CE_i + λ · mean_k relu(max_j z_ij - z_ik - m)``.

    Unlike the official code, samples with ``ignore_index`` labels are left out of the margin term too.

    Args:
        margin: allowed logit gap ``m`` (official default 10; FeDLaS uses 6 on CIFAR).
        lam: weight ``λ`` of the margin penalty (default 0.1).

    Example:
        >>> import torch
        >>> loss = MbLSLoss(margin=1.0, lam=0.5)
        >>> logits = torch.tensor([[3.0, 0.0]])  # CE = log(1 + e^-3); gaps (0, 3) → relu(gap - 1) = (0, 2)
        >>> round(loss(logits, torch.tensor([0])).item(), 4)  # 0.0486 + 0.5 * mean(0, 2)
        0.5486
    """

    def __init__(self, margin: float = 10.0, lam: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.margin = check_float(margin, "margin", minimum=0.0)
        self.lam = check_float(lam, "lam", minimum=0.0)

    def per_sample_loss(self, logits, labels, mask, features):
        nll = nll_per_sample(F.log_softmax(logits, dim=-1), labels)
        return nll + self.lam * margin_penalty_per_sample(logits, self.margin)

    def _hparams(self):
        return {"margin": self.margin, "lam": self.lam}
