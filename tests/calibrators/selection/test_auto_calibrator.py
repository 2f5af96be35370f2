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
from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds
from hf_calibration.calibrators.selection import auto as selection_module
from hf_calibration.calibrators.selection.auto import CalibratorComparison, MethodScores

FAST_SMART = {"max_steps": 40, "patience": 1000}


@pytest.fixture(scope="module")
def data():
    return overconfident(600, 5, seed=8)


@pytest.fixture(scope="module")
def table(data):
    z, y = data
    return compare_calibrators(
        z,
        y,
        {"temperature_scaling": {}, "isotonic": {}, "smart": FAST_SMART},
        cv=3,
        seed=2,
        fit_seeds=2,
        keep_predictions=True,
        race=False,
        progress_bar=False,
    )


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
    table = compare_calibrators(
        z[:60], y[:60], {"smart": FAST_SMART, "isotonic": {}}, cv=5, race=False, progress_bar=False
    )
    assert len(table["smart"].errors) == 5 and "at least 50" in table["smart"].errors[0]
    assert np.isnan(table["smart"].mean("ece")) and len(table["isotonic"].folds["ece"]) == 5
    text = str(table)
    assert "failed" in text and "5/5" in text and "at least 50" in text
    assert table.to_dict()["smart"]["ece"]["mean"] is None
    json.dumps(table.to_dict())  # JSON-ready
    # racing stops a method at its first failure: it can never be chosen
    raced = compare_calibrators(z[:60], y[:60], {"smart": FAST_SMART, "isotonic": {}}, cv=5, progress_bar=False)
    assert len(raced["smart"].errors) == 1 and raced["smart"].stopped == "failed on a fold"
    assert "smart" in raced.exclusions() and "failed" in raced.exclusions()["smart"]


def _hand_scores(name, ece, acc=0.0, nll=0.5, errors=(), folds=2):
    s = MethodScores(name)
    for fold in range(folds):
        s.add_fold(fold, {**{c: 0.0 for c in s.folds}, "ece": ece, "accuracy_change": acc, "nll": nll})
    s.errors = list(errors)
    return s


def test_best_by_hand():
    table = CalibratorComparison(
        {
            "uncalibrated": _hand_scores("uncalibrated", 0.1, nll=0.8),
            "a": _hand_scores("a", 0.02),
            "b": _hand_scores("b", 0.01, acc=-0.003),
            "c": _hand_scores("c", 0.005, errors=["fold 1: ValueError: x"]),
            "d": _hand_scores("d", 0.02),
            "e": _hand_scores("e", 0.001, folds=1),
        },
        cv=2,
        seed=0,
        n_bins=15,
        num_samples=10,
        num_classes=3,
    )
    # b loses accuracy, c failed on a fold, e ran one fold of two, uncalibrated's ECE is the worst, a before d
    assert table.best("ece") == "a"
    assert table.best("ece", max_accuracy_drop=0.005) == "b"
    assert set(table.exclusions()) == {"b", "c", "e"}
    with pytest.raises(ValueError, match="metric"):
        table.best("accuracy")


def test_a_method_worse_than_uncalibrated_on_nll_is_never_chosen_by_hand():
    table = CalibratorComparison(
        {
            "uncalibrated": _hand_scores("uncalibrated", 0.10, nll=0.80),
            "binning": _hand_scores("binning", 0.01, nll=0.93),
            "scaling": _hand_scores("scaling", 0.03, nll=0.79),
        },
        cv=2,
        seed=0,
        n_bins=15,
        num_samples=10,
        num_classes=3,
    )
    for metric in ("ece", "nll", "brier"):
        assert table.best(metric) == "scaling"
    assert "worse than the uncalibrated" in table.exclusions()["binning"]
    alone = CalibratorComparison(
        {
            "uncalibrated": _hand_scores("uncalibrated", 0.1, nll=0.8),
            "binning": _hand_scores("binning", 0.01, nll=0.93),
        },
        cv=2,
        seed=0,
        n_bins=15,
        num_samples=10,
        num_classes=3,
    )
    chosen, why = alone.decide("ece")  # nothing qualifies: the model is left as it is, and the reason says why
    assert chosen == alone.best("ece") == "uncalibrated" and "binning: cross-validated NLL 0.9300 is worse" in why


def _fold_scores(name, ece, nll):
    s = MethodScores(name)
    for fold, value in enumerate(ece):
        s.add_fold(fold, {**{c: 0.0 for c in s.folds}, "ece": value, "nll": nll})
    return s


def test_within_one_standard_error_the_lower_nll_wins_by_hand():
    from scipy.stats import sem

    scores = {
        "uncalibrated": _fold_scores("uncalibrated", [0.10, 0.10, 0.10], 0.8),
        "a": _fold_scores("a", [0.010, 0.030, 0.020], 0.60),
        "b": _fold_scores("b", [0.025, 0.020, 0.030], 0.50),
        "c": _fold_scores("c", [0.050, 0.060, 0.070], 0.40),
    }
    table = CalibratorComparison(scores, cv=3, seed=0, n_bins=15, num_samples=30, num_classes=3)
    b_minus_a = np.subtract(scores["b"].folds["ece"], scores["a"].folds["ece"])
    c_minus_a = np.subtract(scores["c"].folds["ece"], scores["a"].folds["ece"])
    assert b_minus_a.mean() <= sem(b_minus_a) and c_minus_a.mean() > sem(c_minus_a)  # b ties with a, c does not
    assert table.best("ece") == "b"  # main: "a", the lowest ECE whatever its NLL
    assert table.best("ece", tie_break=None) == "a" and table.best("nll") == "c"


def _held_out_nll(table, method: str) -> np.ndarray:
    """Each sample's out-of-fold NLL, by scipy's log_softmax on the predictions the table kept."""
    from scipy.special import log_softmax

    z = table.predictions[method]
    return -log_softmax(z.astype(np.float64), axis=1)[np.arange(z.shape[0]), table.labels]


def _qualifies_by_scipy(table, method: str) -> bool:
    """The selection rule recomputed: scipy's one-sided paired t-test on the per-sample held-out NLL at 0.05, a gain
    of at least 0.1 % of the uncalibrated NLL, every fold run, no accuracy lost."""
    from scipy.stats import ttest_rel

    ours, theirs = _held_out_nll(table, method), _held_out_nll(table, "uncalibrated")
    significant = ttest_rel(theirs, ours, alternative="greater").pvalue < 0.05
    return bool(
        significant
        and theirs.mean() - ours.mean() >= 1e-3 * theirs.mean()
        and table[method].mean("accuracy_change") >= 0
    )


def test_auto_calibrator_applies_the_one_standard_error_rule(data):
    from scipy.stats import sem

    z, y = overconfident(600, 5, seed=8, scale=5.0)  # over-confident enough for every scaling method to qualify
    methods = ["temperature_scaling", "vector_scaling", "isotonic", "spline"]
    auto = AutoCalibrator(methods=methods, race=False).fit(z, y, progress_bar=False)
    table = compare_calibrators(
        z, y, methods, race=False, keep_predictions=True, progress_bar=False
    )  # the same folds and fits
    ok = [m for m in methods if _qualifies_by_scipy(table, m)] + ["uncalibrated"]
    assert "temperature_scaling" in ok and "vector_scaling" in ok
    leader = min(ok, key=lambda m: table[m].mean("ece"))
    tied = [m for m in ok if (d := np.subtract(table[m].folds["ece"], table[leader].folds["ece"])).mean() <= sem(d)]
    assert auto.method_ == min(tied, key=lambda m: table[m].mean("nll")) != "uncalibrated"
    assert auto.selection()["tie_break"] == "nll"


@pytest.fixture(scope="module")
def calibrated_model():
    """A model calibrated by construction (logits 2.2 x the class-evidence, whose softmax is the Bayes posterior):
    on 100-sample folds the binned ECE is noise that histogram binning and isotonic regression fit."""
    return overconfident(500, 10, seed=5, scale=2.2)


def test_auto_calibrator_never_picks_a_worse_nll_than_uncalibrated(calibrated_model):
    z, y = calibrated_model
    methods = ["temperature_scaling", "isotonic", "histogram_binning", "spline"]
    table = compare_calibrators(z, y, methods, race=False, progress_bar=False)
    by_ece = min(methods, key=lambda m: table[m].mean("ece"))
    # what main chose: the lowest ECE (isotonic), whose held-out NLL is worse than the uncalibrated model's
    assert by_ece == "isotonic" and table["isotonic"].mean("nll") > table["uncalibrated"].mean("nll") + 0.04
    kept = compare_calibrators(z, y, methods, race=False, keep_predictions=True, progress_bar=False)
    assert not any(_qualifies_by_scipy(kept, m) for m in methods)  # temperature scaling's 0.0006 gain is no gain here
    for race in (False, True):
        with pytest.warns(UserWarning, match="leaves every prediction uncalibrated"):
            auto = AutoCalibrator(metric="ece", methods=methods, race=race).fit(z, y, progress_bar=False)
        assert auto.method_ == "uncalibrated"
        assert "worse than the uncalibrated model's" in auto.selection()["excluded"]["isotonic"]


def test_auto_calibrator_leaves_a_model_alone_when_nothing_lowers_nll(calibrated_model, tmp_path):
    from hf_calibration.calibrators import UncalibratedWarning

    z, y = calibrated_model
    methods = ["isotonic", "histogram_binning", "spline"]
    with pytest.warns(
        UncalibratedWarning, match="AutoCalibrator leaves every prediction uncalibrated.*no candidate qualified"
    ):
        auto = AutoCalibrator(metric="ece", methods=methods).fit(z, y, progress_bar=False)
    assert auto.method_ == "uncalibrated" and auto.fit_info_["uncalibrated"]["classes"] == "all"
    zt = torch.from_numpy(z).double()
    torch.testing.assert_close(auto.predict_proba(zt), torch.softmax(zt, 1), rtol=0, atol=1e-12)
    auto.save_pretrained(tmp_path / "identity")
    loaded = load_calibrator(tmp_path / "identity")
    assert loaded.fit_info_["selection"]["chosen"] == "uncalibrated" and torch.equal(loaded(zt), auto(zt))
    assert "no calibrator" in (tmp_path / "identity" / "README.md").read_text()


@pytest.mark.parametrize("seed", range(6))
def test_clearly_worse_is_scipys_one_sided_paired_t_test(seed):
    from scipy.stats import ttest_rel

    from hf_calibration.calibrators.selection.auto import clearly_worse

    rng = np.random.default_rng(seed)
    folds = 2 + seed % 4
    reference = rng.normal(0.05, 0.01, folds)
    values = reference + rng.normal(0.01 * (seed % 3), 0.01, folds)
    for confidence in (0.95, 0.99):
        expected = ttest_rel(values, reference, alternative="greater").pvalue < 1 - confidence
        assert clearly_worse(values, reference, confidence) == expected
    assert clearly_worse(reference + 0.01, reference)  # worse by the same amount on every fold
    assert not clearly_worse(reference - 0.01, reference) and not clearly_worse(values[:1], reference[:1])


def test_racing_stops_a_clearly_worse_candidate_and_keeps_the_choice():
    from scipy.stats import ttest_rel

    z, y = overconfident(600, 5, seed=8, scale=8.0)
    # 480 training samples a fold < points_per_bin = 1000: histogram binning stays the identity, as bad as uncalibrated
    methods = {"temperature_scaling": {}, "histogram_binning": {"points_per_bin": 1000}, "spline": {}}
    full = compare_calibrators(z, y, methods, race=False, progress_bar=False)
    raced = compare_calibrators(z, y, methods, progress_bar=False)
    hb = raced["histogram_binning"]
    ran = len(hb.fold_ids)
    assert (
        2 <= ran < 5
        and hb.fold_ids == list(range(ran))
        and hb.stopped.startswith("clearly worse than")
        and "on ece" in hb.stopped
    )
    leader = hb.stopped.split()[3]
    pvalues = [
        ttest_rel(
            full["histogram_binning"].folds["ece"][:f], full[leader].folds["ece"][:f], alternative="greater"
        ).pvalue
        for f in range(2, ran + 1)
    ]
    assert pvalues[-1] < 0.01 and all(p >= 0.01 for p in pvalues[:-1])  # stopped at the first fold scipy finds it worse
    assert full["histogram_binning"].mean("nll") >= full[leader].mean("nll")
    assert hb.folds["ece"] == full["histogram_binning"].folds["ece"][:ran]  # the same folds, the same scores
    assert (
        raced.best() == full.best()
        and raced["temperature_scaling"].folds["ece"] == full["temperature_scaling"].folds["ece"]
    )
    assert "histogram_binning" in raced.exclusions() and f"{ran}/5 stopped" in str(raced)
    assert raced.to_dict()["histogram_binning"]["folds_run"] == ran


def test_table_shows_nll_beside_the_selection_metric(data):
    z, y = overconfident(600, 5, seed=8, scale=5.0)
    table = compare_calibrators(z, y, ["temperature_scaling"], metric="smce", cv=3, progress_bar=False)
    header = str(table).splitlines()[2]
    assert [cell.strip() for cell in header.strip("|").split("|")][:4] == [
        "method",
        "smCE (%)",
        "NLL",
        "Δ accuracy (pp)",
    ]
    assert table.best() == "temperature_scaling" and table.columns()[:2] == ["smce", "nll"]


def test_default_candidates_leave_out_the_slow_rare_winners(data):
    from hf_calibration.calibrators import list_calibrators
    from hf_calibration.calibrators.selection.auto import DEFAULT_METHODS, method_names

    assert method_names("default") == list(DEFAULT_METHODS) and method_names("all") == list_calibrators("multiclass")
    assert {"matrix_scaling", "dirichlet", "pts", "cts", "isotonic_ovr"}.isdisjoint(DEFAULT_METHODS)
    assert set(DEFAULT_METHODS) < set(list_calibrators())
    assert AutoCalibrator().methods == "default"


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
    np.testing.assert_allclose(
        again["temperature_scaling"].folds["ece"], table["temperature_scaling"].folds["ece"], rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"methods": ["no_such_method"]}, ValueError, "methods"),
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
        AutoCalibrator(methods=["no_such_method"])


def test_auto_calibrator_refits_the_best_and_saves_as_it(data, tmp_path):
    z, y = data
    methods = {"temperature_scaling": {}, "isotonic": {}, "spline": {}}
    auto = AutoCalibrator(metric="nll", cv=3, methods=methods, seed=1).fit(z, y, progress_bar=False)
    table = compare_calibrators(z, y, methods, cv=3, seed=1, metric="nll", progress_bar=False)
    finished = [
        m for m in methods if len(table[m].fold_ids) == 3 and table[m].mean("nll") <= table["uncalibrated"].mean("nll")
    ]
    expected = min(finished, key=lambda m: table[m].mean("nll"))
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


def test_the_identity_says_on_its_card_that_the_model_is_kept_as_it_is(tmp_path):
    """calibrate_on_eval / AutoCalibrator keep the identity when nothing qualifies; its card described dividing by a
    temperature (issue 40, item 11)."""
    import warnings

    from hf_calibration.calibrators.selection.auto import identity_calibrator

    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(200, 4)), rng.integers(0, 4, 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        identity = identity_calibrator(z, y, True, "no candidate qualified (a test's reason)", who="test")
    identity.save_pretrained(tmp_path / "identity")
    card = (tmp_path / "identity" / "README.md").read_text()
    assert "the identity map" in card and "a test's reason" in card and "divides" not in card
