"""Temperature scaling (Guo et al. 2017): one temperature ``T = exp(t)`` for every sample, ``z -> z / T``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_float, check_int
from hf_calibration.calibrators._machinery.fitting.optim import adam_early_stopping
from hf_calibration.calibrators._machinery.fitting.partition import LogPartitionTable, nll_derivatives
from hf_calibration.calibrators._machinery.forward import apply as _apply
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.scaling import TemperatureCalibrator
from hf_calibration.calibrators.objectives import get_objective

T_MIN, T_MAX = 0.05, 100.0  # the fitted temperature is kept in this range (all-correct fit sets drive T to 0)
SUBSAMPLE_ROWS = 4096  # rows of the warm start's subsample
# relative error left in beta: Newton's error after a step of relative size s is of order s ** 2 (1.4 s ** 2 measured at
# 50,000 x 21,843). 1e-8 leaves the NLL within 0.5 f'' (1e-8 beta) ** 2 ~ 3e-16 of its minimum: its own float64 rounding
NEWTON_TOL = 1e-8
SUBSAMPLE_TOL = 1e-6  # the subsample's optimum is only a starting point (it differs from the full one by ~1e-2)


def _newton_beta(derivatives, beta: float, tol: float, max_iter: int) -> tuple[float, float, int]:
    """Safeguarded Newton on a convex function of ``beta`` in [1 / T_MAX, 1 / T_MIN]: ``derivatives(b)`` returns
    ``(f, f', f'')``. Returns ``(beta, f(beta), evaluations)``; ``f`` at the last step is the quadratic model's value
    (off by the cubic term, ~f''' s ** 3 / 6: 4e-14 at 15,000 x 21,843).

    Stops when the Newton step is below ``sqrt(tol) * beta`` (quadratic convergence leaves an error of order the
    step's square, ``tol``, after it: the step is taken, clipped to the bracket) or when the bracket is narrower than
    ``tol * beta`` (a bisection, or a Newton step that lands on the optimum to rounding and so closes the bracket
    from one side: the next step, aimed at that end, can only be rejected and bisected, so the step test alone never
    fires)."""
    low, high = 1.0 / T_MAX, 1.0 / T_MIN
    a, b = low, high  # the bracket: f' < 0 left of the optimum, > 0 right of it (f' increases)
    tried_low = tried_high = False
    beta = min(max(beta, low), high)
    step_tol = math.sqrt(tol)
    value = math.inf
    for evaluation in range(1, max_iter + 1):
        value, slope, curvature = derivatives(beta)
        tried_low, tried_high = tried_low or beta == low, tried_high or beta == high
        if slope < 0:
            a = beta
        elif slope > 0:
            b = beta
        else:
            return beta, value, evaluation
        if (slope < 0 and beta == high) or (slope > 0 and beta == low):
            return beta, value, evaluation  # the optimum lies beyond the temperature range: its end
        step = -slope / curvature if curvature > 0 and math.isfinite(curvature) else math.nan
        if math.isfinite(step) and abs(step) <= step_tol * beta:
            proposal = min(max(beta + step, a), b)
            step = proposal - beta
            return proposal, value + slope * step + 0.5 * curvature * step * step, evaluation
        if b - a <= tol * beta:
            return beta, value, evaluation
        proposal = beta + step
        if not (a < proposal < b):  # outside the bracket (or no curvature): try the range's end, else bisect
            if proposal >= b and b == high and not tried_high:
                proposal = high
            elif proposal <= a and a == low and not tried_low:
                proposal = low
            else:
                proposal = math.sqrt(a * b)
        beta = proposal
    return beta, value, max_iter


def _same_at_stored_precision(log_t: float, recorded: float) -> bool:
    """``log_t`` (as loaded, float64) is the log of the recorded temperature, as stored in float64 or rounded to a
    narrower float (a checkpoint whose weights were re-saved in float32 / bfloat16 / float16 is the same fit)."""
    if math.isclose(math.exp(log_t), recorded, rel_tol=1e-12):
        return True
    if not recorded > 0:
        return False
    exact = torch.tensor(math.log(recorded), dtype=torch.float64)
    return any(float(exact.to(dtype)) == log_t for dtype in (torch.float32, torch.bfloat16, torch.float16))


@register_calibrator
class TemperatureScaling(
    TemperatureCalibrator,
    tags=["temperature-scaling"],
    paper_url="https://arxiv.org/abs/1706.04599",
):
    """Temperature scaling: ``softmax(z / T)`` with a single ``T = exp(t)`` in [0.05, 100].

    ``fit(..., objective="nll")`` (the default) minimises the validation NLL over ``beta = 1 / T``, in which it is
    convex, by safeguarded Newton steps on the exact float64 softmax: one compiled pass over the logits gives the NLL
    and its first two derivatives, and two or three passes follow a warm start on a subsample, a block of rows at a
    time (no copy of the logits; from disk too, ``hf_calibration._core.disk_logits``). The other objectives (``"brier"``, ``"soft_ece"``, ``"charbonnier_soft_ece"``) use
    full-batch Adam with early stopping.
    Needs at least ``min_samples = 10`` labelled samples.

    Args:
        lr: Adam learning rate on ``t`` for the non-NLL objectives.
        max_steps: Adam steps at most.
        patience: early-stopping patience in Adam steps.
        max_iter: Newton steps at most (NLL).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import TemperatureScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> ts = TemperatureScaling().fit(logits, labels, progress_bar=False)
        >>> bool(torch.equal(ts(logits).argmax(1), logits.argmax(1)))
        True
    """

    kind = "temperature_scaling"
    fits_in_blocks = True
    min_samples = 10
    default_objective = "nll"
    paper_citation = (
        "C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, *On Calibration of Modern Neural Networks*, ICML 2017"
    )

    def __init__(self, lr: float = 0.01, max_steps: int = 2000, patience: int = 100, max_iter: int = 100):
        super().__init__()
        self.lr = check_float(lr, "lr", minimum=0, min_inclusive=False)
        self.max_steps = check_int(max_steps, "max_steps", minimum=1)
        self.patience = check_int(patience, "patience", minimum=1)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.log_temperature = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def _clamped(self) -> torch.Tensor:
        return self.log_temperature.clamp(math.log(T_MIN), math.log(T_MAX))

    def _check_state(self, where: str) -> None:
        t = float(self.log_temperature.detach())
        if not math.log(T_MIN) <= t <= math.log(T_MAX):
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: log_temperature = {t:.6g} lies outside "
                f"[log {T_MIN}, log {T_MAX}], the range a fit keeps it in (it would be clamped to T = {math.exp(min(max(t, math.log(T_MIN)), math.log(T_MAX))):.4g})."
            )
        recorded = (self.fit_info_ or {}).get("temperature")
        if isinstance(recorded, float) and not _same_at_stored_precision(t, recorded):
            raise ValueError(
                f"The calibrator weights {where!r} do not match their config: log_temperature gives T = {math.exp(t)!r}, "
                f"the fit record says T = {recorded!r} (one of the files was edited or replaced)."
            )

    def _temperature(self, z: torch.Tensor) -> torch.Tensor:
        return self._clamped().detach().exp().to(device=z.device, dtype=z.dtype)

    def _forward_cpu(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        return _apply.scale_rows(z, temperature=float(self._temperature(z)), out=out)

    @property
    def fitted_temperature(self) -> float:
        """The fitted temperature ``T`` as a float."""
        self._check_fitted()
        return float(self._clamped().detach().exp())

    def _card_temperature(self) -> str:
        return f"T = {self.fitted_temperature:.4f}" if self.is_fitted else "one temperature"

    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        with torch.no_grad():
            self.log_temperature.zero_()
        if objective == "nll":
            info = self._fit_nll_newton(rows, labels)
        else:
            table = LogPartitionTable.from_rows(rows, labels)
            fn = get_objective(objective)

            def loss_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
                t = torch.tensor(float(x[0]), dtype=torch.float64, requires_grad=True)
                beta = torch.exp(-t.clamp(math.log(T_MIN), math.log(T_MAX)))
                loss = fn(table.stats(beta, sum_p_sq=objective == "brier"), **kw)
                loss.backward()
                return float(loss.detach()), t.grad.numpy().reshape(1)

            result = adam_early_stopping(
                np.zeros(1),
                loss_and_grad,
                lr=self.lr,
                max_steps=self.max_steps,
                patience=self.patience,
                progress_bar=progress_bar,
                desc="TemperatureScaling",
            )
            with torch.no_grad():
                self.log_temperature.fill_(float(result.x[0]))
            self.history_ = result.history
            info = {"steps": result.steps, "best_step": result.best_step, "best_objective": result.best}
        with torch.no_grad():
            self.log_temperature.copy_(
                self._clamped()
            )  # store the T in use: a saved value outside the range is corruption
        t = float(self._clamped().detach().exp())
        if t <= T_MIN * (1 + 1e-6) or t >= T_MAX * (1 - 1e-6):
            self._warn_bound(t, labels, rows)
        info["temperature"] = t
        return info

    def _warn_bound(self, t: float, labels: np.ndarray, rows) -> None:
        from hf_calibration.calibrators._machinery.base import logger

        correct = all(
            bool((block.argmax(1) == labels[start : start + block.shape[0]]).all()) for start, block in rows.blocks()
        )
        reason = " (every fit sample is classified correctly)" if correct else ""
        logger.warning("The fitted temperature reached the bound T = %.4g%s.", t, reason)

    def _fit_nll_newton(self, rows, labels: np.ndarray) -> dict[str, Any]:
        """Minimise the NLL over ``beta = 1 / T`` by Newton's method: the NLL is convex in ``beta`` (a log-sum-exp of
        functions linear in it) and one pass gives it with its first two derivatives (``nll_derivatives``). Started at
        the optimum of an evenly spaced subsample (a few thousand rows, in memory), it needs two or three passes over
        all the rows (two at 15,000 and 50,000 x 21,843); a step that leaves the bracket the derivative's sign has
        built is replaced by a bisection (in ``log beta``), so it converges from anywhere in [1 / T_MAX, 1 / T_MIN]."""
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        n, k = rows.shape
        beta = 1.0
        passes = 0
        if n > 2 * SUBSAMPLE_ROWS:
            index = np.linspace(0, n - 1, SUBSAMPLE_ROWS).round().astype(np.int64)
            sample, sample_labels = rows.rows(index), labels[index]
            beta, _, _ = _newton_beta(
                lambda b: nll_derivatives(sample, sample_labels, b), 1.0, SUBSAMPLE_TOL, self.max_iter
            )
        beta, final, passes = _newton_beta(lambda b: nll_derivatives(rows, labels, b), beta, NEWTON_TOL, self.max_iter)
        with torch.no_grad():
            self.log_temperature.fill_(-math.log(beta))
        return {"steps": passes, "best_objective": final}


def nll_temperature(rows, labels: np.ndarray) -> float:
    """Temperature scaling's T fitted by NLL on prepared fit inputs (an array, or rows read in blocks), the fit alone
    (no fit-set report, no minimum size): the first stage of vector, matrix and structured scaling."""
    ts = TemperatureScaling()
    fit = ts._fit_rows if hasattr(rows, "blocks") else ts._fit
    return fit(rows, labels, "nll", {}, False)["temperature"]
