"""Training losses of sigmoid heads (binary and multi-label): binary cross-entropy, focal loss on sigmoids, label
smoothing of the binary targets, and the asymmetric loss.

Every label of every sample is one binary problem with logit ``z`` and target ``t`` in [0, 1] (0/1 labels; soft
targets such as Mixup's are allowed), ``p = sigmoid(z)``. The losses are per element and reduced as transformers
reduces its own ``BCEWithLogitsLoss``: the mean over the kept elements, or ``sum / num_items_in_batch`` when the
Trainer gives it (it counts the label entries that are not -100, so gradient accumulation stays exact). Targets equal
to ``ignore_index`` (-100) are left out element by element.

Inputs: ``(N, L)`` logits with ``(N, L)`` targets (multi-label), or ``(N,)`` / ``(N, 1)`` logits with ``(N,)`` targets
(a binary head with one logit).

The softmax losses (cross-entropy, LS, focal, FLSD-53, MbLS, FeDLaS) refuse ``(N, L)`` targets with a message that
names ``problem_type`` and these classes. MbLS and FeDLaS have no sigmoid counterpart: both are defined by their papers
on the softmax (MbLS on the gaps to the largest logit, FeDLaS on a softmax gate over the logits).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hf_calibration._core.checks import check_float
from hf_calibration.losses._base import CalibrationLoss, _Batch, _count, _denominator, _upcast

__all__ = ["AsymmetricLoss", "BinaryCrossEntropyLoss", "BinaryLabelSmoothingLoss", "SigmoidFocalLoss", "SigmoidLoss"]


class SigmoidLoss(CalibrationLoss):
    """Base of the sigmoid-head losses: (N, L) or (N,) targets in [0, 1], masked and reduced element by element.
    Subclasses implement ``per_element_loss(logits, targets)`` on float tensors of one shape."""

    sigmoid_head = True

    def _format(self, logits: Any, labels: Any, num_items_in_batch: Any = None) -> _Batch:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"Expected argument `logits` to be a torch.Tensor, but got {type(logits).__name__}.")
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"Expected argument `labels` to be a torch.Tensor, but got {type(labels).__name__}.")
        if not logits.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating tensor, but got {logits.dtype}.")
        if logits.ndim == 2 and logits.shape[1] == 1 and labels.ndim == 1:
            logits = logits[:, 0]
        if labels.ndim == 2 and labels.shape[1] == 1 and logits.ndim == 1:
            labels = labels[:, 0]
        if logits.ndim not in (1, 2) or logits.shape != labels.shape:
            raise ValueError(
                f"Expected `logits` and `labels` of one shape, (N, L) for a multi-label head or (N,) for a binary one, but got "
                f"{tuple(logits.shape)} and {tuple(labels.shape)}. Integer class indices (N,) with (N, K) logits belong to a "
                "softmax head (config.problem_type='single_label_classification'): train it with CrossEntropyLoss, "
                "FocalLoss, LabelSmoothingLoss, ..."
            )
        if logits.shape[0] == 0:
            raise ValueError(f"Expected `logits` to be non-empty, but got shape {tuple(logits.shape)}.")
        if labels.is_complex():
            raise TypeError(f"Expected `labels` to hold 0/1 (or [0, 1]) targets, but got {labels.dtype}.")
        count = _count(num_items_in_batch)
        logits = _upcast(logits)
        raw = labels.to(device=logits.device)
        mask = raw != self.ignore_index
        targets = torch.where(mask, raw.to(logits.dtype), torch.zeros((), dtype=logits.dtype, device=logits.device))
        return _Batch(logits, targets, mask, _denominator(mask, count, logits.dtype), raw, count)

    def _validate(self, batch: _Batch, extra: torch.Tensor | None = None) -> bool:
        count = batch.count
        if count is not None and not isinstance(count, torch.Tensor):
            self._check_count(float(count), batch.mask)
        if not self.validate_args:
            return False
        t = batch.labels
        outside = ~((t >= 0) & (t <= 1))  # NaN fails both comparisons: a NaN label is refused, not a NaN loss
        bad = outside.any()
        values = [bad] + ([count] if isinstance(count, torch.Tensor) else [])
        host = torch.stack([v.to(device=t.device, dtype=torch.float64) for v in values]).tolist()
        if host[0]:
            found = batch.raw_labels[batch.mask][outside[batch.mask]][0]
            raise ValueError(
                f"Expected `labels` to hold targets in [0, 1] (0/1 labels; or {self.ignore_index}, ignored) for a "
                f"sigmoid head, but found {float(found)!r}."
            )
        if isinstance(count, torch.Tensor):
            self._check_count(host[1], batch.mask)
        return False

    def _format_features(self, features: Any, n: int) -> None:  # a sigmoid loss reads no features
        return None

    def _batch_loss(self, batch: _Batch, features: None) -> torch.Tensor:
        """The loss of a formatted, checked ``batch``: the per-element losses summed over its kept entries, divided by
        their count (or ``num_items_in_batch``)."""
        return torch.where(batch.mask, self.per_element_loss(batch.logits, batch.labels), 0.0).sum() / batch.denom

    def per_element_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class BinaryCrossEntropyLoss(SigmoidLoss):
    """Binary cross-entropy with logits, ``softplus(z) - t z`` per element (transformers' multi-label loss).

    Example:
        >>> import torch
        >>> loss = BinaryCrossEntropyLoss()
        >>> round(loss(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])).item(), 4)  # log 2 for each label
        0.6931
    """

    def per_element_loss(self, logits, targets):
        return F.softplus(logits) - targets * logits


class BinaryLabelSmoothingLoss(SigmoidLoss):
    """Binary cross-entropy against label-smoothed targets ``t (1 - α) + α / 2``: each label's target moves towards
    1/2, the uniform distribution of its two outcomes (label smoothing of Szegedy et al. 2016 applied to every sigmoid;
    the smoothing of binary targets in Müller et al. 2019's analysis).

    Args:
        alpha: smoothing factor in [0, 1] (default 0.1).

    Example:
        >>> import torch
        >>> loss = BinaryLabelSmoothingLoss(alpha=0.2)  # target 1 -> 0.9
        >>> round(loss(torch.tensor([[2.0]]), torch.tensor([[1.0]])).item(), 4)  # softplus(2) - 0.9 * 2
        0.3269
    """

    def __init__(self, alpha: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.alpha = check_float(alpha, "alpha", minimum=0.0, maximum=1.0)

    def per_element_loss(self, logits, targets):
        smoothed = targets * (1.0 - self.alpha) + self.alpha / 2
        return F.softplus(logits) - smoothed * logits

    def _hparams(self):
        return {"alpha": self.alpha}


class SigmoidFocalLoss(SigmoidLoss):
    """Focal loss on sigmoids (Lin et al. 2017, eq. 5): ``-α_t (1 - p_t)^γ log p_t`` per element, ``p_t = p`` for a
    positive and ``1 - p`` for a negative; ``α_t = α`` for a positive, ``1 - α`` for a negative, or 1 with ``alpha=None``
    (the default: calibration work, Mukhoti et al. 2020, uses the unweighted form). The same numbers as
    ``torchvision.ops.sigmoid_focal_loss`` (whose ``alpha=-1`` is our None). γ = 0, α = None is binary cross-entropy.

    Args:
        gamma: focusing parameter γ >= 0 (default 2, Lin et al.).
        alpha: class weight α in [0, 1] of the positives, or None (default).

    Example:
        >>> import torch
        >>> loss = SigmoidFocalLoss(gamma=2.0)
        >>> round(loss(torch.zeros(1, 1), torch.ones(1, 1)).item(), 4)  # (1/2)^2 log 2
        0.1733
    """

    def __init__(self, gamma: float = 2.0, alpha: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.gamma = check_float(gamma, "gamma", minimum=0.0)
        self.alpha = None if alpha is None else check_float(alpha, "alpha", minimum=0.0, maximum=1.0)

    def per_element_loss(self, logits, targets):
        ce = F.softplus(logits) - targets * logits  # -log p_t, exact for soft targets too
        p = torch.sigmoid(logits)
        one_minus_pt = p + targets - 2 * p * targets  # 1 - p_t = p (negative) or 1 - p (positive)
        loss = ce * one_minus_pt.clamp_min(0.0) ** self.gamma if self.gamma else ce
        if self.alpha is not None:
            loss = loss * (self.alpha * targets + (1 - self.alpha) * (1 - targets))
        return loss

    def _hparams(self):
        return {"gamma": self.gamma, "alpha": self.alpha}


class AsymmetricLoss(SigmoidLoss):
    """Asymmetric loss (Ridnik et al., ICCV 2021, eqs. 4-6), the standard loss of multi-label tagging::

        L+ = (1 - p)^γ+ log p,     L- = p_m^γ- log(1 - p_m),     p_m = max(p - m, 0)
        loss = -t L+ - (1 - t) L-

    Easy negatives are down-weighted (γ- > γ+) and very easy ones, ``p < m``, discarded (the probability shift ``m``,
    the reference code's ``clip``). As in the reference implementation the logarithms are clamped at ``eps`` and the
    focusing weights are differentiated (their ``disable_torch_grad_focal_loss=False``).

    Args:
        gamma_pos: γ+ (default 0); gamma_neg: γ- (default 4); clip: the shift m in [0, 1) (default 0.05);
        eps: the clamp of the logarithms' arguments (default 1e-8).

    Example:
        >>> import torch
        >>> loss = AsymmetricLoss()
        >>> round(loss(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])).item(), 4)  # (log 2 + 0.45^4 * -log 0.55) / 2
        0.3588
    """

    def __init__(self, gamma_pos: float = 0.0, gamma_neg: float = 4.0, clip: float = 0.05, eps: float = 1e-8, **kwargs):
        super().__init__(**kwargs)
        self.gamma_pos = check_float(gamma_pos, "gamma_pos", minimum=0.0)
        self.gamma_neg = check_float(gamma_neg, "gamma_neg", minimum=0.0)
        self.clip = check_float(clip, "clip", minimum=0.0, maximum=1.0, max_inclusive=False)
        self.eps = check_float(eps, "eps", minimum=0.0, min_inclusive=False, maximum=0.5)

    def per_element_loss(self, logits, targets):
        p = torch.sigmoid(logits)
        q = 1.0 - p
        if self.clip > 0:
            q = (q + self.clip).clamp(max=1.0)  # 1 - p_m
        positive = targets * torch.log(p.clamp(min=self.eps))
        negative = (1.0 - targets) * torch.log(q.clamp(min=self.eps))
        loss = positive + negative
        if self.gamma_pos > 0 or self.gamma_neg > 0:
            pt = p * targets + q * (1.0 - targets)
            gamma = self.gamma_pos * targets + self.gamma_neg * (1.0 - targets)
            loss = loss * torch.pow((1.0 - pt).clamp_min(0.0), gamma)
        return -loss

    def _hparams(self):
        return {"gamma_pos": self.gamma_pos, "gamma_neg": self.gamma_neg, "clip": self.clip}
