"""Ensemble temperature scaling (Zhang et al. 2020): the fit against an independent implementation of the paper's
Eq. 4 and fitting procedure (scipy: L-BFGS-B for T, SLSQP on the simplex for the weights), and the degenerate
case w = (1, 0, 0) = temperature scaling."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch
from _calibrator_data import overconfident
from scipy.special import log_softmax, softmax

from hf_calibration.calibrators import EnsembleTemperatureScaling, TemperatureScaling


def _paper_ets(logits, labels, loss):
    """Mix-n-Match's ETS fit from its equations: T minimising the loss of softmax(z / T) (bounded), then the
    simplex weights of w1 softmax(z / T) + w2 softmax(z) + w3 / K minimising the same loss, started at (1, 0, 0)."""
    z = logits.astype(np.float64)
    n, k = z.shape
    onehot = np.eye(k)[labels]

    def loss_of(p):
        if loss == "mse":
            return np.mean(np.sum((p - onehot) ** 2, axis=1))  # the paper's MSE, summed over classes (the Brier score)
        return -np.mean(np.log(p[np.arange(n), labels]))

    def t_loss(t):
        if loss == "mse":
            return loss_of(softmax(z / t[0], axis=1))
        return -np.mean(log_softmax(z / t[0], axis=1)[np.arange(n), labels])

    t = scipy.optimize.minimize(
        t_loss, [1.0], method="L-BFGS-B", bounds=[(0.05, 100.0)], options={"ftol": 1e-15, "gtol": 1e-12}
    ).x[0]
    p_t, p_1, p_u = softmax(z / t, axis=1), softmax(z, axis=1), np.full((n, k), 1.0 / k)
    w = scipy.optimize.minimize(
        lambda w: loss_of(w[0] * p_t + w[1] * p_1 + w[2] * p_u),
        [1.0, 0.0, 0.0],
        method="SLSQP",
        bounds=[(0.0, 1.0)] * 3,
        constraints={"type": "eq", "fun": lambda w: np.sum(w) - 1},
        options={"ftol": 1e-15, "maxiter": 1000},
    ).x
    return t, w, loss_of(w[0] * p_t + w[1] * p_1 + w[2] * p_u)


def _miscalibrated(n=1500, k=6, seed=0):
    """Over-confident logits whose errors are partly uniform noise: all three mixture terms have a job."""
    z, y = overconfident(n, k, seed=seed, scale=4.0)
    rng = np.random.default_rng(seed)
    flip = rng.random(n) < 0.1
    y = np.where(flip, rng.integers(0, k, n), y)
    return z, y


@pytest.mark.parametrize("objective, loss", [("brier", "mse"), ("nll", "ce")])
def test_fit_matches_the_papers_procedure(objective, loss):
    z, y = _miscalibrated()
    t_ref, w_ref, value_ref = _paper_ets(z, y, loss)
    ets = EnsembleTemperatureScaling().fit(z, y, objective=objective, progress_bar=False)
    assert ets.fitted_temperature == pytest.approx(t_ref, rel=1e-4)
    np.testing.assert_allclose(ets.weights.detach().numpy(), w_ref, atol=2e-3)
    assert ets.fit_info_["best_objective"] == pytest.approx(value_ref, rel=1e-6)
    # and the forward is the mixture's log-probabilities
    zt = torch.from_numpy(z).double()
    w = ets.weights.detach()
    mixture = w[0] * torch.softmax(zt / ets.fitted_temperature, 1) + w[1] * torch.softmax(zt, 1) + w[2] / z.shape[1]
    torch.testing.assert_close(ets.predict_proba(zt), mixture, rtol=1e-10, atol=1e-14)


def test_weight_one_on_the_temperature_term_is_temperature_scaling():
    z, y = overconfident(500, 5, seed=1)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    ets = EnsembleTemperatureScaling().fit(z, y, objective="nll", progress_bar=False)
    with torch.no_grad():
        ets.log_temperature.fill_(float(ts.log_temperature))
        ets.weights.copy_(torch.tensor([1.0, 0.0, 0.0]))
    zt = torch.from_numpy(z).double()
    torch.testing.assert_close(ets.predict_proba(zt), ts.predict_proba(zt), rtol=0, atol=1e-14)
    # and the NLL temperature of ETS's first stage is temperature scaling's
    fitted = EnsembleTemperatureScaling().fit(z, y, objective="nll", progress_bar=False)
    assert fitted.fitted_temperature == pytest.approx(ts.fitted_temperature, rel=1e-6)


def test_keeps_the_argmax_and_returns_finite_log_probabilities():
    z, y = _miscalibrated(seed=2)
    ets = EnsembleTemperatureScaling().fit(z, y, progress_bar=False)
    assert ets.preserves_argmax
    g = torch.Generator().manual_seed(0)
    zz = torch.randn(3000, 6, generator=g) * 30  # softmax underflows: the log of the mixture must not
    out = ets(zz)
    assert torch.isfinite(out).all() and torch.equal(out.argmax(1), zz.argmax(1))
    assert float(ets.weights.detach().sum()) == pytest.approx(1.0, abs=1e-12) and bool((ets.weights >= 0).all())
    assert "T = " in ets._card_description() and "uniform" in ets._card_description()


def test_rejects_objectives_it_does_not_fit():
    z, y = overconfident(100, 4)
    with pytest.raises(ValueError, match="objective"):
        EnsembleTemperatureScaling().fit(z, y, objective="soft_ece")


def test_card_says_predictions_never_change(tmp_path):
    z, y = overconfident(300, 5, seed=2)
    ets = EnsembleTemperatureScaling().fit(z, y, progress_bar=False)
    ets.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "The predicted class never changes" in card and f"T = {ets.fitted_temperature:.4f}" in card
