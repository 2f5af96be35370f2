"""Calibrators of sigmoid heads (binary, multi-label): against scikit-learn, betacal and the softmax calibrators;
persistence, attach and the refusals that name problem_type."""

import warnings

import numpy as np
import pytest
import torch

from hf_calibration.calibrators import (
    BetaCalibration,
    PlattScaling,
    SigmoidHistogramBinning,
    SigmoidIsotonicRegression,
    SigmoidTemperatureScaling,
    TemperatureScaling,
    create_calibrator,
    list_calibrators,
    load_calibrator,
)
from hf_calibration.metrics import nll

SIGMOID = list_calibrators("multilabel")


def _binary(n=2000, seed=0, scale=3.0, noise=2.5):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.int64)
    z = scale * (2 * y - 1) + noise * rng.normal(size=n) + 0.5
    return z, y


def _multilabel(n=1500, labels=3, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < np.linspace(0.2, 0.5, labels)).astype(np.int64)
    z = 3.0 * (2 * y - 1) + 2.5 * rng.normal(size=(n, labels)) + np.linspace(-1, 1, labels)
    return z, y


def test_registry_splits_softmax_and_sigmoid():
    assert set(SIGMOID) == {
        "beta",
        "platt",
        "sigmoid_histogram_binning",
        "sigmoid_isotonic",
        "sigmoid_temperature_scaling",
    }
    assert set(SIGMOID).isdisjoint(list_calibrators("multiclass"))
    assert sorted(SIGMOID + list_calibrators("multiclass")) == list_calibrators()


def test_platt_equals_sklearn_sigmoid_calibration():
    from sklearn.calibration import _sigmoid_calibration

    z, y = _binary()
    a, b = _sigmoid_calibration(z, y)  # P(y = 1) = 1 / (1 + exp(a z + b)), Platt's smoothed targets
    expected = 1 / (1 + np.exp(a * z + b))
    got = PlattScaling().fit(z, y, progress_bar=False).predict_proba(z).numpy()
    assert np.abs(got - expected).max() < 1e-4


def test_platt_without_smoothing_is_logistic_regression_on_the_logit():
    from sklearn.linear_model import LogisticRegression

    z, y = _binary(seed=1)
    lr = LogisticRegression(C=1e12, tol=1e-10, max_iter=10_000).fit(z[:, None], y)
    got = PlattScaling(smooth_targets=False).fit(z, y, progress_bar=False)
    assert float(got.weight.detach()[0]) == pytest.approx(lr.coef_[0, 0], rel=1e-4)
    assert float(got.bias.detach()[0]) == pytest.approx(lr.intercept_[0], rel=1e-4, abs=1e-5)


def _bce(p, y):
    return -np.mean(y * np.log(np.clip(p, 1e-300, 1)) + (1 - y) * np.log(np.clip(1 - p, 1e-300, 1)))


@pytest.mark.parametrize("seed, scale", [(0, 3.0), (1, 1.0), (2, 6.0)])
def test_beta_equals_betacal(seed, scale):
    """The map of the reference package (Kull et al.'s betacal, parameters="abm"). betacal stops its scikit-learn
    logistic regression at tol=1e-4: on a well-separated head (scale 6) it stops short of the optimum, where ours goes
    on (a lower fit-set NLL), so there the coefficients agree to 10 % and the probabilities on average to 3e-4."""
    betacal = pytest.importorskip("betacal")
    z, y = _binary(seed=seed, scale=scale)
    p = 1 / (1 + np.exp(-z))
    reference = betacal.BetaCalibration(parameters="abm").fit(p, y)
    expected = reference.predict(p)
    beta = BetaCalibration().fit(z, y, progress_bar=False)
    got = beta.predict_proba(z).numpy()
    a, b, _ = reference.calibrator_.map_
    tolerance = 1e-3 if scale < 5 else 0.1
    assert float(beta.a.detach()[0]) == pytest.approx(a, rel=tolerance) and float(beta.b.detach()[0]) == pytest.approx(
        b, rel=tolerance
    )
    assert np.abs(got - expected).mean() < (1e-4 if scale < 5 else 1e-3)
    assert _bce(got, y) <= _bce(expected, y) + 1e-9


def test_beta_keeps_a_b_nonnegative_on_an_inverted_head():
    z, y = _binary(seed=3)
    z = np.where(z > 2, -z, z)  # a non-monotone relation pushes one coefficient below 0 in the free fit
    beta = BetaCalibration().fit(z, y, progress_bar=False)
    assert bool((beta.a >= 0).all()) and bool((beta.b >= 0).all())


def _betacal_features(z):
    p = 1 / (1 + np.exp(-z))
    return p, np.stack([np.log(p), -np.log1p(-p)], axis=1)  # betacal's (ln p, -ln(1 - p))


def test_beta_equals_betacal_where_a_alone_is_dropped():
    """A head whose free fit gives a < 0 <= b: betacal drops a and refits b (``map_ = [0, b, m]``); so do we."""
    betacal = pytest.importorskip("betacal")
    from sklearn.linear_model import LogisticRegression

    z, y = _binary(seed=3)
    z = np.where(z > 2, -z, z)
    p, features = _betacal_features(z)
    free = LogisticRegression(C=99999999999).fit(features, y).coef_[0]
    assert free[0] < 0 <= free[1]
    reference = betacal.BetaCalibration(parameters="abm").fit(p, y)
    beta = BetaCalibration().fit(z, y, progress_bar=False)
    assert float(beta.a.detach()[0]) == 0.0
    assert float(beta.b.detach()[0]) == pytest.approx(reference.calibrator_.map_[1], rel=1e-3)
    assert np.abs(beta.predict_proba(z).numpy() - reference.predict(p)).max() < 1e-4


def test_beta_on_an_inverted_head_both_coefficients_negative_is_the_base_rate():
    """An inverted head: the free fit gives a < 0 and b < 0. betacal drops a, refits b, and keeps the refitted b < 0
    (a decreasing map); here it is dropped too (module docstring), leaving the constant logit of the base rate.

    Dropping a and b at once instead of one at a time gives the same map, always (so no test can tell the two apart):
    at the free fit's optimum the labels' covariance with -ln(1 - p) equals that of its probabilities, which decrease
    with z while -ln(1 - p) increases, so it is <= 0, and the refit of b alone is <= 0 too. Asserted on betacal's refit."""
    betacal = pytest.importorskip("betacal")
    from sklearn.linear_model import LogisticRegression

    z, y = _binary(seed=0)
    z = -z
    p, features = _betacal_features(z)
    free = LogisticRegression(C=99999999999).fit(features, y).coef_[0]
    assert (free < 0).all()
    a, b, _ = betacal.BetaCalibration(parameters="abm").fit(p, y).calibrator_.map_
    assert a == 0 and b < 0  # betacal: a dropped first; the refitted b is negative as well
    beta = BetaCalibration().fit(z, y, progress_bar=False)
    assert float(beta.a.detach()[0]) == 0.0 and float(beta.b.detach()[0]) == 0.0
    assert float(beta.c.detach()[0]) == pytest.approx(np.log(y.mean() / (1 - y.mean())), abs=1e-7)
    assert beta.fit_info_["constrained_labels"] == 1


def test_sigmoid_temperature_equals_softmax_temperature_on_two_logits():
    """sigmoid(z / T) = softmax([0, z] / T)_1: the same NLL, the same T."""
    z, y = _binary(seed=4)
    sigmoid = SigmoidTemperatureScaling().fit(z, y, progress_bar=False)
    softmax = TemperatureScaling().fit(np.stack([np.zeros_like(z), z], axis=1), y, progress_bar=False)
    assert sigmoid.fitted_temperature == pytest.approx(softmax.fitted_temperature, rel=1e-6)


def test_per_label_temperature_equals_one_fit_per_label_and_shared_is_one_number():
    z, y = _multilabel()
    per = SigmoidTemperatureScaling(per_label=True).fit(z, y, progress_bar=False).fitted_temperature
    alone = [SigmoidTemperatureScaling().fit(z[:, l], y[:, l], progress_bar=False).fitted_temperature for l in range(3)]
    assert per == pytest.approx(alone, rel=1e-6)
    shared = SigmoidTemperatureScaling().fit(z, y, progress_bar=False).fitted_temperature
    assert isinstance(shared, float) and min(alone) <= shared <= max(alone)


def test_isotonic_equals_sklearn_per_label():
    from sklearn.isotonic import IsotonicRegression

    z, y = _multilabel(seed=5)
    p = 1 / (1 + np.exp(-z))
    iso = SigmoidIsotonicRegression().fit(z, y, progress_bar=False)
    got = iso.predict_proba(z).numpy()
    for l in range(3):
        expected = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(p[:, l], y[:, l]).predict(p[:, l])
        floor = 0.5 / (z.shape[0] + 1)
        assert np.abs(got[:, l] - np.clip(expected, floor, 1 - floor)).max() < 1e-9


def test_histogram_binning_equals_netcal():
    netcal = pytest.importorskip("netcal.binning")
    z, y = _binary(n=4000, seed=6)
    p = 1 / (1 + np.exp(-z))
    reference = netcal.HistogramBinning(bins=10).fit(p, y)
    expected = reference.transform(p)
    got = (
        SigmoidHistogramBinning(n_bins=10, binning="equal_width").fit(z, y, progress_bar=False).predict_proba(z).numpy()
    )
    assert np.abs(got - expected).max() < 1e-6


@pytest.mark.parametrize("name", SIGMOID)
def test_two_softmax_logits_and_one_logit_give_the_same_probabilities(name):
    z, y = _binary(seed=7)
    two = np.stack([np.full_like(z, 0.7), z + 0.7], axis=1)  # softmax(two)_1 = sigmoid(z)
    one = create_calibrator(name).fit(z, y, progress_bar=False)
    both = create_calibrator(name).fit(two, y, progress_bar=False)
    assert both.fit_info_["task"] == "binary" and both.fit_info_["head"] == "softmax2"
    p_one = one.predict_proba(z).numpy()
    p_two = both.predict_proba(two).numpy()
    assert p_two.shape == (z.shape[0], 2)
    assert np.abs(p_two[:, 1] - p_one).max() < 1e-9
    assert np.abs(torch.softmax(both(torch.from_numpy(two)), 1)[:, 1].numpy() - p_one).max() < 1e-9


@pytest.mark.parametrize("name", SIGMOID)
def test_logits_in_logits_out_and_probabilities_give_the_same(name):
    z, y = _multilabel(seed=8)
    cal = create_calibrator(name).fit(z, y, progress_bar=False)
    out = cal(torch.from_numpy(z).float())
    assert out.shape == z.shape and out.dtype == torch.float32 and bool(torch.isfinite(out).all())
    held_out, _ = _multilabel(seed=80)  # fresh points: a fit point on a bin edge may round to either side
    p = 1 / (1 + np.exp(-held_out))  # probabilities given to a calibrator fitted on logits: from_logits=False says so
    assert np.abs(cal.predict_proba(p, from_logits=False).numpy() - cal.predict_proba(held_out).numpy()).max() < 1e-7
    assert cal.fit_info_["task"] == "multilabel" and cal.fit_info_["num_labels"] == 3
    assert cal.fit_info_["nll_after"] <= cal.fit_info_["nll_before"] + 1e-9


@pytest.mark.parametrize("name", SIGMOID)
def test_save_load_round_trip(name, tmp_path):
    z, y = _multilabel(seed=9)
    cal = create_calibrator(name).fit(z, y, progress_bar=False)
    cal.save_pretrained(tmp_path / "c")
    loaded = load_calibrator(tmp_path / "c")
    assert type(loaded) is type(cal) and loaded.fit_info_["task"] == "multilabel"
    assert torch.equal(loaded(torch.from_numpy(z)), cal(torch.from_numpy(z)))
    with pytest.raises(ValueError, match=r"fit.task|calibrator="):
        TemperatureScaling.from_pretrained(tmp_path / "c")
    folder = cal.push_to_hub("me/model", path_in_repo="calibrator", dry_run=True)
    assert "label" in open(f"{folder}/README.md").read()


def test_softmax_checkpoint_refused_by_a_sigmoid_class(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    ts = TemperatureScaling().fit(rng.normal(size=(300, 3)) + 2 * np.eye(3)[y], y, progress_bar=False)
    ts.save_pretrained(tmp_path / "ts")
    import json

    config = json.loads((tmp_path / "ts" / "config.json").read_text())
    assert config["fit"]["task"] == "multiclass"
    config["calibrator"] = "platt"  # a forged kind: the task record still says softmax
    (tmp_path / "ts" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a sigmoid calibrator's.*problem_type"):
        PlattScaling.from_pretrained(tmp_path / "ts")


def test_sigmoid_calibrator_refuses_multiclass_data():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"multi-class \(softmax\) problem.*problem_type"):
        PlattScaling().fit(rng.normal(size=(50, 4)), rng.integers(0, 4, 50))
    with pytest.raises(ValueError, match="0/1 labels"):
        PlattScaling().fit(rng.normal(size=(50, 2)), rng.integers(0, 3, (50, 2)))
    z, y = _multilabel()
    cal = PlattScaling().fit(z, y, progress_bar=False)
    with pytest.raises(ValueError, match="L = 3 labels"):
        cal(torch.zeros(4, 5))


def test_ignored_labels_are_left_out_of_the_fit():
    z, y = _multilabel(seed=10)
    hide = np.random.default_rng(1).random(y.shape) < 0.3
    masked = PlattScaling().fit(z, np.where(hide, -100, y), progress_bar=False)
    for l in range(3):
        alone = PlattScaling().fit(z[~hide[:, l], l], y[~hide[:, l], l], progress_bar=False)
        assert float(masked.weight.detach()[l]) == pytest.approx(float(alone.weight.detach()[0]), rel=1e-6)


@pytest.mark.parametrize("outside", [7.0, -3.0])
def test_a_sigmoid_calibrator_reads_the_kind_from_the_kept_entries(outside):
    """Multi-label probabilities whose ignored entries hold a value outside [0, 1] are probabilities (the kept entries
    decide, as for the metrics): Platt scaling fits the logits of the kept ones (scikit-learn's sigmoid calibration of
    each label's kept entries) and records that it saw probabilities. It read them as logits before."""
    from sklearn.calibration import _sigmoid_calibration

    rng = np.random.default_rng(1)
    z, y = _multilabel(n=600, seed=1)
    p, hide = 1 / (1 + np.exp(-z)), rng.random(y.shape) < 0.1
    platt = PlattScaling().fit(np.where(hide, outside, p), np.where(hide, -100, y), progress_bar=False)
    assert platt.fit_info_["input"] == "probabilities"
    got = platt.predict_proba(p, from_logits=False).numpy()
    for label in range(3):
        kept = ~hide[:, label]
        a, b = _sigmoid_calibration(z[kept, label], y[kept, label])
        assert np.abs(got[:, label] - 1 / (1 + np.exp(a * z[:, label] + b))).max() < 1e-4


def test_compare_and_auto_calibrator_choose_among_sigmoid_methods():
    from hf_calibration.calibrators import AutoCalibrator, compare_calibrators

    z, y = _multilabel(n=2000, seed=11)
    table = compare_calibrators(z, y, progress_bar=False)
    assert set(table.methods) == {"uncalibrated", *SIGMOID}
    assert "L = 3 label(s)" in str(table) and "macro averages over the labels" in str(table)
    auto = AutoCalibrator().fit(z, y, progress_bar=False)
    assert auto.method_ in SIGMOID
    assert table[auto.method_].mean("nll") <= table["uncalibrated"].mean("nll")
    with pytest.raises(ValueError, match="calibrates a softmax head"):
        compare_calibrators(z, y, ["temperature_scaling"], progress_bar=False)


def test_auto_calibrator_leaves_a_calibrated_binary_head_alone():
    import warnings

    from hf_calibration.calibrators import AutoCalibrator

    rng = np.random.default_rng(12)
    z = rng.normal(size=3000) * 2
    y = (rng.random(3000) < 1 / (1 + np.exp(-z))).astype(int)  # calibrated by construction
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = AutoCalibrator(methods=["sigmoid_isotonic"]).fit(z, y, progress_bar=False)
    if auto.method_ == "uncalibrated":
        assert isinstance(auto.calibrator_, SigmoidTemperatureScaling)
        assert np.allclose(auto(torch.from_numpy(z)).numpy(), z)
    else:
        table = auto.comparison_
        assert table[auto.method_].mean("nll") <= table["uncalibrated"].mean("nll")


def test_load_calibrator_checks_the_head(tmp_path):
    from types import SimpleNamespace

    from transformers import ViTConfig

    z, y = _multilabel(seed=13)
    PlattScaling().fit(z, y, progress_bar=False).save_pretrained(tmp_path / "p")
    assert load_calibrator(tmp_path / "p", task="multilabel").kind == "platt"
    with pytest.raises(ValueError, match="fitted for a multilabel head"):
        load_calibrator(tmp_path / "p", task="multiclass")
    softmax_model = SimpleNamespace(config=ViTConfig(num_labels=3, problem_type="single_label_classification"))
    with pytest.raises(ValueError, match="problem_type='single_label_classification'"):
        load_calibrator(tmp_path / "p", task=softmax_model)


def test_beta_on_a_head_without_signal_is_the_base_rate():
    """Both coefficients negative in turn (logits of an untrained head): the map is the best constant, the base rate.
    (Clamping the second coefficient without refitting c once left sigmoid(c) = 0.012 for a base rate of 0.35.)"""
    rng = np.random.default_rng(0)
    z = rng.normal(size=200) * 0.05
    y = (rng.random(200) < 0.35).astype(int)
    beta = BetaCalibration().fit(z, y, progress_bar=False)
    assert float(beta.a.detach()[0]) == 0.0 and float(beta.b.detach()[0]) == 0.0
    assert float(torch.sigmoid(beta.c.detach()[0])) == pytest.approx(y.mean(), abs=1e-6)


# ------------------------------------------------------------------ issue 45: changes to the maths no test saw


@pytest.mark.parametrize("seed", range(4))
def test_platt_equals_scikit_learns_platt_at_thirty_samples(seed):
    """``sklearn.calibration._sigmoid_calibration`` (Platt's smoothed targets ``(N+ + 1)/(N+ + 2)``, ``1/(N- + 2)``)
    at N = 30, where the smoothing matters: ``1/(N- + 1)`` moved the weight 0.817 -> 0.808 and the N = 2,000 comparison
    with a 1e-4 tolerance did not see it. sklearn's P = 1 / (1 + exp(A f + B)): our weight is -A, our bias -B."""
    from sklearn.calibration import _sigmoid_calibration

    rng = np.random.default_rng(seed)
    y = (rng.random(30) < 0.4).astype(int)
    z = 2 * (2 * y - 1) + 2 * rng.normal(size=30)
    a, b = _sigmoid_calibration(z, y)
    platt = PlattScaling().fit(z, y, progress_bar=False)
    assert platt.fit_info_["weight"][0] == pytest.approx(-a, abs=1e-6)
    assert platt.fit_info_["bias"][0] == pytest.approx(-b, abs=1e-6)


def test_the_shared_sigmoid_temperature_with_ignored_labels_minimises_the_documented_objective():
    """One T for every label minimises the mean over labels of each label's mean BCE over its kept samples (each label
    weighs the same, however many of its entries are ignored). Weighting by N instead of each label's kept count
    moved T from 1.016 to 0.453; scipy minimises the documented objective here."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(5)
    y = (rng.random((800, 3)) < 0.3).astype(np.int64)
    z = np.stack([4 * (2 * y[:, 0] - 1), 0.5 * (2 * y[:, 1] - 1), 2 * (2 * y[:, 2] - 1)], axis=1) + rng.normal(
        size=(800, 3)
    )
    labels = y.copy()
    labels[: int(0.9 * 800), 0] = -100  # label 0 keeps 80 samples, the others all 800
    labels[rng.random(800) < 0.3, 2] = -100

    def objective(log_t):
        g = z / np.exp(log_t)
        per_label = []
        for l in range(3):
            kept = labels[:, l] != -100
            per_label.append(np.mean(np.logaddexp(0, g[kept, l]) - y[kept, l] * g[kept, l]))
        return np.mean(per_label)

    best = minimize_scalar(objective, bounds=(np.log(0.05), np.log(100)), method="bounded", options={"xatol": 1e-10})
    fitted = SigmoidTemperatureScaling().fit(z, labels, progress_bar=False)
    assert fitted.fitted_temperature == pytest.approx(np.exp(best.x), rel=1e-6)
    assert fitted.fit_info_["best_objective"] == pytest.approx(best.fun, rel=1e-9)


def test_platt_on_probabilities_with_exact_zeros_and_ones_records_probabilities():
    """An exact 0.0 or 1.0 among the probabilities (a ``>`` for ``>=`` in the detection read them as logits: weight
    0.006 -> 7.49); the fit must equal the one told ``from_logits=False``."""
    rng = np.random.default_rng(3)
    y = (rng.random((600, 2)) < 0.4).astype(np.int64)
    p = 1 / (1 + np.exp(-(2 * (2 * y - 1) + 2 * rng.normal(size=y.shape))))
    p[:5, 0], p[5:10, 1] = 1.0, 0.0
    detected = PlattScaling().fit(torch.from_numpy(p), y, progress_bar=False)
    told = PlattScaling().fit(p, y, from_logits=False, progress_bar=False)
    assert detected.fit_info_["input"] == "probabilities"
    np.testing.assert_allclose(detected.fit_info_["weight"], told.fit_info_["weight"], rtol=0, atol=0)
    np.testing.assert_allclose(detected.fit_info_["bias"], told.fit_info_["bias"], rtol=0, atol=0)


# ------------------------------------------------------------------ issue 40: saturated probabilities, the TS bounds


def test_a_probability_of_one_means_a_logit_of_36_7_not_708():
    """A float64 p = 1.0 says only that p is within 2^-53 of 1: its logit is log((1 - 2^-53) / 2^-53) = 36.74, as
    betacal reads it. At 708 one confidently wrong sample dominated Platt's test NLL; with the clip, Platt on
    probabilities equals scikit-learn's logistic regression on the clipped logits."""
    from sklearn.linear_model import LogisticRegression

    r = np.random.default_rng(0)
    m = r.normal(4, 4, 5000)
    y = (r.random(5000) < 1 / (1 + np.exp(-0.5 * m))).astype(int)
    mt = r.normal(4, 4, 5000)
    yt = (r.random(5000) < 1 / (1 + np.exp(-0.5 * mt))).astype(int)
    mt[0], yt[0] = 40.0, 0
    p, pt = 1 / (1 + np.exp(-m)), 1 / (1 + np.exp(-mt))
    assert pt[0] == 1.0
    platt = PlattScaling(smooth_targets=False).fit(p, y, progress_bar=False)
    g = platt(torch.from_numpy(pt)).numpy()
    w, b = platt.fit_info_["weight"][0], platt.fit_info_["bias"][0]
    assert g[0] == pytest.approx(w * np.log((1 - 2.0**-53) / 2.0**-53) + b, rel=1e-12)

    def clipped_logit(q):
        q = np.clip(q, 2.0**-53, 1 - 2.0**-53)
        return np.log(q) - np.log1p(-q)

    lr = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(clipped_logit(p)[:, None], y)
    q = lr.predict_proba(clipped_logit(pt)[:, None])[:, 1]
    reference = -np.mean(yt * np.log(q) + (1 - yt) * np.log1p(-q))
    assert nll(g, yt, task="binary", from_logits=True) == pytest.approx(reference, abs=1e-5)


def test_sigmoid_temperature_scaling_warns_at_its_bounds():
    """An under-confident head stopped at T = 0.05 without a word (NLL 0.433 where Platt reaches 0.348); the range is
    now [0.001, 1000] and a warning names the bound and what fits instead."""
    rng = np.random.default_rng(0)
    y = (rng.random(2000) < 0.5).astype(int)
    under = 0.02 * (2 * y - 1) + 0.005 * rng.normal(size=2000)  # separable, and far too timid: wants T -> 0
    with pytest.warns(UserWarning, match=r"stopped at its bound T = 0.001.*PlattScaling"):
        fitted = SigmoidTemperatureScaling().fit(under, y, progress_bar=False)
    assert fitted.fitted_temperature == pytest.approx(1e-3)
    timid = 0.05 * (2 * y - 1) + 0.05 * rng.normal(size=2000)  # Bayes logit 40 x: T = 0.025, an inner optimum
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = SigmoidTemperatureScaling().fit(timid, y, progress_bar=False).fitted_temperature
    assert t == pytest.approx(0.025, rel=0.1)  # below the old bound of 0.05
