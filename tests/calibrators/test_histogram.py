"""Histogram binning against netcal (equal-width, one binning) and Gupta & Ramdas's uniform-mass TL-HB."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _toplabel_reference import case_id, expected_top, splits, top_label_view, uniform_mass_binning

from hf_calibration.calibrators import HistogramBinning, UncalibratedWarning


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
    """Per predicted class, n_l // 50 uniform-mass bins; a class with fewer than 50 predictions: the n // 50 bins of
    every prediction pooled (where Gupta & Ramdas leave it uncalibrated)."""
    _, top, conf, _ = top_label_view(zv)
    _, top_t, conf_t, floor_t = top_label_view(zt)
    correct = (top == yv).astype(float)
    pooled = uniform_mass_binning(conf, correct, len(yv) // 50)
    recalibrated = conf_t.copy()
    for label in range(zv.shape[1]):
        fit, test = top == label, top_t == label
        n_bins = int(fit.sum()) // 50
        if test.any():
            recalibrated[test] = (uniform_mass_binning(conf[fit], correct[fit], n_bins) if n_bins else pooled)(
                conf_t[test]
            )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedWarning)
        hb = HistogramBinning().fit(zv, yv, progress_bar=False)
    np.testing.assert_allclose(_top_probability(hb, zt), expected_top(recalibrated, floor_t), rtol=0, atol=1e-12)
    counts = np.bincount(top, minlength=zv.shape[1])
    assert hb.fit_info_["bins_per_class"] == (counts // 50).tolist()
    assert hb.fit_info_["pooled_classes"] == int((counts < 50).sum())
    assert hb.fit_info_["pooled_bins"] == (len(yv) // 50 if (counts < 50).any() else 0)
    assert hb.fit_info_["bins"] == int((counts // 50).sum()) + hb.fit_info_["pooled_bins"]


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


def test_rare_classes_share_the_pooled_binning():
    z, y = overconfident(300, 10, seed=2)
    assert np.bincount(z.argmax(1), minlength=10).max() < 50  # no class reaches 50 predictions
    hb = HistogramBinning().fit(z, y, progress_bar=False)  # on main: the identity, 0 bins, 10 uncalibrated classes
    info = hb.fit_info_
    assert (info["bins"], info["pooled_bins"], info["pooled_classes"], info["points_per_bin"]) == (6, 6, 10, 50)
    assert info["bins_per_class"] == [0] * 10 and "uncalibrated" not in info
    _, top, conf, floor = top_label_view(z)
    expected = uniform_mass_binning(conf, (top == y).astype(float), 6)(conf)
    np.testing.assert_allclose(_top_probability(hb, z), expected_top(expected, floor), rtol=0, atol=1e-12)
    assert HistogramBinning(points_per_bin=20).fit(z, y, progress_bar=False).fit_info_["pooled_classes"] == 0


def _digits_case():
    """scikit-learn's digits: a barely regularised logistic regression on 400 images (over-confident), its logits on
    270 calibration images and on the other 1,127."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    model = LogisticRegression(C=1e4, max_iter=5000).fit(x[:400], y[:400])
    logits = model.decision_function(x[400:])
    return logits[:270], y[400:670], logits[270:], y[670:]


def _held_out_ece(logits_or_probs, labels) -> float:
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs = torch.softmax(torch.as_tensor(logits_or_probs, dtype=torch.float64), 1)
    return float(multiclass_calibration_error(probs, torch.as_tensor(labels), probs.shape[1], n_bins=15, norm="l1"))


@pytest.mark.parametrize("case", ["digits", "synthetic"])
def test_a_small_calibration_set_is_calibrated_not_left_alone(case):
    """270 samples x 10 classes (27 predictions a class): the held-out ECE (torchmetrics) drops well below the
    uncalibrated model's; on main every class was left uncalibrated and it stayed where it was."""
    if case == "digits":
        zv, yv, zt, yt = _digits_case()
    else:
        z, y = overconfident(2270, 10, seed=4, scale=8.0)
        zv, yv, zt, yt = z[:270], y[:270], z[270:], y[270:]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedWarning)
        hb = HistogramBinning().fit(zv, yv, progress_bar=False)
    before, after = _held_out_ece(zt, yt), _held_out_ece(hb(torch.from_numpy(zt)), yt)
    assert before > 0.04 and after < 0.6 * before, (before, after)  # digits 4.4 -> 1.7 %, synthetic 21.1 -> 6.8 %
    assert hb.fit_info_["pooled_bins"] == 5


@pytest.mark.parametrize("per_class", [True, False])
def test_too_few_samples_for_one_bin_warns_and_says_why(per_class):
    z, y = overconfident(40, 10, seed=5)
    with pytest.warns(
        UncalibratedWarning, match=r"every prediction uncalibrated.*40 samples, fewer than points_per_bin = 50"
    ):
        hb = HistogramBinning(per_class=per_class).fit(z, y, progress_bar=False)
    assert (
        hb.fit_info_["uncalibrated"]["classes"] == "all" and "points_per_bin" in hb.fit_info_["uncalibrated"]["reason"]
    )
    assert hb.fit_info_["bins"] == 0
    torch.testing.assert_close(
        hb.predict_proba(torch.from_numpy(z).double()),
        torch.softmax(torch.from_numpy(z).double(), 1),
        rtol=0,
        atol=1e-12,
    )
    with warnings.catch_warnings():  # asked for: bins of 8
        warnings.simplefilter("error", UncalibratedWarning)
        assert (
            HistogramBinning(points_per_bin=8, per_class=per_class).fit(z, y, progress_bar=False).fit_info_["bins"] >= 5
        )
