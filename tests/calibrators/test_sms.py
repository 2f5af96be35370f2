"""Structured matrix scaling (Berta et al. 2026): the fit against a scipy minimisation of the same objective, the
authors' probmetrics 1.3 (when installed) on the same objective, the identity it falls back to (the shared real logits:
``test_structured.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import fit_structured_reference, probmetrics_fit, smoothed_temperature_features
from _calibrator_data import overconfident

from hf_calibration.calibrators import StructuredMatrixScaling, create_calibrator, list_calibrators


def _nll(cal, z, y) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(cal(torch.from_numpy(z)).double(), torch.from_numpy(y)))


@pytest.mark.parametrize("lambdas", [(1.0, 1.0, 1.0), (0.1, 3.0, 0.02)])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(lambdas):
    z, y = overconfident(300, 4, seed=5)
    z = z * np.array([0.7, 1.0, 1.5, 1.2], dtype=np.float32)  # per-class sharpness: something for W to correct
    n, k = z.shape
    li, ld, lo = lambdas
    sms = StructuredMatrixScaling(
        lambda_intercept=li, lambda_diagonal=ld, lambda_off_diagonal=lo, tol=1e-14, max_iter=5000
    )
    sms.fit(z, y, progress_bar=False)
    features, t, eps = smoothed_temperature_features(z, y)
    assert sms.fit_info_["temperature"] == pytest.approx(t, rel=1e-6)
    assert float(sms.smoothing) == pytest.approx(eps) == pytest.approx(1 / 301)
    # the paper's penalty scaling: lambda K / N for the intercept and the diagonal, lambda K (K - 1) / N off it
    weights = (lo * k * (k - 1) / n, ld * k / n, li * k / n)
    assert (
        sms.fit_info_["reg_off_diagonal"],
        sms.fit_info_["reg_diagonal"],
        sms.fit_info_["reg_intercept"],
    ) == pytest.approx(weights)
    _, ref_objective, ref_nll = fit_structured_reference(features, y, False, *weights)
    assert sms.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-7)
    assert sms.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    expected = torch.from_numpy(features) @ sms.weight.detach().T + sms.bias.detach()
    torch.testing.assert_close(sms(torch.from_numpy(z).double()), expected, rtol=0, atol=1e-6)


def test_registered_and_identity_under_overwhelming_penalties():
    assert "sms" in list_calibrators() and type(create_calibrator("sms")) is StructuredMatrixScaling
    z, y = overconfident(400, 5, seed=2)
    sms = StructuredMatrixScaling(lambda_intercept=1e9, lambda_diagonal=1e9, lambda_off_diagonal=1e9).fit(
        z, y, progress_bar=False
    )
    torch.testing.assert_close(sms.weight.detach(), torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-6)
    # W = I, b = 0: temperature scaling, mixed with the uniform distribution by eps = 1 / (N + 1)
    t, eps = sms.fit_info_["temperature"], 1 / 401
    expected = (1 - eps) * torch.softmax(torch.from_numpy(z).double() / t, 1) + eps / 5
    torch.testing.assert_close(sms.predict_proba(torch.from_numpy(z).double()), expected, rtol=1e-6, atol=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError, match="lambda_off_diagonal"):
        StructuredMatrixScaling(lambda_off_diagonal=-1.0)
    with pytest.raises(ValueError, match="tau"):
        StructuredMatrixScaling(tau=-0.5)
    with pytest.raises(TypeError, match="max_iter"):
        StructuredMatrixScaling(max_iter=2.5)


def test_same_objective_as_probmetrics_and_at_least_as_low():
    pytest.importorskip("probmetrics")
    from probmetrics.utils import multiclass_probs_to_logits

    z, y = overconfident(600, 6, seed=9)
    z = z * np.linspace(0.6, 1.6, 6, dtype=np.float32)
    peer = probmetrics_fit("sms", z, y)
    ours = StructuredMatrixScaling(tol=1e-12).fit(z, y, progress_bar=False)
    # the authors' objective, written from their fit's own features (their smoothed temperature scaling)
    x = torch.from_numpy(
        multiclass_probs_to_logits(peer.ts_.predict_proba(torch.softmax(torch.from_numpy(z).double(), 1).numpy()))
    ).double()
    n, k = x.shape

    def objective(w, b):
        d = w - torch.eye(k, dtype=torch.float64)
        off = d - torch.diag_embed(torch.diagonal(d))
        ce = torch.nn.functional.cross_entropy(x @ w.T + b, torch.from_numpy(y))
        return float(
            ce + k / n * (b**2).sum() + k / n * (torch.diagonal(d) ** 2).sum() + k * (k - 1) / n * (off**2).sum()
        )

    theirs = objective(torch.from_numpy(peer.W_[:, :k]).double(), torch.from_numpy(peer.W_[:, k]).double())
    at_ours = objective(ours.weight.detach(), ours.bias.detach())
    assert at_ours == pytest.approx(ours.fit_info_["best_objective"], abs=1e-6)  # the same objective (float32 features)
    assert at_ours <= theirs + 1e-7
