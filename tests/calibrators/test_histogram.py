"""Histogram binning against netcal (equal-width, one binning) and Gupta & Ramdas's uniform-mass TL-HB."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _toplabel_reference import case_id, expected_top, splits, top_label_view, uniform_mass_binning

from hf_calibration.calibrators import HistogramBinning


def _top_probability(calibrator, logits: np.ndarray) -> np.ndarray:
    probs = calibrator.predict_proba(torch.from_numpy(logits).double()).numpy()
    return probs[np.arange(len(logits)), logits.argmax(1)]


@pytest.mark.parametrize("name, zv, yv, zt", splits(5), ids=case_id)
def test_equal_width_matches_netcal(name, zv, yv, zt):
    from netcal.binning import HistogramBinning as NetcalHistogramBinning

    _, top, conf, _ = top_label_view(zv)
    netcal = NetcalHistogramBinning(bins=15).fit(conf, (top == yv).astype(np.int64))
    _, _, conf_t, floor_t = top_label_view(zt)
    # netcal bins its fit set [lo, hi) and its inputs (lo, hi]: the same bins away from the inner edges b / 15
    away = np.abs(conf_t[:, None] - np.arange(1, 15) / 15).min(1) > 1e-9
    expected = expected_top(netcal.transform(conf_t), floor_t)
    ours = HistogramBinning(n_bins=15, binning="equal_width", per_class=False).fit(zv, yv, progress_bar=False)
    np.testing.assert_allclose(_top_probability(ours, zt)[away], expected[away], rtol=0, atol=1e-9)
    assert away.mean() > 0.99


@pytest.mark.parametrize("name, zv, yv, zt", splits(5), ids=case_id)
def test_default_is_gupta_ramdas_top_label_binning(name, zv, yv, zt):
    """Per predicted class, n_l // 50 uniform-mass bins; fewer than 50 predictions: left alone."""
    _, top, conf, _ = top_label_view(zv)
    _, top_t, conf_t, floor_t = top_label_view(zt)
    recalibrated = conf_t.copy()
    for label in range(zv.shape[1]):
        fit, test = top == label, top_t == label
        n_bins = int(fit.sum()) // 50
        if n_bins and test.any():
            recalibrated[test] = uniform_mass_binning(conf[fit], (yv[fit] == label).astype(float), n_bins)(conf_t[test])
    hb = HistogramBinning().fit(zv, yv, progress_bar=False)
    np.testing.assert_allclose(_top_probability(hb, zt), expected_top(recalibrated, floor_t), rtol=0, atol=1e-12)
    counts = np.bincount(top, minlength=zv.shape[1])
    assert hb.fit_info_["uncalibrated_classes"] == int((counts < 50).sum())


def _binary(confidence, correct):
    """Two-class logits with top-label confidence ``confidence`` on class 0, labels making ``correct`` true."""
    p = np.asarray(confidence, dtype=np.float64)
    return np.log(np.stack([p, 1 - p], axis=1)), np.where(np.asarray(correct, bool), 0, 1)


def test_hand_worked_equal_mass_bins():
    # sorted confidences split 3 + 3: upper edge 0.8; bins (.., 0.8] (2 of 3 correct) and (0.8, ..] (all correct)
    z, y = _binary([0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.65, 0.75, 0.85, 0.97], [0, 1, 1, 1, 1, 1, 1, 0, 1, 1])
    hb = HistogramBinning(n_bins=2, per_class=False).fit(z, y, progress_bar=False)
    # groups [0.6, 0.65, 0.7, 0.75, 0.8] (3/5 correct) and [0.85, ..., 0.99] (5/5)
    zt, _ = _binary([0.55, 0.8, 0.8000001, 0.999], [1, 1, 1, 1])
    np.testing.assert_allclose(_top_probability(hb, zt), [0.6, 0.6, 1 - 1e-12, 1 - 1e-12], rtol=0, atol=1e-15)


def test_equal_width_empty_bin_returns_its_centre():
    z, y = _binary([0.55, 0.56, 0.57, 0.58, 0.95, 0.96, 0.97, 0.98, 0.99, 0.999], [1, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    hb = HistogramBinning(n_bins=5, binning="equal_width", per_class=False).fit(z, y, progress_bar=False)
    zt, _ = _binary([0.55, 0.7, 0.95], [1, 1, 1])  # bins (0.4, 0.6]: 2/4, (0.6, 0.8]: empty -> 0.7, (0.8, 1]: 6/6
    np.testing.assert_allclose(_top_probability(hb, zt), [0.5, 0.7, 1 - 1e-12], rtol=0, atol=1e-15)


def test_few_predictions_of_a_class_stay_uncalibrated():
    z, y = overconfident(300, 10, seed=2)
    assert np.bincount(z.argmax(1), minlength=10).max() < 50  # no class reaches 50 predictions
    hb = HistogramBinning().fit(z, y, progress_bar=False)
    assert hb.fit_info_["uncalibrated_classes"] == 10
    torch.testing.assert_close(hb.predict_proba(torch.from_numpy(z).double()), torch.softmax(torch.from_numpy(z).double(), 1),
                               rtol=0, atol=1e-12)
    assert HistogramBinning(points_per_bin=20).fit(z, y, progress_bar=False).fit_info_["uncalibrated_classes"] == 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_bins": 0}, ValueError, "n_bins"),
        ({"points_per_bin": 0}, ValueError, "points_per_bin"),
        ({"binning": "quantile"}, ValueError, "binning"),
        ({"per_class": "yes"}, TypeError, "per_class"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        HistogramBinning(**kwargs)


def test_no_objective_to_choose():
    z, y = overconfident(200, 4, seed=0)
    with pytest.raises(ValueError, match="`objective`"):
        HistogramBinning().fit(z, y, objective="nll")
    assert HistogramBinning().fit(z, y, objective="bin_frequency", progress_bar=False).fit_info_["objective"] == "bin_frequency"
