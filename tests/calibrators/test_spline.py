"""Spline calibration against an independent implementation of Gupta et al.'s equations, and on calibrated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _toplabel_reference import case_id, confidence_as_computed, expected_top, spline_recalibration, splits, top_label_view
from scipy.special import softmax

from hf_calibration.calibrators import SplineCalibration


@pytest.mark.parametrize("name, zv, yv, zt, knots", [(*case, 6) for case in splits(7)] + [(*splits(7)[0], 10)],
                         ids=case_id)
def test_matches_the_papers_equations(name, zv, yv, zt, knots):
    """The reference fits the same least-squares natural cubic spline in the truncated-power basis (ESL 5.4)."""
    _, top, conf, _ = top_label_view(zv)
    _, top_t, conf_t, floor_t = top_label_view(zt)
    conf, conf_t = confidence_as_computed(zv, conf), confidence_as_computed(zt, conf_t)
    reference = spline_recalibration(conf, top == yv, knots)
    ours = SplineCalibration(knots=knots).fit(zv, yv, progress_bar=False)
    probs = ours.predict_proba(torch.from_numpy(zt).double()).numpy()
    np.testing.assert_allclose(probs[np.arange(len(zt)), top_t], expected_top(reference(conf_t), floor_t), rtol=0, atol=1e-9)


def _calibrated_sample(n: int, seed: int, scale: float = 2.5):
    """Logits and labels drawn from their own softmax: calibrated by construction."""
    rng = np.random.default_rng(seed)
    z = scale * rng.normal(size=(n, 10))
    cumulative = np.cumsum(softmax(z, 1), axis=1)
    y = (rng.random(n)[:, None] > cumulative).sum(1).clip(max=9)
    return z, y


@pytest.mark.parametrize("seed", [0, 1])
def test_calibrated_data_gives_nearly_the_identity(seed):
    z, y = _calibrated_sample(20_000, seed)
    spline = SplineCalibration().fit(z, y, progress_bar=False)
    scores, recalibrated = (t.numpy() for t in spline.maps.group(0))
    deviation = np.abs(recalibrated - scores)
    # sampling noise of 20k Bernoulli outcomes through a 6-knot fit: a few points at most, ~1 on average
    assert deviation.max() < 0.03 and deviation.mean() < 0.012
    # the same logits made 3x too sharp are far from the identity
    sharp = SplineCalibration().fit(3 * z, y, progress_bar=False)
    s_sharp, r_sharp = (t.numpy() for t in sharp.maps.group(0))
    assert np.abs(r_sharp - s_sharp).mean() > 0.1


def test_ties_in_the_fit_set_share_one_value():
    z, y = overconfident(500, 5, seed=3)
    z = np.concatenate([z, np.tile(z[:1], (20, 1))])  # 21 identical rows
    y = np.concatenate([y, np.arange(20) % 5])
    spline = SplineCalibration().fit(z, y, progress_bar=False)
    knots, _ = spline.maps.group(0)
    assert knots.numel() == len(np.unique(top_label_view(z)[2])) and bool((knots[1:] > knots[:-1]).all())


def test_knots_argument():
    z, y = overconfident(200, 4, seed=0)
    with pytest.raises(ValueError, match="knots"):
        SplineCalibration(knots=1)
    with pytest.raises(TypeError, match="knots"):
        SplineCalibration(knots=6.0)
    with pytest.raises(ValueError, match="`knots` = 50"):
        SplineCalibration(knots=50).fit(z[:20], y[:20], progress_bar=False)
    with pytest.raises(ValueError, match="`objective`"):
        SplineCalibration().fit(z, y, objective="nll")
