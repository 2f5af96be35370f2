"""Temperature scaling's Newton fit in ``beta = 1 / T``: its stopping rule, and its optimum against torch's LBFGS."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.calibrators.temperature import NEWTON_TOL, _newton_beta


def test_newton_stops_when_a_step_lands_on_the_optimum_to_rounding():
    # f'(b) = (b - c) + 1e-17: the optimum c - 1e-17 is not representable, so the step from 1.0 lands on c itself with a
    # slope of +1e-17, which closes the bracket from the right; the next Newton step rounds to no move. The loop once
    # rejected that step as "not inside the bracket" and bisected towards c for max_iter passes (20 passes of a
    # 15,000 x 21,843 fit); a 1e-17 step is converged.
    c = 1.2331362627073
    calls = []

    def derivatives(b):
        calls.append(b)
        return 0.5 * (b - c) ** 2, (b - c) + 1e-17, 1.0

    beta, _, evaluations = _newton_beta(derivatives, 1.0, NEWTON_TOL, 100)
    assert evaluations == 2 and len(calls) == 2
    assert beta == pytest.approx(c, rel=1e-15)


def test_newton_stops_when_bisection_closes_the_bracket():
    # no curvature anywhere: every step is a bisection (in log beta); the bracket's width ends it, not max_iter
    c = 3.0

    def derivatives(b):
        return abs(b - c), (1.0 if b > c else -1.0), 0.0

    beta, _, evaluations = _newton_beta(derivatives, 1.0, NEWTON_TOL, 1000)
    assert beta == pytest.approx(c, rel=NEWTON_TOL) and evaluations < 60  # log2(ln(400) / 1e-8) ~ 29 halvings


def _lbfgs_temperature(z: np.ndarray, y: np.ndarray) -> float:
    """The NLL minimised over ``log T`` by torch.optim.LBFGS (strong Wolfe), in float64."""
    logits, labels = torch.from_numpy(z).double(), torch.from_numpy(y)
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [t], lr=1.0, max_iter=200, tolerance_grad=1e-14, tolerance_change=1e-16, line_search_fn="strong_wolfe"
    )

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / t.exp(), labels)
        loss.backward()
        return loss

    opt.step(closure)
    return float(t.detach().exp())


@pytest.mark.parametrize(("n", "k", "seed"), [(600, 10, 0), (9000, 100, 1), (12000, 300, 2)])
def test_fitted_temperature_equals_torch_lbfgs_in_few_passes(n, k, seed):
    # N > 8,192 starts from a 4,096-row subsample's optimum; Newton converges quadratically from there. LBFGS's T is
    # exact to ~1e-8 (the NLL is flat to float64 rounding within sqrt(eps) of its minimum): 1e-7 is the agreement.
    z, y = overconfident(n, k, seed=seed)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    assert ts.fitted_temperature == pytest.approx(_lbfgs_temperature(z, y), rel=1e-7)
    assert ts.fit_info_["steps"] <= (4 if n > 8192 else 8)
    assert math.isfinite(ts.fit_info_["best_objective"])
