"""Label smoothing (Szegedy et al. 2016; FeDLaS paper Eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_calibration._core.checks import check_float
from hf_calibration.losses._base import CalibrationLoss
from hf_calibration.losses.cross_entropy import nll_per_sample


def label_smoothing_per_sample(
    log_probs: torch.Tensor, labels: torch.Tensor, alpha: float | torch.Tensor
) -> torch.Tensor:
    """``(1 - α)·CE_i + α·mean_k(-log p_ik)`` (FeDLaS Eq. 3); ``alpha`` is a float or a per-sample ``(N,)`` tensor (Eq. 4)."""
    nll = nll_per_sample(log_probs, labels)
    # (1 - α)·nll + α·uniform as nll + α·(uniform - nll), α = 0 giving nll bit for bit; written with
    # uniform - nll = -(mean_k log p_k + nll), the same numbers to the bit in one operation fewer
    return nll - alpha * (log_probs.mean(dim=-1) + nll)


class LabelSmoothingLoss(CalibrationLoss):
    """Label smoothing: cross-entropy against ``(1 - α)·onehot(y) + α/K``.

    ``L_i = (1 - α)·CE_i + α·mean_k(-log p_ik)`` (FeDLaS paper Eq. 3). α = 0 is cross-entropy.

    Args:
        alpha: smoothing factor in [0, 1]. Paper default 0.05 (0.1 on CIFAR-100).

    Example:
        >>> import torch
        >>> loss = LabelSmoothingLoss(alpha=0.1)
        >>> round(loss(torch.zeros(1, 4), torch.tensor([2])).item(), 4)  # uniform prediction: log 4
        1.3863
    """

    def __init__(self, alpha: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.alpha = check_float(alpha, "alpha", minimum=0.0, maximum=1.0)

    def per_sample_loss(self, logits, labels, mask, features):
        return label_smoothing_per_sample(F.log_softmax(logits, dim=-1), labels, self.alpha)

    def _hparams(self):
        return {"alpha": self.alpha}
