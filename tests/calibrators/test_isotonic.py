"""Isotonic regression: top-label against scikit-learn, one-vs-rest against netcal, and their edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _toplabel_reference import case_id, confidence_as_computed, expected_top, splits, top_label_view

from hf_calibration.calibrators import IsotonicRegression, OneVsRestIsotonicRegression


@pytest.mark.parametrize("name, zv, yv, zt", splits(6), ids=case_id)
def test_top_label_matches_sklearn(name, zv, yv, zt):
    from sklearn.isotonic import IsotonicRegression as SklearnIsotonic

    _, top, conf, _ = top_label_view(zv)
    _, top_t, conf_t, floor_t = top_label_view(zt)
    # the same confidences as the package computes them (equal to scipy's to 1e-15): where two thresholds of the
    # map are 1e-9 apart, the map's slope turns a last-bit difference of the input into 1e-9 of the output
    conf, conf_t = confidence_as_computed(zv, conf), confidence_as_computed(zt, conf_t)
    reference = SklearnIsotonic(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(conf, (top == yv).astype(float))
    ours = IsotonicRegression().fit(zv, yv, progress_bar=False)
    probs = ours.predict_proba(torch.from_numpy(zt).double()).numpy()
    np.testing.assert_allclose(
        probs[np.arange(len(zt)), top_t], expected_top(reference.predict(conf_t), floor_t), rtol=0, atol=1e-9
    )
    assert (probs.argmax(1) == top_t).all()


# K = 100: one file (a hundred maps each side, ~5 s)
OVR_CASES = [case for case in splits(6) if case[1].shape[1] <= 10 or "wideresnet-16-4-cifar-100" in case[0]]


@pytest.mark.parametrize("name, zv, yv, zt", OVR_CASES, ids=case_id)
def test_one_vs_rest_matches_netcal(name, zv, yv, zt):
    from netcal.binning import IsotonicRegression as NetcalIsotonic
    from scipy.special import softmax

    netcal = NetcalIsotonic().fit(softmax(zv.astype(np.float64), 1), yv)
    expected = netcal.transform(softmax(zt.astype(np.float64), 1))
    defined = np.isfinite(expected).all(1)  # netcal divides 0 by 0 where every class's map returns 0
    ours = OneVsRestIsotonicRegression().fit(zv, yv, progress_bar=False)
    probs = ours.predict_proba(torch.from_numpy(zt).double()).numpy()
    np.testing.assert_allclose(probs[defined], expected[defined], rtol=0, atol=1e-9)
    assert defined.mean() > 0.99
    np.testing.assert_allclose(probs[~defined], 1.0 / zt.shape[1], rtol=0, atol=1e-12)


def test_one_vs_rest_row_with_every_map_at_zero_is_uniform():
    # each class k: p_k in [0.7, 0.9] always labelled k, p_k <= 0.15 never; a test row at 1/3 each is below
    # every map's first threshold (0.7), so every class maps to 0 (netcal: NaN)
    rows = []
    for k in range(3):
        for high in np.linspace(0.7, 0.9, 5):
            p = np.full(3, (1 - high) / 2)
            p[k] = high
            rows.append((np.log(p), k))
    z = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    ovr = OneVsRestIsotonicRegression().fit(z, y, progress_bar=False)
    out = ovr.predict_proba(torch.log(torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.8, 0.1, 0.1]], dtype=torch.float64)))
    np.testing.assert_allclose(out[0].numpy(), [1 / 3] * 3, rtol=0, atol=1e-12)
    # second row: class 0 maps to 1 (p = 0.8 is inside its all-positive run), classes 1, 2 to 0 -> floor 1e-15
    np.testing.assert_allclose(out[1].numpy(), [1.0, 1e-15, 1e-15], rtol=1e-9, atol=0)


def test_one_vs_rest_may_change_the_argmax():
    assert OneVsRestIsotonicRegression.preserves_argmax is False and IsotonicRegression.preserves_argmax is True
    # class 1 is predicted with p ~ 0.5 but always wrong; class 0 at p ~ 0.45 is always right
    z = np.log(np.array([[0.45, 0.5, 0.05]] * 10 + [[0.5, 0.45, 0.05]] * 10 + [[0.05, 0.45, 0.5]] * 10))
    y = np.array([0] * 10 + [0] * 10 + [2] * 10)
    ovr = OneVsRestIsotonicRegression().fit(z, y, progress_bar=False)
    assert ovr(torch.from_numpy(z[:1])).argmax(1).item() == 0  # the model said 1


def test_no_objective_to_choose():
    z, y = overconfident(100, 4, seed=0)
    for cls in (IsotonicRegression, OneVsRestIsotonicRegression):
        with pytest.raises(ValueError, match="`objective`"):
            cls().fit(z, y, objective="brier")
