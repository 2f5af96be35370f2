"""Ensemble temperature scaling (ETS; Zhang, Kailkhura, Han 2020, "Mix-n-Match", Sec. 3.1, Eq. 4).

The calibrated distribution is a mixture of three: the temperature-scaled softmax, the model's own softmax and
the uniform distribution,

    p(z) = w_1 softmax(z / T) + w_2 softmax(z) + w_3 / K,        w on the simplex (w_i >= 0, sum w = 1),

4 parameters. As in the paper's code, T is fitted first (temperature scaling under the fit objective), then the
weights for that T. The paper fits both by the mean squared error (the Brier score up to the factor K, so the
same minimiser): ``objective="brier"`` is the default, ``"nll"`` the alternative. Every component ranks the
classes as the logits do and the weights are non-negative, so the predicted class never changes.

Both fits use full-batch float64 LBFGS: over ``t = log T`` on the exact softmax (one compiled pass over the logits
per step), then over the weights ``w = softmax(v)``, whose objective needs only five numbers per sample (``p_y``
and ``sum_k p_k^2`` of both softmaxes and their overlap ``sum_k p_k q_k``), gathered in one more pass.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_int
from hf_calibration._core.threads import ThreadCountChooser, torch_single_threaded
from hf_calibration._core.vmath import exp_into
from hf_calibration.calibrators._machinery.base import Calibrator
from hf_calibration.calibrators._machinery.fitting.lbfgs import minimize
from hf_calibration.calibrators._machinery.fitting.partition import nll_derivatives
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators.temperature import T_MAX, T_MIN

LOG_T_RANGE = (
    math.log(T_MIN),
    math.log(T_MAX),
)  # the fitted temperature stays in [0.05, 100], as temperature scaling's


CHUNK_VALUES = 1 << 16  # values per parallel task of the kernels below (each row is independent: outputs are per row)


@numba.njit(cache=True, fastmath={"contract"})
def _gaps_and_exp(row, beta, gaps, out, arg, bits):  # pragma: no cover - compiled
    """``gaps = max(row) - row`` (float64, exact) and ``out = exp(-beta * gaps)``: ``softmax(beta row)`` unnormalised."""
    top = -np.inf
    for j in range(row.shape[0]):
        top = max(top, np.float64(row[j]))
    for j in range(row.shape[0]):
        gaps[j] = top - np.float64(row[j])
        arg[j] = -beta * gaps[j]
    exp_into(arg, out, bits)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _brier_rows(z, labels, beta, value, slope):  # pragma: no cover - compiled
    """Per row: the Brier score of ``softmax(beta z_i)`` and its derivative in ``beta`` (exact, float64).

    With ``d_j = z_max - z_j``, ``e_j = exp(-beta d_j)``, ``S = sum e``, ``S2 = sum e^2``:
    ``Brier = S2 / S^2 - 2 e_y / S + 1``; ``d/dbeta`` follows from ``dS = -sum d e``, ``dS2 = -2 sum d e^2``.
    """
    n, k = z.shape
    chunk = max(1, CHUNK_VALUES // k)
    for c in numba.prange((n + chunk - 1) // chunk):
        d, e, arg, bits = np.empty(k), np.empty(k), np.empty(k), np.empty(k)
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            _gaps_and_exp(z[i], beta, d, e, arg, bits)
            s1 = 0.0
            s2 = 0.0
            m1 = 0.0
            m2 = 0.0
            for j in range(k):
                s1 += e[j]
                s2 += e[j] * e[j]
                m1 += d[j] * e[j]
                m2 += d[j] * e[j] * e[j]
            y = labels[i]
            ey, dy = e[y], d[y]
            value[i] = s2 / (s1 * s1) - 2.0 * ey / s1 + 1.0
            slope[i] = (
                -2.0 * m2 / (s1 * s1) + 2.0 * s2 * m1 / (s1 * s1 * s1) + 2.0 * dy * ey / s1 - 2.0 * ey * m1 / (s1 * s1)
            )


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _mixture_rows(z, labels, inv_t, out):  # pragma: no cover - compiled
    """Per row, for ``p = softmax(z / T)`` and ``q = softmax(z)``: ``out[:, i] = (p_y, q_y, sum p^2, sum q^2, sum p q)``."""
    n, k = z.shape
    chunk = max(1, CHUNK_VALUES // k)
    for c in numba.prange((n + chunk - 1) // chunk):
        d, a, b, arg, bits = np.empty(k), np.empty(k), np.empty(k), np.empty(k), np.empty(k)
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            _gaps_and_exp(z[i], inv_t, d, a, arg, bits)
            _gaps_and_exp(z[i], 1.0, d, b, arg, bits)
            sa = 0.0
            sb = 0.0
            saa = 0.0
            sbb = 0.0
            sab = 0.0
            for j in range(k):
                sa += a[j]
                sb += b[j]
                saa += a[j] * a[j]
                sbb += b[j] * b[j]
                sab += a[j] * b[j]
            y = labels[i]
            out[0, i] = a[y] / sa
            out[1, i] = b[y] / sb
            out[2, i] = saa / (sa * sa)
            out[3, i] = sbb / (sb * sb)
            out[4, i] = sab / (sa * sb)


class _ScaledObjective(torch.autograd.Function):
    """Mean NLL or Brier score of ``softmax(beta z)`` for a scalar ``beta``: exact, one compiled pass over the logits."""

    @staticmethod
    def forward(ctx, beta, rows):
        value, slope = rows(float(beta))
        ctx.slope = slope
        return torch.tensor(value, dtype=torch.float64)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.slope, None


def _temperature_objective(rows, labels: np.ndarray, objective: str):
    """``t -> objective of softmax(z / exp(t))`` (t clamped to the temperature range), exact, differentiable; ``rows``
    a ``FitRows`` read a block at a time."""
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if objective == "nll":
        objective_at = lambda beta: nll_derivatives(rows, y, beta)[:2]  # noqa: E731 - temperature scaling's compiled pass
    else:
        value, slope = np.empty(len(y)), np.empty(len(y))
        step = ThreadCountChooser(_brier_rows)

        def objective_at(beta):
            for start, block in rows.blocks():
                stop = start + block.shape[0]
                step(block, y[start:stop], beta, value[start:stop], slope[start:stop])
            return float(value.mean()), float(slope.mean())

    return lambda t: _ScaledObjective.apply(torch.exp(-t.clamp(*LOG_T_RANGE))[0], objective_at)


def _mixture_statistics(rows, labels: np.ndarray, temperature: float) -> dict[str, torch.Tensor]:
    """Per sample, for ``p = softmax(z / T)`` and ``q = softmax(z)``: ``p_y``, ``q_y``, ``sum p^2``, ``sum q^2``,
    ``sum p q`` (all the mixture's NLL and Brier score need), in one compiled pass a block of rows at a time."""
    y = np.ascontiguousarray(labels, dtype=np.int64)
    out = np.empty((5, len(y)))
    step = ThreadCountChooser(_mixture_rows)
    for start, block in rows.blocks():
        stop = start + block.shape[0]
        part = np.empty((5, block.shape[0]))
        step(block, y[start:stop], 1.0 / temperature, part)
        out[:, start:stop] = part
    return dict(zip(("p_y", "q_y", "pp", "qq", "pq"), torch.from_numpy(out)))


def _weight_objective(stats: dict[str, torch.Tensor], k: int, objective: str):
    """``v -> objective of the mixture`` with weights ``w = softmax(v)`` (Eq. 4 with T fixed)."""
    p_y, q_y = stats["p_y"], stats["q_y"]
    if objective == "nll":
        return lambda v: -torch.log(_mix(torch.softmax(v, 0), p_y, q_y, k)).mean()
    pp, qq, pq = stats["pp"], stats["qq"], stats["pq"]

    def brier(v: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = torch.softmax(v, 0)
        # sum_k (w1 p_k + w2 q_k + w3 / K)^2, using sum_k p_k = sum_k q_k = 1
        square = w1 * w1 * pp + w2 * w2 * qq + 2 * w1 * w2 * pq + (2 * w3 * (w1 + w2) + w3 * w3) / k
        return (square - 2 * _mix((w1, w2, w3), p_y, q_y, k) + 1).mean()

    return brier


def _mix(w, p, q, k):
    return w[0] * p + w[1] * q + w[2] / k


@register_calibrator
class EnsembleTemperatureScaling(
    Calibrator,
    tags=["ensemble-temperature-scaling", "temperature-scaling"],
    paper_url="https://arxiv.org/abs/2003.07329",
):
    """ETS: ``w1 softmax(z / T) + w2 softmax(z) + w3 / K`` (4 parameters), fitted by the Brier score (the paper's MSE).

    Returns log-probabilities (the log of that mixture), so ``softmax`` of the output is the calibrated
    distribution and ``attach`` and pipelines work as for any calibrator. The predicted class never changes.
    Needs at least ``min_samples = 10`` labelled samples.

    Args:
        max_iter: LBFGS iterations at most, for each of the two fits.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import EnsembleTemperatureScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> ets = EnsembleTemperatureScaling().fit(logits, labels, progress_bar=False)
        >>> round(float(ets.weights.sum()), 6)
        1.0
    """

    kind = "ets"
    fits_in_blocks = True
    shift_invariant = True  # every component is a softmax of z or z / T
    paper_citation = (
        "J. Zhang, B. Kailkhura, T. Y.-J. Han, *Mix-n-Match: Ensemble and Compositional Methods for Uncertainty "
        "Calibration in Deep Learning*, ICML 2020"
    )
    min_samples = 10
    default_objective = "brier"
    objectives = ("brier", "nll")
    preserves_argmax = True

    def __init__(self, max_iter: int = 200):
        super().__init__()
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.log_temperature = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.weights = nn.Parameter(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))

    def _check_state(self, where: str) -> None:
        w = self.weights.detach().double()
        if not (bool((w >= 0).all()) and abs(float(w.sum()) - 1.0) <= 1e-9):
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: the mixture weights {w.tolist()} are not on the simplex."
            )
        t = float(self.log_temperature.detach())
        if not LOG_T_RANGE[0] <= t <= LOG_T_RANGE[1]:
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: T = {math.exp(t):.6g} lies outside [{T_MIN}, {T_MAX}]."
            )

    @property
    def fitted_temperature(self) -> float:
        """The temperature ``T`` of the first mixture component."""
        self._check_fitted()
        return float(self.log_temperature.detach().exp())

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = self.log_temperature.to(device=z.device, dtype=z.dtype).exp()
            log_w = torch.log(
                self.weights.to(device=z.device, dtype=z.dtype)
            )  # -inf for a zero weight: that term drops
            out = torch.logaddexp(log_w[0] + torch.log_softmax(z / t, dim=1), log_w[1] + torch.log_softmax(z, dim=1))
            return torch.logaddexp(out, log_w[2] - math.log(z.shape[1]))

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        k = rows.shape[1]
        # 1. the temperature: temperature scaling under the fit objective (the paper's first stage)
        first = minimize(
            _temperature_objective(rows, labels, objective),
            torch.zeros(1),
            max_iter=self.max_iter,
            progress_bar=progress_bar,
            desc="ETS temperature",
        )
        log_t = float(first.x[0].clamp(*LOG_T_RANGE))
        # 2. the mixture weights for that temperature, on the simplex through w = softmax(v)
        stats = _mixture_statistics(rows, labels, math.exp(log_t))
        second = minimize(
            _weight_objective(stats, k, objective),
            torch.zeros(3),
            max_iter=self.max_iter,
            progress_bar=progress_bar,
            desc="ETS weights",
        )
        with torch.no_grad():
            self.log_temperature.fill_(log_t)
            self.weights.copy_(torch.softmax(second.x, 0))
        return {
            "temperature": math.exp(log_t),
            "weights": [float(w) for w in self.weights.detach()],
            "steps": first.iterations + second.iterations,
            "best_objective": second.objective,
        }

    def _card_description(self) -> str:
        if not self.is_fitted:
            return "It mixes softmax(z / T), softmax(z) and the uniform distribution (ensemble temperature scaling, Zhang et al. 2020)."
        w = ", ".join(f"{float(v):.4f}" for v in self.weights.detach())
        return (
            f"It mixes softmax(z / T) with T = {self.fitted_temperature:.4f}, softmax(z) and the uniform distribution with "
            f"weights ({w}) (ensemble temperature scaling, Zhang et al. 2020)."
        )
