"""debiased_ece against the reference implementation (uncertainty-calibration) on the shared logits, the
exact L1 correction against the reference's Monte Carlo one, and against hand-worked numbers."""

from __future__ import annotations

from pathlib import Path

import _metric_reference as ref
import numpy as np
import pytest
from _paths import shared_params

from hf_calibration.metrics import debiased_ece

calibration = pytest.importorskip("calibration")  # pip install uncertainty-calibration (the test extra)

LOGITS = sorted((Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits").glob("*.npz"))
needs_shared = pytest.mark.skipif(not LOGITS, reason="../shared/data/logits is not here (a user's clone)")


def _test_probs(path):
    data = np.load(path)
    return ref.softmax(data["logits_test"]), data["labels_test"]


@needs_shared
@pytest.mark.parametrize("path", shared_params(LOGITS), ids=lambda p: getattr(p, "stem", p))
def test_equals_uncertainty_calibration_on_the_shared_logits(path):
    probs, labels = _test_probs(path)
    assert not calibration.utils.is_discrete(probs)  # the reference takes its equal-mass (scaling) path
    assert debiased_ece(probs, labels) == pytest.approx(
        calibration.get_top_calibration_error(probs, labels, 2, debias=True), abs=1e-9
    )
    assert debiased_ece(probs, labels, mode="marginal") == pytest.approx(
        calibration.get_calibration_error(probs, labels, 2, debias=True, mode="marginal"), abs=1e-9
    )
    # L1: the reference draws 1,000 normal samples from numpy's global stream; the same draws here
    np.random.seed(7)
    reference = calibration.get_top_calibration_error(probs, labels, 1, debias=True)
    assert debiased_ece(probs, labels, p=1, mc_samples=1000, mc_seed=7) == pytest.approx(reference, abs=1e-9)
    # the exact correction is the limit of those draws: within their Monte Carlo error
    assert debiased_ece(probs, labels, p=1) == pytest.approx(reference, abs=1e-3)


@needs_shared
def test_marginal_l1_and_logits_input():
    probs, labels = _test_probs(next(p for p in LOGITS if "lenet-5-cifar-10" in p.name))
    np.random.seed(3)
    reference = calibration.get_calibration_error(probs, labels, 1, debias=True, mode="marginal")
    assert debiased_ece(probs, labels, p=1, mode="marginal", mc_samples=1000, mc_seed=3) == pytest.approx(
        reference, abs=1e-9
    )
    logits = np.load(next(p for p in LOGITS if "lenet-5-cifar-10" in p.name))["logits_test"].astype(np.float64)
    assert debiased_ece(logits, labels) == pytest.approx(debiased_ece(probs, labels), abs=1e-12)  # logits detected


def test_distinct_binning_equals_the_reference_binning_estimator():
    """Outputs of a binning calibrator (few distinct values): the reference's get_binning_ce path."""
    rng = np.random.default_rng(0)
    levels = np.array([0.55, 0.6, 0.7, 0.8, 0.9, 0.95])
    p = rng.choice(levels, 3000)
    probs = np.stack([p, 1 - p], axis=1)
    labels = np.where(rng.random(3000) < p - 0.05, 0, 1)
    assert calibration.utils.is_discrete(probs)
    for power in (2, 1):
        np.random.seed(11)
        reference = calibration.get_top_calibration_error(
            probs, labels, power, debias=True
        )  # picks the distinct path itself
        mc = {"mc_samples": 1000, "mc_seed": 11} if power == 1 else {}
        assert debiased_ece(probs, labels, p=power, binning="distinct", **mc) == pytest.approx(reference, abs=1e-9)


def test_hand_worked():
    # confidences 0.65, 0.7 | 0.8, 0.9 (2 equal-mass bins, edge 0.75), labels right 1 0 | 1 1
    probs = np.array([[0.35, 0.65], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]])
    labels = np.array([1, 1, 0, 0])
    # bin 1: conf 0.675, acc 0.5, n 2: 0.175^2 - 0.25 / 1 < 0; bin 2: conf 0.85, acc 1: 0.15^2
    expected_sq = 0.5 * (0.175**2 - 0.25) + 0.5 * 0.15**2
    assert debiased_ece(probs, labels, 2) == pytest.approx(np.sqrt(max(expected_sq, 0.0)), abs=1e-12)
    # L1: bin 1 d = -0.175, s = sqrt(0.25 / 2); E|N(d, s^2)| in closed form; bin 2 has s = 0
    d, s = -0.175, np.sqrt(0.125)
    from scipy.stats import norm

    folded = s * np.sqrt(2 / np.pi) * np.exp(-d * d / (2 * s * s)) + d * (1 - 2 * norm.cdf(-d / s))
    expected = 2 * (0.5 * 0.175 + 0.5 * 0.15) - (0.5 * folded + 0.5 * 0.15)
    assert debiased_ece(probs, labels, 2, p=1) == pytest.approx(expected, abs=1e-12)


def test_debiasing_removes_the_plug_in_bias_of_a_calibrated_model():
    """200 draws of a calibrated model (true L2 error 0): the reference's plug-in (debias=False) squared error
    averages the bins' label variance; the debiased one is never above it and averages far lower."""
    rng = np.random.default_rng(1)
    debiased, plug_in = [], []
    for _ in range(200):
        p = rng.uniform(0.5, 1.0, 600)
        probs = np.stack([p, 1 - p], axis=1)
        labels = (rng.random(600) >= p).astype(int)
        debiased.append(debiased_ece(probs, labels, 5))
        plug_in.append(calibration.get_top_calibration_error(probs, labels, 2, debias=False))
        assert debiased[-1] <= plug_in[-1] + 1e-12
    assert np.mean(np.square(plug_in)) > 3 * np.mean(np.square(debiased))


@pytest.mark.parametrize(
    "kwargs,err,word",
    [
        ({"p": 3}, ValueError, "`p`"),
        ({"mode": "classwise"}, ValueError, "`mode`"),
        ({"binning": "uniform"}, ValueError, "`binning`"),
        ({"p": 2, "mc_samples": 100}, ValueError, "`mc_samples`"),
        ({"p": 1, "mc_samples": 100, "ci": 0.9}, ValueError, "`mc_samples`"),
        ({"n_bins": 0}, ValueError, "`n_bins`"),
        ({"ci": 2.0}, ValueError, "`ci`"),
    ],
)
def test_bad_arguments(kwargs, err, word):
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    with pytest.raises(err, match=word):
        debiased_ece(probs, np.array([0, 1, 1, 1]), **kwargs)


@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_interval_is_the_reference_bootstrap_on_the_same_resamples(mode, monkeypatch):
    """End to end against uncertainty-calibration's own interval (``bootstrap_uncertainty``: basic, the plug-in as
    the functional, the debiased estimate as the estimator), fed the same resamples: its ``resample`` is made to
    return ours, in order (the counts are over the rows sorted by top-label confidence; every class of the marginal
    form sees the same rows). Ours is formed on the CE^2 scale, so the reference is given CE^2 and its ends are
    taken back by the square root; on these far-from-calibrated rows no estimate is clipped at 0, so the
    reference's ``sqrt(max(., 0))`` squared is the unbiased CE^2 itself."""
    from hf_calibration.metrics.bootstrap import check_bootstrap, frame

    rng = np.random.default_rng(4)
    logits = 2 * rng.standard_normal((700, 4))
    labels = rng.integers(0, 4, 700)
    probs = ref.softmax(logits)
    value = debiased_ece(logits, labels, 10, mode=mode, ci=0.9, n_boot=12, seed=5)
    order = frame(probs.max(1))
    counts = np.concatenate(list(check_bootstrap(0.9, 12, 5)._blocks(700)))
    rows = iter([order[np.repeat(np.arange(700), c)] for c in counts])
    data = list(zip(probs, labels))
    monkeypatch.setattr(calibration.utils, "resample", lambda d: [d[i] for i in next(rows)])

    def squared(debias):
        def f(d):
            p, y = zip(*d)
            return calibration.utils.lower_bound_scaling_ce(np.array(p), np.array(y), 2, debias, 10, mode=mode) ** 2

        return f

    low, _, high = calibration.utils.bootstrap_uncertainty(
        data, squared(False), squared(True), alpha=10.0, num_samples=12
    )
    assert float(value) == pytest.approx(np.sqrt(squared(True)(data)), abs=1e-9)
    assert (value.low, value.high) == pytest.approx((np.sqrt(max(low, 0.0)), np.sqrt(high)), abs=1e-9)
    assert value.method == "basic_plugin" and value.low <= float(value) <= value.high


def test_interval_of_a_calibrated_model_brackets_its_estimate():
    """The issue's case: marginal debiased ECE of a calibrated model (labels drawn from its own probabilities). The
    percentile interval lay above the estimate on 40 of 40 draws and never held the large-N value; the basic interval
    with the plug-in as its pivot brackets the estimate on every draw here."""

    def draw(rng, n):
        z = rng.normal(size=(n, 10)) * 2
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        return z, (p.cumsum(1) > rng.random((n, 1))).argmax(1)

    rng = np.random.default_rng(1)
    large = debiased_ece(*draw(np.random.default_rng(99), 100_000), mode="marginal")
    assert large < 0.003  # ~0.001: a calibrated model's binned error is ~0
    held = 0
    for _ in range(12):
        value = debiased_ece(*draw(rng, 1000), mode="marginal", ci=0.95)
        assert value.low <= float(value) <= value.high
        held += value.low <= large <= value.high
    assert held >= 9


@pytest.mark.parametrize("n,warns", [(2, True), (15, True), (16, True), (29, True), (30, False)])
def test_warns_when_bins_hold_one_sample(n, warns):
    """A model confidently wrong on every sample: the reference reads 0 at N <= 15 bins (each bin one sample, which the
    L2 estimator counts as 0) and 0.34 at N = 16; the value stays the reference's, with a warning below 2 samples a
    bin. p=1 counts a one-sample bin as its plug-in gap, and does not warn."""
    import warnings

    conf = np.random.default_rng(0).uniform(0.95, 0.999, n)
    probs, labels = np.stack([conf, 1 - conf], axis=1), np.ones(n, dtype=int)
    expected = calibration.get_top_calibration_error(probs, labels, 2, debias=True)
    assert (expected == 0.0) == (n <= 15)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = debiased_ece(probs, labels, 15)
        debiased_ece(probs, labels, 15, p=1)
    assert value == pytest.approx(expected, abs=1e-12)
    notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(notes) == warns and all(f"N = {n} samples in n_bins = 15" in note for note in notes)
