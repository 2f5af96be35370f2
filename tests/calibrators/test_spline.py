"""Spline calibration against an independent implementation of Gupta et al.'s equations, and on calibrated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _toplabel_reference import (
    case_id,
    confidence_as_computed,
    expected_top,
    spline_recalibration,
    splits,
    top_label_view,
)
from scipy.special import softmax

from hf_calibration.calibrators import SplineCalibration


@pytest.mark.parametrize(
    "name, zv, yv, zt, knots", [(*case, 6) for case in splits(7)] + [(*splits(7)[0], 10)], ids=case_id
)
def test_matches_the_papers_equations(name, zv, yv, zt, knots):
    """The reference fits the same least-squares natural cubic spline in the truncated-power basis (ESL 5.4)."""
    _, top, conf, _ = top_label_view(zv)
    _, top_t, conf_t, floor_t = top_label_view(zt)
    conf, conf_t = confidence_as_computed(zv, conf), confidence_as_computed(zt, conf_t)
    reference = spline_recalibration(conf, top == yv, knots)
    ours = SplineCalibration(knots=knots).fit(zv, yv, progress_bar=False)
    probs = ours.predict_proba(torch.from_numpy(zt).double()).numpy()
    np.testing.assert_allclose(
        probs[np.arange(len(zt)), top_t], expected_top(reference(conf_t), floor_t), rtol=0, atol=1e-9
    )


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
    from hf_calibration.calibrators.spline import ks_spline_map

    knots, _ = spline.maps.group(0)
    _, top, conf, _ = top_label_view(z)
    raw_x, raw_v = ks_spline_map(conf, top == y, 6)
    assert len(raw_x) == len(np.unique(conf))  # one value per distinct confidence
    # stored clipped: plus one knot wherever the spline crosses 0 or 1
    crossings = sum(int(((raw_v[:-1] - b) * (raw_v[1:] - b) < 0).sum()) for b in (0.0, 1.0))
    assert knots.numel() == len(raw_x) + crossings and bool((knots[1:] > knots[:-1]).all())


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


def test_the_stored_map_is_the_applied_one_clipped_to_probabilities():
    # issue 23 item 12: spline values left [0, 1] (clipped only when applied), so a tampered value could not be told
    # from a fitted one; the map is now stored as applied and a loaded value outside [0, 1] is refused
    from hf_calibration.calibrators._machinery.piecewise import clip_linear_map

    xp, fp = (
        np.array([0.0, 0.5, 0.8, 1.0]),
        np.array([-0.2, 0.4, 1.3, 0.9]),
    )  # by hand: crosses 0 at 1/6, 1 at 0.7 and 0.95
    x, v = clip_linear_map(xp, fp)
    np.testing.assert_allclose(x, [0.0, 1 / 6, 0.5, 0.7, 0.8, 0.95, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(v, [0.0, 0.0, 0.4, 1.0, 1.0, 1.0, 0.9], rtol=0, atol=1e-15)
    grid = np.linspace(-0.1, 1.1, 1201)
    np.testing.assert_allclose(np.interp(grid, x, v), np.clip(np.interp(grid, xp, fp), 0, 1), rtol=0, atol=1e-15)
    from hf_calibration.calibrators.spline import ks_spline_map

    z, y = overconfident(600, 5, seed=0, scale=1.0)
    _, top, conf, _ = top_label_view(z)
    raw_x, raw_v = ks_spline_map(conf, top == y, 6)
    assert raw_v.max() > 1.05  # the fitted spline passes 1 here
    spline = SplineCalibration().fit(z, y, progress_bar=False)
    knots, values = spline.maps.group(0)
    assert float(values.min()) >= 0.0 and float(values.max()) <= 1.0
    np.testing.assert_allclose(
        spline.maps.evaluate(grid, step=False), np.clip(np.interp(grid, raw_x, raw_v), 0, 1), rtol=0, atol=1e-12
    )
