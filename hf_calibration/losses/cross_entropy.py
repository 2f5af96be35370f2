"""Plain cross-entropy in the `CalibrationLoss` contract (the baseline every benchmark compares to)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_calibration.losses._base import CalibrationLoss


def nll_per_sample(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``-log p_{i, y_i}`` for each row; ``labels`` must already be valid indices (ignored rows replaced)."""
    return F.nll_loss(log_probs, labels, reduction="none")


class CrossEntropyLoss(CalibrationLoss):
    """``CE_i = -log softmax(z_i)_{y_i}``, reduced like transformers' ``fixed_cross_entropy``.

    Example:
        >>> import torch
        >>> loss = CrossEntropyLoss()
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
        >>> round(loss(logits, torch.tensor([0, -100])).item(), 4)  # log(1 + e^-2)
        0.1269
    """

    def per_sample_loss(self, logits, labels, mask, features):
        return nll_per_sample(F.log_softmax(logits, dim=-1), labels)
