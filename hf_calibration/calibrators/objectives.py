"""Fit objectives for post-hoc calibrators: NLL, Brier, SoftECE and Charbonnier-SoftECE (SMART Table 3).

Each public function takes already temperature-scaled logits ``(N, K)`` and labels ``(N,)`` and is
differentiable in the logits. Inside, every objective is a function of four per-sample statistics
(``ScaledStats``), which is how the calibrators evaluate them from a ``LogPartitionTable`` during a fit
without materialising the (N, K) softmax at each step.

Soft binning (Karandikar et al. 2021; SMART Sec. 3.4, Eq. 5-6): ``B`` bins with centres
``c_b = (2b - 1) / (2B)``, membership ``w_ib = softmax_b(-(p_i - c_b)^2 / (2 sigma^2))``, per bin
``n_b = sum_i w_ib``, soft accuracy ``acc_b = sum_i w_ib a_i / n_b`` and confidence
``conf_b = sum_i w_ib p_i / n_b`` with the hard correctness ``a_i``, and

    SoftECE             = sum_b n_b / N * |acc_b - conf_b|
    Charbonnier-SoftECE = sum_b n_b / N * (sqrt((acc_b - conf_b)^2 + delta^2) - delta)

(the ``- delta`` makes a perfectly calibrated model score 0 and does not move the minimiser).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from hf_calibration._core.checks import check_float, check_int


class ScaledStats(NamedTuple):
    """Per-sample statistics of softmax(scaled logits) that every objective is a function of."""

    log_confidence: torch.Tensor  # (N,) log max_k p_k
    correct: torch.Tensor  # (N,) float in {0, 1}, [argmax == label]
    log_p_true: torch.Tensor  # (N,) log p_y
    sum_p_sq: torch.Tensor | None  # (N,) sum_k p_k^2 (only the Brier score needs it)


def scaled_stats(logits: torch.Tensor, labels: torch.Tensor) -> ScaledStats:
    """Exact ``ScaledStats`` of (already scaled) logits, computed in float64."""
    log_p = torch.log_softmax(logits.double(), dim=1)
    log_conf, pred = log_p.max(dim=1)
    labels = labels.long()
    return ScaledStats(
        log_conf,
        (pred == labels).double(),
        log_p.gather(1, labels[:, None])[:, 0],
        torch.exp(2 * log_p).sum(dim=1),
    )


def _nll(stats: ScaledStats) -> torch.Tensor:
    return -stats.log_p_true.mean()


def _brier(stats: ScaledStats) -> torch.Tensor:
    return (stats.sum_p_sq - 2 * torch.exp(stats.log_p_true) + 1).mean()


def _soft_bin_gaps(stats: ScaledStats, n_bins: int, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mass_b = n_b / N, gap_b = acc_b - conf_b) of the soft bins."""
    conf = torch.exp(stats.log_confidence)
    centres = (2 * torch.arange(1, n_bins + 1, dtype=conf.dtype, device=conf.device) - 1) / (2 * n_bins)
    w = torch.softmax(-((conf[:, None] - centres) ** 2) / (2 * sigma**2), dim=1)  # (N, B), rows sum to 1
    count = w.sum(dim=0)
    gap = (w * (stats.correct - conf)[:, None]).sum(dim=0) / count.clamp_min(torch.finfo(conf.dtype).tiny)
    return count / conf.shape[0], gap


def _soft_ece(stats: ScaledStats, n_bins: int = 15, sigma: float = 0.05) -> torch.Tensor:
    mass, gap = _soft_bin_gaps(stats, n_bins, sigma)
    return (mass * gap.abs()).sum()


def _charbonnier_soft_ece(
    stats: ScaledStats, n_bins: int = 15, sigma: float = 0.05, delta: float = 1e-3
) -> torch.Tensor:
    mass, gap = _soft_bin_gaps(stats, n_bins, sigma)
    return (mass * (torch.sqrt(gap**2 + delta**2) - delta)).sum()


OBJECTIVES: dict[str, Callable[..., torch.Tensor]] = {
    "nll": _nll,
    "brier": _brier,
    "soft_ece": _soft_ece,
    "charbonnier_soft_ece": _charbonnier_soft_ece,
}
_BINNED = ("soft_ece", "charbonnier_soft_ece")
SIGMA_MIN, SIGMA_MAX = 1e-150, 1e150


def objective_kwargs(objective: str, n_bins: int = 15, sigma: float = 0.05, delta: float = 1e-3) -> dict:
    """Validated keyword arguments the named objective takes."""
    if objective not in _BINNED:
        return {}
    # sigma is the soft bins' Gaussian width on confidences in [0, 1]; outside these bounds 1 / (2 sigma^2) is no
    # finite positive float (a ZeroDivisionError in the compiled step, an OverflowError in torch's)
    kw = {
        "n_bins": check_int(n_bins, "n_bins", minimum=1),
        "sigma": check_float(sigma, "sigma", minimum=SIGMA_MIN, maximum=SIGMA_MAX),
    }
    if objective == "charbonnier_soft_ece":
        kw["delta"] = check_float(delta, "delta", minimum=0)
    return kw


def get_objective(name: str) -> Callable[..., torch.Tensor]:
    """The objective ``f(stats, **kwargs)`` for a name in ``OBJECTIVES``."""
    if not isinstance(name, str) or name not in OBJECTIVES:
        raise ValueError(f"Expected argument `objective` to be one of {sorted(OBJECTIVES)}, but got {name!r}.")
    return OBJECTIVES[name]


def nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood ``-1/N sum_i log softmax(z_i)_{y_i}``."""
    return _nll(scaled_stats(logits, labels))


def brier(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Multiclass Brier score ``1/N sum_i sum_k (p_ik - [k = y_i])^2``."""
    return _brier(scaled_stats(logits, labels))


def soft_ece(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 15, sigma: float = 0.05) -> torch.Tensor:
    """Soft-binned ECE (SMART Eq. 5, discretised): Gaussian soft bins, hard correctness."""
    return _soft_ece(scaled_stats(logits, labels), **objective_kwargs("soft_ece", n_bins, sigma))


def charbonnier_soft_ece(
    logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 15, sigma: float = 0.05, delta: float = 1e-3
) -> torch.Tensor:
    """Charbonnier-SoftECE (SMART Eq. 6, discretised with 15 bins, sigma = 0.05, delta = 1e-3)."""
    return _charbonnier_soft_ece(
        scaled_stats(logits, labels), **objective_kwargs("charbonnier_soft_ece", n_bins, sigma, delta)
    )
