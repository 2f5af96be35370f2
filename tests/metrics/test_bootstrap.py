"""Bootstrap intervals: each resample's value equals the metric on the resampled rows, the draws are uniform and
reproducible, the interval agrees with scipy's bootstrap, and it covers the true calibration error."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import relplot
from scipy import integrate, stats

import _metric_reference as ref
from hf_calibration.metrics import (
    MetricInterval,
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    debiased_ece,
    ece,
    ece_split,
    mce,
    nll,
    smce,
    smece,
)
from hf_calibration.metrics import bootstrap
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics.adaptive import _adaece_statistic
from hf_calibration.metrics.bootstrap import check_bootstrap, flat_intervals, frame, weighted_means
from hf_calibration.metrics.ece import _binned_statistic, _classwise_statistic
from hf_calibration.metrics.scores import _row_scores
from hf_calibration.metrics.smooth import _smce_statistic, _smece_statistic

FUNCTIONS = [ece, adaece, mce, classwise_ece, smce, smece, brier, nll, debiased_ece]


def _case(n=1500, k=5, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2
    if ties:
        logits = np.round(logits, 1)  # many equal confidences: tie groups straddle equal-mass cuts
    labels = np.where(rng.random(n) < 0.6, logits.argmax(1), rng.integers(0, k, n))
    return logits, labels


def _counts(n, rows=6, seed=3):
    return next(check_bootstrap(0.95, 50, seed)._blocks(n))[:rows].copy()


def _expanded(counts_row):
    return np.repeat(np.arange(counts_row.shape[0]), counts_row)


@pytest.mark.parametrize("ties", [False, True])
def test_each_resample_is_the_metric_of_the_resampled_rows(ties):
    """The compiled weighted forms against the plain functions on np.repeat-ed rows (an explicit resample)."""
    logits, labels = _case(ties=ties)
    inputs = prepare(logits, labels)
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    counts = _counts(len(labels))  # over the rows in frame order (sorted by confidence, stable)
    order = frame(conf)
    binned = _binned_statistic(conf, correct, 15)(counts)
    values = {
        "adaece": _adaece_statistic(conf, correct, 15)(counts),
        "adaece_many_bins": _adaece_statistic(conf, correct, 4000)(counts),  # more bins than rows
        "classwise": _classwise_statistic(inputs, 15, order)(counts),
        "scores": weighted_means(_row_scores(inputs), order)(counts),
        "smce": _smce_statistic(conf, correct)(counts),
        "smece": _smece_statistic(conf, correct)(counts),
    }
    assert (np.diff(conf[order]) >= 0).all()
    for b, row in enumerate(counts):
        idx = order[_expanded(row)]  # the rows drawn
        z, y = logits[idx], labels[idx]
        c, a = ref.top_label(ref.softmax(z), y)
        assert binned[b, 0] == pytest.approx(ref.loop_ece(c, a, 15), abs=1e-12)
        assert binned[b, 1] == pytest.approx(ref.loop_mce(c, a, 15), abs=1e-12)
        assert binned[b, 2] == pytest.approx(ece_split(z, y).over, abs=1e-12)
        assert binned[b, 3] == pytest.approx(ece_split(z, y).under, abs=1e-12)
        assert binned[b, 4] == pytest.approx(a.mean(), abs=1e-12)
        assert values["adaece"][b] == pytest.approx(adaece(z, y), abs=1e-12)
        assert values["adaece_many_bins"][b] == pytest.approx(adaece(z, y, 4000), abs=1e-12)
        assert values["classwise"][b] == pytest.approx(ref.loop_classwise_ece(ref.softmax(z), y, 15), abs=1e-12)
        assert values["scores"][b, 0] == pytest.approx(brier(z, y), abs=1e-12)
        assert values["scores"][b, 1] == pytest.approx(nll(z, y), abs=1e-12)
        assert values["smce"][b] == pytest.approx(smce(z, y), abs=1e-12)
        assert values["smece"][b] == pytest.approx(relplot.smECE(c, a), abs=1e-9)


def test_draws_are_uniform_multinomial_and_reproducible(monkeypatch):
    n, n_boot = 7, 20_000
    boot = check_bootstrap(0.95, n_boot, 11)
    counts = np.concatenate(list(boot._blocks(n)))
    assert counts.shape == (n_boot, n) and (counts.sum(axis=1) == n).all()
    # every row drawn equally often: chi-square on the totals; a row's count is Binomial(n, 1/n)
    assert stats.chisquare(counts.sum(axis=0)).pvalue > 1e-3
    observed = np.bincount(counts[:, 0], minlength=n + 1)
    expected = stats.binom(n, 1 / n).pmf(np.arange(n + 1)) * n_boot
    keep = expected > 5
    assert stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue > 1e-3
    # the same seed gives the same resamples whatever the block size (each resample has its own stream)
    monkeypatch.setattr(bootstrap, "_BLOCK_ELEMENTS", 3 * n)
    np.testing.assert_array_equal(np.concatenate(list(boot._blocks(n))), counts)
    assert not np.array_equal(np.concatenate(list(check_bootstrap(0.95, n_boot, 12)._blocks(n))), counts)


def test_interval_agrees_with_scipy_bootstrap():
    """An independent percentile bootstrap (scipy, its own resampling) of the same ECE: the ends agree within
    the Monte Carlo error of 4,000 resamples (~2 % of the interval's width each)."""
    logits, labels = _case(n=800, seed=5)
    conf, correct = ref.top_label(ref.softmax(logits), labels)
    ours = ece(logits, labels, ci=0.9, n_boot=4000, seed=1)
    theirs = stats.bootstrap((conf, correct), lambda c, a: ref.loop_ece(c, a, 15), paired=True, vectorized=False,
                             n_resamples=4000, confidence_level=0.9, method="percentile",
                             rng=np.random.default_rng(2)).confidence_interval
    width = ours.high - ours.low
    assert ours.low == pytest.approx(theirs.low, abs=0.1 * width)
    assert ours.high == pytest.approx(theirs.high, abs=0.1 * width)
    assert float(ours) == pytest.approx(ref.loop_ece(conf, correct, 15), abs=1e-12)


def test_default_call_unchanged_and_the_interval_behaves_like_the_float():
    logits, labels = _case(n=600)
    for f in FUNCTIONS:
        plain = f(logits, labels)
        assert type(plain) is float
        value = f(logits, labels, ci=0.9, n_boot=200)
        assert isinstance(value, MetricInterval) and float(value) == plain
        assert value.low <= value.high and value.level == 0.9 and value.n_boot == 200
        assert value + 0 == plain and round(value, 6) == round(plain, 6) and f"{value:.5f}" == f"{plain:.5f}"
        assert json.loads(json.dumps({"v": value}))["v"] == plain
        back = pickle.loads(pickle.dumps(value))
        assert (float(back), back.low, back.high, back.level, back.n_boot) == (plain, value.low, value.high, 0.9, 200)
    assert smce(logits, labels, ci=0.9).n_boot == 200 and ece(logits, labels, ci=0.9).n_boot == 1000  # the defaults
    value = ece(logits, labels, ci=0.95)
    assert str(value) == f"{float(value):.4f} [{value.low:.4f}, {value.high:.4f}]"
    assert value.format(100, 2, " %") == f"{100 * float(value):.2f} % [{100 * value.low:.2f}, {100 * value.high:.2f}]"
    assert flat_intervals({"ece": value, "n": 3}) == {"ece": float(value), "ece_ci_low": value.low, "ece_ci_high": value.high, "n": 3}
    split = ece_split(logits, labels, ci=0.95)
    assert float(split.over) + float(split.under) == pytest.approx(ece(logits, labels), abs=1e-12)


def test_infinite_nll_resamples_give_an_infinite_upper_end():
    probs = ref.softmax(_case(n=300)[0])
    labels = probs.argmax(1)
    probs[0] = [1.0, 0.0, 0.0, 0.0, 0.0]
    labels[0] = 1  # a true-class probability of exactly 0: NLL is inf whenever row 0 is drawn
    value = nll(probs, labels, ci=0.95)
    assert float(value) == np.inf and np.isfinite(value.low) and value.high == np.inf


@pytest.mark.parametrize("f", FUNCTIONS + [calibration_report])
def test_bad_bootstrap_arguments_name_the_argument(f):
    logits, labels = _case(n=50)
    for kwargs, err, word in [
        ({"ci": 95}, ValueError, "`ci`"), ({"ci": 1.0}, ValueError, "`ci`"), ({"ci": "0.95"}, TypeError, "`ci`"),
        ({"ci": 0.95, "n_boot": 5}, ValueError, "`n_boot`"), ({"ci": 0.95, "n_boot": 1.5}, TypeError, "`n_boot`"),
        ({"ci": 0.95, "seed": -1}, ValueError, "`seed`"),
    ]:
        with pytest.raises(err, match=word):
            f(logits, labels, **kwargs)


def test_report_intervals_are_the_functions_intervals_and_print_as_the_papers():
    logits, labels = _case(n=700, seed=9)
    report = calibration_report(logits, labels, ci=0.95, n_boot=300, seed=4)
    functions = {"ece": ece, "adaece": adaece, "mce": mce, "classwise_ece": classwise_ece, "smce": smce,
                 "smece": smece, "brier": brier, "nll": nll}
    for name, f in functions.items():  # the same seed gives the same resamples: the same intervals, exactly
        value = f(logits, labels, ci=0.95, n_boot=300, seed=4)
        assert (float(report[name]), report[name].low, report[name].high) == (float(value), value.low, value.high), name
    split = ece_split(logits, labels, ci=0.95, n_boot=300, seed=4)
    assert report.o_ece.low == split.over.low and report.u_ece.high == split.under.high
    text = str(report)
    assert f"ECE {report.ece.format(100, 2, ' %')}".replace(" ", "") in text.replace(" ", "")
    assert f"{100 * float(report.ece):.2f} % [{100 * report.ece.low:.2f}, {100 * report.ece.high:.2f}]" in text
    assert "95 % percentile bootstrap interval" in text
    assert "[" not in str(calibration_report(logits, labels))  # the default table is unchanged
    assert calibration_report(logits, labels).intervals() == {}


# ------------------------------------------------------------------------------------------------ coverage
# Synthetic data with a known calibration map: K = 3 rows [p, (1-p)/2, (1-p)/2] with p ~ U(1/3, 1), right
# with probability f(p) = 0.7 p (over-confident, as deep networks are), else one of the two others. The gap
# p - f(p) = 0.3 p is positive everywhere, so every population ECE-type value (any bins) is
# E[p - f(p)] = 0.3 * 2/3, and smCE (sup over 1-Lipschitz w) takes w = 1: the same number. It is at least
# 0.1, ~2.5 times a bin's noise at N = 2,000, so the plug-in is unbiased here; where the gap is near a bin's
# noise the plug-in is biased upwards and so is its interval (benchmarks/bootstrap_coverage.py measures
# that). Brier and NLL are integrals of the known map (scipy's quad).

_LO = 1.0 / 3.0


def _f(p):
    return 0.7 * p


def _true_values() -> dict[str, float]:
    gap = 0.3 * (1 + _LO) / 2
    other = lambda p: (1 - p) / 2  # noqa: E731
    brier_row = lambda p: _f(p) * ((1 - p) ** 2 + 2 * other(p) ** 2) + (1 - _f(p)) * (p**2 + (1 - other(p)) ** 2 + other(p) ** 2)  # noqa: E731
    nll_row = lambda p: -(_f(p) * np.log(p) + (1 - _f(p)) * np.log(other(p)))  # noqa: E731
    mean = lambda g: integrate.quad(g, _LO, 1)[0] / (1 - _LO)  # noqa: E731
    return {"ece": gap, "adaece": gap, "smce": gap, "brier": mean(brier_row), "nll": mean(nll_row)}


def test_true_values_by_a_huge_sample():
    """The analytic truths against the plain metrics of one sample of 2e6 (their noise is ~1e-3)."""
    rng = np.random.default_rng(0)
    probs, labels = _synthetic(rng, 2_000_000)
    for name, value in _true_values().items():
        assert {"ece": ece, "adaece": adaece, "smce": smce, "brier": brier, "nll": nll}[name](probs, labels) == pytest.approx(value, abs=2e-3)


def _synthetic(rng, n):
    p = rng.uniform(_LO, 1.0, n)
    probs = np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)
    return probs, np.where(rng.random(n) < _f(p), 0, rng.integers(1, 3, n))


def test_intervals_cover_the_true_values_at_their_level():
    """200 draws of N = 2,000, a 95 % interval each (1,000 resamples; smCE its default 200): every interval covers
    the truth >= 93 % of the time (the binomial noise of 200 draws is 1.5 points; measured: ECE 96 %, AdaECE
    95.5 %, smCE 95 %, Brier 95 %, NLL 95.5 %)."""
    truth = _true_values()
    functions = {"ece": ece, "adaece": adaece, "smce": smce, "brier": brier, "nll": nll}
    hits = dict.fromkeys(functions, 0)
    rng = np.random.default_rng(0)
    draws = 200
    for draw in range(draws):
        probs, labels = _synthetic(rng, 2000)
        for name, f in functions.items():
            value = f(probs, labels, ci=0.95, seed=draw, from_logits=False)
            hits[name] += value.low <= truth[name] <= value.high
    coverage = {name: hit / draws for name, hit in hits.items()}
    assert min(coverage.values()) >= 0.93, coverage


def test_bootstrap_requests_are_checked_like_every_other_argument():
    """Issue 29 item 15: ``n_boot`` without ``ci`` was ignored silently; seeds >= 2**64, which every other seed of the
    package refuses, were taken; a float32 ``ci`` was stored as 0.949999988079071."""
    from hf_calibration.metrics import ece

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    z = rng.normal(size=(200, 3)) + 2 * np.eye(3)[y]
    with pytest.raises(ValueError, match="`ci`.*since `n_boot` is given"):
        ece(z, y, n_boot=500)
    with pytest.raises(ValueError, match=r"`seed` to be an integer in \[0, 2\*\*64 - 1\]"):
        ece(z, y, ci=0.95, seed=2**64)
    value = ece(z, y, ci=np.float32(0.95), n_boot=50)
    assert value.level == 0.95 and repr(value.level) == "0.95"
    assert check_bootstrap(np.float32(0.9), None, 0).level == 0.9 and check_bootstrap(None, None, 2**64 - 1) is None
