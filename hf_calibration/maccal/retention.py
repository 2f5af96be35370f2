"""MaC-Cal's adaptive retention (Eqs. 12–13; the printed equations were lost, so this rule is ours).

After epoch ``t`` with training accuracy ``acc_t`` and mean top-label confidence ``conf_t`` (both measured
on the masked forward passes of that epoch)::

    τ_t     = clip_bound · exp(-clip_decay · t / epochs)              # decaying clip bound
    ρ_{t+1} = clamp(ρ_t + clip(step · (conf_t − κ·acc_t), −τ_t, τ_t), rho_min, rho_max)

so an over-confident head (``conf > κ·acc``) gets a higher retention (fewer masked weights) and an
under-confident one a lower retention. κ < 1 discounts the optimistic training accuracy.

The direction was chosen by measurement (``benchmarks/maccal.py``, CIFAR-10 ResNet-18, 3 seeds):
with masked weights rescaled by ``1/ρ`` during training, more masking made the full-weight head
*more* over-confident on the test set (fixed ρ = 0.9: ECE 5.76 %, ρ = 1: 5.32 %), and the opposite
rule (over-confident → lower ρ) drove ρ to its floor and gave ECE 6.00 %, worse than fixed ρ; the
rule above gave 5.40 % at equal accuracy. Measured again on CIFAR-10 over-confident CE models with the current
defaults (``benchmarks/training_cifar.py --explore-maccal``, 3 seeds, validation ECE): the opposite rule 7.29 %
against 1.97 % for this one (both from ρ₀ = 0.9).
"""

from __future__ import annotations

import math

from hf_calibration._core.checks import check_float, check_int
from hf_calibration.maccal.config import MaCCalConfig

__all__ = ["clip_bound", "update_retention"]


def clip_bound(epoch: int, config: MaCCalConfig) -> float:
    """``τ_t = τ₀ · exp(−γ · t / T)`` for epoch ``t`` (0-based) of ``T = config.epochs``."""
    check_int(epoch, "epoch", minimum=0)
    return config.clip_bound * math.exp(-config.clip_decay * epoch / config.epochs)


def update_retention(rho: float, accuracy: float, confidence: float, epoch: int, config: MaCCalConfig) -> float:
    """One adaptive step: ``clamp(ρ + clip(step·(conf − κ·acc), ±τ_t), rho_min, rho_max)``.

    Over-confident (``conf > κ·acc``) → ρ goes up (fewer weights masked); under-confident → down.
    """
    rho = check_float(rho, "rho", minimum=0.0, maximum=1.0, min_inclusive=False)
    accuracy = check_float(accuracy, "accuracy", minimum=0.0, maximum=1.0)
    confidence = check_float(confidence, "confidence", minimum=0.0, maximum=1.0)
    tau = clip_bound(epoch, config)
    delta = min(max(config.step * (confidence - config.kappa * accuracy), -tau), tau)
    return min(max(rho + delta, config.rho_min), config.rho_max)
