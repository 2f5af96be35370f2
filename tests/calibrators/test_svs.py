"""Structured vector scaling (Berta et al. 2026): the fit against a scipy minimisation of the same objective, the
authors' probmetrics 1.3 (when installed) on the same data and on the shared real logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import fit_structured_reference, smoothed_temperature_features
from _calibrator_data import overconfident, shared_files

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


needs_shared = pytest.mark.skipif(not shared_files(), reason="the shared real-logit files are not beside the repo")


@needs_shared
@pytest.mark.parametrize("path", shared_files(), ids=lambda p: p.stem)
def test_held_out_nll_matches_probmetrics_on_the_shared_files(path):
    pytest.importorskip("probmetrics")
    from probmetrics.calibrators import get_calibrator

    with np.load(path) as d:
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
    with torch.no_grad():
        ours = float(torch.nn.functional.cross_entropy(StructuredVectorScaling().fit(zv, yv, progress_bar=False)(torch.from_numpy(zt)).double(),
                                                       torch.from_numpy(yt)))
    peer = get_calibrator("svs")
    peer.fit(torch.softmax(torch.from_numpy(zv).double(), 1).numpy(), yv)
    probs = peer.predict_proba(torch.softmax(torch.from_numpy(zt).double(), 1).numpy())
    theirs = float(-np.log(probs[np.arange(len(yt)), yt]).mean())
    assert ours <= theirs + 1e-4  # measured: equal to 4 decimals on all seven
