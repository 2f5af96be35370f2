"""compare_calibrators and AutoCalibrator: fold scores recomputed by hand, failures as rows, the choice and its record."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import (
    AutoCalibrator,
    IsotonicRegression,
    SMARTCalibrator,
    TemperatureScaling,
    compare_calibrators,
    load_calibrator,
)
from hf_calibration.calibrators import selection as selection_module
from hf_calibration.calibrators._cv import stratified_folds
from hf_calibration.calibrators.selection import CalibratorComparison, MethodScores

FAST_SMART = {"max_steps": 40, "patience": 1000}


@pytest.fixture(scope="module")
def data():
    return overconfident(600, 5, seed=8)


@pytest.fixture(scope="module")
def table(data):
    z, y = data
    return compare_calibrators(z, y, {"temperature_scaling": {}, "isotonic": {}, "smart": FAST_SMART}, cv=3, seed=2,
                               fit_seeds=2, keep_predictions=True, progress_bar=False)


def _reference_scores(calibrated: np.ndarray, z: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """ECE by torchmetrics, NLL by scikit-learn, Brier and accuracy by numpy, all on float64 probabilities."""
    from sklearn.metrics import log_loss
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs = torch.softmax(torch.from_numpy(calibrated).double(), 1)
    onehot = np.eye(z.shape[1])[y]
    return {
        "ece": float(multiclass_calibration_error(probs, torch.from_numpy(y), z.shape[1], n_bins=15, norm="l1")),
        "nll": log_loss(y, probs.numpy(), labels=range(z.shape[1])),
        "brier": float(((probs.numpy() - onehot) ** 2).sum(1).mean()),
        "accuracy_change": float((calibrated.argmax(1) == y).mean() - (z.argmax(1) == y).mean()),
    }


def test_fold_scores_are_refits_on_the_other_folds(table, data):
    z, y = data
    folds = stratified_folds(y, cv=3, seed=2)
    for i, (train, val) in enumerate(folds):
        ts = TemperatureScaling().fit(z[train], y[train], progress_bar=False)
        calibrated = ts(torch.from_numpy(z[val]).double()).numpy()
        for metric, value in _reference_scores(calibrated, z[val], y[val]).items():
            assert table["temperature_scaling"].folds[metric][i] == pytest.approx(value, abs=1e-6), metric
        np.testing.assert_allclose(table.predictions["temperature_scaling"][val], calibrated, rtol=0, atol=1e-12)
        uncal = _reference_scores(z[val].astype(np.float64), z[val], y[val])
        assert table["uncalibrated"].folds["ece"][i] == pytest.approx(uncal["ece"], abs=1e-6)
    values = table["temperature_scaling"].folds["ece"]
    assert table["temperature_scaling"].mean("ece") == pytest.approx(np.mean(values), abs=1e-15)
    assert table["temperature_scaling"].std("ece") == pytest.approx(np.std(values, ddof=1), abs=1e-15)
    assert not np.isnan(table.predictions["isotonic"]).any()  # every sample held out exactly once


def test_seeded_methods_are_averaged_over_fit_seeds(table, data):
    z, y = data
    train, val = stratified_folds(y, cv=3, seed=2)[0]
    eces = []
    for seed in (2, 3):  # fit seeds start at the comparison's seed
        smart = SMARTCalibrator(seed=seed, **FAST_SMART).fit(z[train], y[train], progress_bar=False)
        eces.append(_reference_scores(smart(torch.from_numpy(z[val]).double()).numpy(), z[val], y[val])["ece"])
    assert eces[0] != eces[1]
    assert table["smart"].folds["ece"][0] == pytest.approx(np.mean(eces), abs=1e-6)
    assert table["smart"].fit_seeds == 2 and table["isotonic"].fit_seeds == 1


def test_a_method_that_fails_is_a_row_not_a_crash(data):
    z, y = data
    # 60 samples, 5 folds: SMART trains on 48 < its 50-sample minimum in every fold
    table = compare_calibrators(z[:60], y[:60], {"smart": FAST_SMART, "isotonic": {}}, cv=5, fit_seeds=1, progress_bar=False)
    assert len(table["smart"].errors) == 5 and "at least 50" in table["smart"].errors[0]
    assert np.isnan(table["smart"].mean("ece")) and len(table["isotonic"].folds["ece"]) == 5
    assert table.best("ece") == "isotonic"
    text = str(table)
    assert "failed" in text and "5/5" in text and "at least 50" in text
    assert table.to_dict()["smart"]["ece"]["mean"] is None
    json.dumps(table.to_dict())  # JSON-ready


def test_best_by_hand():
    def scores(name, ece, acc=0.0, errors=()):
        s = MethodScores(name)
        for column in s.folds:
            s.folds[column] = [0.0, 0.0]
        s.folds["ece"], s.folds["accuracy_change"], s.errors = [ece, ece], [acc, acc], list(errors)
        return s

    table = CalibratorComparison(
        {"uncalibrated": scores("uncalibrated", 0.0), "a": scores("a", 0.02), "b": scores("b", 0.01, acc=-0.003),
         "c": scores("c", 0.005, errors=["fold 1: ValueError: x"]), "d": scores("d", 0.02)},
        cv=2, seed=0, n_bins=15, num_samples=10, num_classes=3,
    )
    assert table.best("ece") == "a"  # b loses accuracy, c failed on a fold, uncalibrated is no candidate, a before d
    assert table.best("ece", max_accuracy_drop=0.005) == "b"
    with pytest.raises(ValueError, match="metric"):
        table.best("accuracy")


def test_rows_and_probabilities_input(table, data):
    import pandas as pd

    frame = pd.DataFrame(table.rows())
    assert list(frame["method"]) == ["uncalibrated", "temperature_scaling", "isotonic", "smart"]
    assert {"ece_mean", "ece_std", "fit_seconds_mean", "failed_folds"} <= set(frame.columns)
    # probabilities are detected (from_logits=None) and give the same table as the logits
    z, y = data
    probs = torch.softmax(torch.from_numpy(z).double(), 1).numpy()
    again = compare_calibrators(probs, y, ["temperature_scaling", "isotonic"], cv=3, seed=2, progress_bar=False)
    for method in ("uncalibrated", "temperature_scaling", "isotonic"):
        for metric in ("nll", "brier", "smce"):
            np.testing.assert_allclose(again[method].folds[metric], table[method].folds[metric], rtol=0, atol=1e-6)
    # (binned ECE only where the outputs are not ratios of counts sitting on bin edges, as isotonic's are)
    np.testing.assert_allclose(again["temperature_scaling"].folds["ece"], table["temperature_scaling"].folds["ece"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"methods": ["platt"]}, ValueError, "methods"),
        ({"methods": []}, ValueError, "methods"),
        ({"methods": 3}, TypeError, "methods"),
        ({"methods": {"isotonic": 1}}, TypeError, "methods"),
        ({"cv": 1}, ValueError, "cv"),
        ({"fit_seeds": 0}, ValueError, "fit_seeds"),
        ({"keep_predictions": "yes"}, TypeError, "keep_predictions"),
    ],
)
def test_bad_arguments(data, kwargs, error, match):
    z, y = data
    with pytest.raises(error, match=match):
        compare_calibrators(z, y, **{"methods": ["isotonic"], **kwargs}, progress_bar=False)


def test_bad_inputs(data):
    z, y = data
    with pytest.raises(ValueError, match="labels"):
        compare_calibrators(z, methods=["isotonic"])
    bad = z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        compare_calibrators(bad, y, ["isotonic"], progress_bar=False)
    with pytest.raises(ValueError, match="metric"):
        AutoCalibrator(metric="accuracy")
    with pytest.raises(ValueError, match="methods"):
        AutoCalibrator(methods=["platt"])


def test_auto_calibrator_refits_the_best_and_saves_as_it(data, tmp_path):
    z, y = data
    methods = {"temperature_scaling": {}, "isotonic": {}, "spline": {}}
    auto = AutoCalibrator(metric="nll", cv=3, methods=methods, seed=1).fit(z, y, progress_bar=False)
    table = compare_calibrators(z, y, methods, cv=3, seed=1, progress_bar=False)
    expected = min(methods, key=lambda m: table[m].mean("nll"))
    assert auto.method_ == expected and type(auto.calibrator_).kind == expected
    refit = type(auto.calibrator_)().fit(z, y, progress_bar=False)
    zt = torch.from_numpy(z)
    assert torch.equal(auto(zt), refit(zt)) and torch.equal(auto.predict_proba(zt), refit.predict_proba(zt))
    assert auto.kind == expected and auto.preserves_argmax

    auto.save_pretrained(tmp_path / "auto")
    loaded = load_calibrator(tmp_path / "auto")
    assert type(loaded) is type(auto.calibrator_) and torch.equal(loaded(zt), auto(zt))
    assert type(AutoCalibrator.from_pretrained(tmp_path / "auto")) is type(auto.calibrator_)
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    selection = config["fit"]["selection"]
    assert selection["chosen"] == expected and selection["metric"] == "nll" and selection["cv"] == 3
    assert selection["table"][expected]["nll"]["mean"] == pytest.approx(table[expected].mean("nll"), abs=1e-12)
    card = (tmp_path / "auto" / "README.md").read_text()
    assert "## How this calibrator was chosen" in card and "| temperature_scaling" in card and "| spline" in card


def test_unfitted_auto_calibrator():
    from hf_calibration.calibrators import NotFittedError

    auto = AutoCalibrator(methods=["isotonic"])
    with pytest.raises(NotFittedError):
        auto(torch.zeros(2, 3))
    with pytest.raises(NotFittedError):
        auto.save_pretrained("unused")
    with pytest.raises(AttributeError, match="before fit"):
        auto.kind  # noqa: B018
    assert "AutoCalibrator(metric='ece', cv=5)" == repr(auto)


def test_docstring_examples():
    result = doctest.testmod(selection_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0
    from hf_calibration.calibrators import histogram, isotonic, spline

    for module in (histogram, isotonic, spline):
        result = doctest.testmod(module)
        assert result.attempted >= 3 and result.failed == 0, module.__name__
    assert IsotonicRegression.__doc__
