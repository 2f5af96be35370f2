"""The fit loop's Adam against torch.optim.Adam, and its early stopping on a hand-made objective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration.calibrators._machinery.fitting.optim import adam_early_stopping


def _quartic(x: np.ndarray) -> tuple[float, np.ndarray]:
    """sum_i (x_i - i)^4 / 4 + x_0 x_1: curved and coupled, so Adam's per-coordinate scaling matters."""
    target = np.arange(x.shape[0], dtype=np.float64)
    d = x - target
    grad = d**3
    grad[0] += x[1]
    grad[1] += x[0]
    return float((d**4).sum() / 4 + x[0] * x[1]), grad


def test_adam_steps_are_torch_adams():
    x0 = np.random.default_rng(0).normal(size=6)
    result = adam_early_stopping(x0, _quartic, lr=0.05, max_steps=40, patience=1000, progress_bar=False)
    x = torch.tensor(x0, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.05)
    history = []
    for _ in range(40):
        loss, grad = _quartic(x.detach().numpy().copy())
        history.append(loss)
        x.grad = torch.from_numpy(grad)
        opt.step()
    history.append(_quartic(x.detach().numpy().copy())[0])
    np.testing.assert_allclose(result.history, history, rtol=1e-12)
    best = int(np.argmin(history))
    assert result.best_step == best and result.best == pytest.approx(history[best], rel=1e-12)
    assert result.steps == 40


def test_stops_after_patience_steps_without_improvement_and_returns_the_best_weights():
    values = iter([5.0, 3.0, 4.0, 4.0, 4.0, 1.0])  # improves at step 1, then stalls 3 steps

    def objective(x):
        return next(values), np.ones_like(x)

    result = adam_early_stopping(np.zeros(2), objective, lr=0.1, max_steps=100, patience=3, progress_bar=False)
    assert result.steps == 4 and result.best_step == 1 and result.best == 3.0
    np.testing.assert_allclose(result.x, [-0.1, -0.1])  # the first Adam step moves each entry by lr


def test_non_finite_objective_or_gradient_raises():
    with pytest.raises(FloatingPointError, match="non-finite"):
        adam_early_stopping(
            np.zeros(2), lambda x: (float("nan"), np.zeros(2)), lr=0.1, max_steps=5, patience=5, progress_bar=False
        )
    with pytest.raises(FloatingPointError, match="non-finite"):
        adam_early_stopping(
            np.zeros(2), lambda x: (1.0, np.array([0.0, np.inf])), lr=0.1, max_steps=5, patience=5, progress_bar=False
        )
