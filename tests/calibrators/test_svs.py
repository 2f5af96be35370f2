"""Structured vector scaling (Berta et al. 2026): the fit against a scipy minimisation of the same objective, the
structure it shares with SMS (the shared real logits against probmetrics: ``test_structured.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import fit_structured_reference, smoothed_temperature_features
from _calibrator_data import overconfident

from hf_calibration.calibrators import StructuredVectorScaling, create_calibrator, list_calibrators


@pytest.mark.parametrize("lambdas", [(1.0, 1.0), (0.05, 0.2)])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(lambdas):
    z, y = overconfident(300, 5, seed=6)
    z = z * np.array([0.7, 1.0, 1.5, 1.2, 0.9], dtype=np.float32) + np.array([0.5, 0, 0, -0.5, 1.0], dtype=np.float32)
    n, k = z.shape
    li, ld = lambdas
    svs = StructuredVectorScaling(lambda_intercept=li, lambda_diagonal=ld, tol=1e-14, max_iter=5000).fit(z, y, progress_bar=False)
    features, t, eps = smoothed_temperature_features(z, y)
    assert svs.fit_info_["temperature"] == pytest.approx(t, rel=1e-6)
    weights = (0.0, ld * k / n, li * k / n)  # the paper's scaling: lambda K / N
    _, ref_objective, ref_nll = fit_structured_reference(features, y, True, *weights)
    assert svs.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-7)
    assert svs.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    expected = torch.from_numpy(features) * svs.weight.detach() + svs.bias.detach()
    torch.testing.assert_close(svs(torch.from_numpy(z).double()), expected, rtol=0, atol=1e-6)


def test_registered():
    assert "svs" in list_calibrators() and type(create_calibrator("svs")) is StructuredVectorScaling
    assert StructuredVectorScaling.diagonal and not StructuredVectorScaling.preserves_argmax
