"""Bootstrap intervals: each resample's value equals the metric on the resampled rows, the draws are uniform and
reproducible, each interval is scipy's basic / percentile interval of the same resamples, the intervals cover the
true calibration error, and an interval that should be read with care says so."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import _metric_reference as ref
import numpy as np
import pytest
import relplot
from scipy import integrate, stats

from hf_calibration.metrics import (
    MetricInterval,
    adaece,
    bootstrap,
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
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics._probability_pass import probability_rows
from hf_calibration.metrics.adaptive import _adaece_statistic
from hf_calibration.metrics.bootstrap import check_bootstrap, flat_intervals, frame, frame_position, weighted_means
from hf_calibration.metrics.ece import _binned_statistic
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
    return next(check_bootstrap(0.95, 10, seed)._blocks(n))[:rows].copy()


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
        # the same resamples (seed 3), drawn inside the pass
        "classwise": probability_rows(
            inputs, 15, boot=check_bootstrap(0.95, 10, 3), position=frame_position(conf)
        ).replicates,
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


@pytest.mark.parametrize(
    "block", [3, 10]
)  # resamples per block: fewer than the 7 classes, and more (both product forms)
def test_classwise_pass_in_chunks_and_blocks(monkeypatch, block):
    """Classwise ECE's resamples when the pass runs in many row chunks (the next chunk's pass overlapping the
    product of this one) and several blocks of resamples: every resample against the loop on its rows, the
    classwise sums and per-row scores identical to the one-chunk pass."""
    from hf_calibration.metrics import _probability_pass

    logits, labels = _case(n=500, k=7)
    inputs = prepare(logits, labels)
    conf = top_label(inputs).confidence
    boot = check_bootstrap(0.95, 10, 3)
    whole = probability_rows(inputs, 15, boot=boot, position=frame_position(conf))
    monkeypatch.setattr(_probability_pass, "_MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(_probability_pass, "_CHUNK_ELEMENTS", 37 * 7)  # 14 chunks of 37 rows and one of 19
    monkeypatch.setattr(_probability_pass, "_BLOCK_ELEMENTS", block * 500)
    split = probability_rows(inputs, 15, boot=boot, position=frame_position(conf))
    np.testing.assert_array_equal(split.cells, whole.cells)
    np.testing.assert_array_equal(split.scores, whole.scores)
    order = frame(conf)
    for b, row in enumerate(np.concatenate(list(boot._blocks(len(labels))))):
        idx = order[_expanded(row)]
        assert split.replicates[b] == pytest.approx(
            ref.loop_classwise_ece(ref.softmax(logits[idx]), labels[idx], 15), abs=1e-12
        )
        assert split.replicates[b] == pytest.approx(whole.replicates[b], abs=1e-14)


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


def _scipy_interval(logits, labels, statistic, replicates, method, level):
    """scipy.stats.bootstrap's interval of ``method`` from the given replicates (``n_resamples=0``: it resamples
    nothing and takes ``bootstrap_result``'s distribution), the value from ``statistic`` on the rows."""
    given = SimpleNamespace(bootstrap_distribution=np.asarray(replicates))
    return stats.bootstrap(
        (np.arange(len(labels)),),
        lambda i: statistic(logits[i], labels[i]),
        vectorized=False,
        n_resamples=0,
        bootstrap_result=given,
        method=method,
        confidence_level=level,
    ).confidence_interval


def _replicates(f, logits, labels, n_boot, seed, **kw):
    """f on every resample of ``check_bootstrap(.., n_boot, seed)``, the rows gathered explicitly (counts in frame order)."""
    order = frame(ref.softmax(logits).max(1))
    return np.array(
        [
            f(logits[order[_expanded(c)]], labels[order[_expanded(c)]], **kw)
            for c in np.concatenate(list(check_bootstrap(0.9, n_boot, seed)._blocks(len(labels))))
        ]
    )


@pytest.mark.parametrize(
    "name, f, method",
    [
        ("ece", ece, "basic"),
        ("adaece", adaece, "basic"),
        ("classwise_ece", classwise_ece, "basic"),
        ("smce", smce, "basic"),
        ("brier", brier, "percentile"),
        ("nll", nll, "percentile"),
    ],
)
def test_interval_is_scipys_interval_of_the_same_resamples(name, f, method):
    """scipy's basic / percentile interval of the metric recomputed on every explicitly resampled set of rows (the
    value from the reference loops where there is one) equals ours."""
    logits, labels = _case(n=400, seed=5)
    ours = f(logits, labels, ci=0.9, n_boot=40, seed=1)
    replicates = _replicates(f, logits, labels, 40, 1)
    statistic = {
        "ece": lambda z, y: ref.loop_ece(*ref.top_label(ref.softmax(z), y), 15),
        "classwise_ece": lambda z, y: ref.loop_classwise_ece(ref.softmax(z), y, 15),
    }.get(name, f)
    theirs = _scipy_interval(logits, labels, statistic, replicates, method, 0.9)
    assert (ours.low, ours.high) == pytest.approx((max(theirs.low, 0.0), theirs.high), abs=1e-12)
    assert ours.method == method


def test_basic_interval_against_an_independent_resampling():
    """scipy's own resampling (another stream) of the same ECE, basic interval: the ends agree within the Monte Carlo
    error of 4,000 resamples (~2 % of the interval's width each)."""
    logits, labels = _case(n=800, seed=5)
    conf, correct = ref.top_label(ref.softmax(logits), labels)
    ours = ece(logits, labels, ci=0.9, n_boot=4000, seed=1)
    theirs = stats.bootstrap(
        (conf, correct),
        lambda c, a: ref.loop_ece(c, a, 15),
        paired=True,
        vectorized=False,
        n_resamples=4000,
        confidence_level=0.9,
        method="basic",
        rng=np.random.default_rng(2),
    ).confidence_interval
    width = ours.high - ours.low
    assert ours.low == pytest.approx(theirs.low, abs=0.1 * width)
    assert ours.high == pytest.approx(theirs.high, abs=0.1 * width)
    assert float(ours) == pytest.approx(ref.loop_ece(conf, correct, 15), abs=1e-12)


def test_interval_rules_by_hand():
    """The formulas on a hand-made set of replicates: percentile, basic (2 v - q), the plug-in pivot (e + v - q),
    clipping to the range with its note, the estimate above its interval, no interval."""
    boot = check_bootstrap(0.5, 10, 0)  # the 25th and 75th percentiles
    reps = np.arange(1.0, 12.0) / 100  # 0.01 .. 0.11: quantiles 0.035 and 0.085
    assert (boot.interval(0.06, reps).low, boot.interval(0.06, reps).high) == pytest.approx((0.035, 0.085))
    basic = boot.interval(0.06, reps, "ece")
    assert (basic.low, basic.high, basic.method, basic.note) == pytest.approx((0.035, 0.085, "basic", ""))
    shifted = boot.interval(0.05, reps, "ece")  # 2 * 0.05 - (0.085, 0.035)
    assert (shifted.low, shifted.high) == pytest.approx((0.015, 0.065))
    pivot = boot.interval(0.03, reps, "debiased_ece", plugin=0.05)  # 0.03 + 0.05 - (0.085, 0.035)
    assert (pivot.low, pivot.high, pivot.flag) == pytest.approx((0.0, 0.045, "zero"))  # -0.005 clipped at 0
    assert "reaches 0" in pivot.note and pivot.short_note == "interval reaches 0"
    above = boot.interval(0.03, reps, "ece")  # resamples biased far above the estimate: [0, 0.025]
    assert (above.low, above.high, above.flag) == pytest.approx((0.0, 0.025, "above")) and "above" in str(above)
    null = boot.interval(0.01, reps, "ece")  # [-0.065, -0.015]: below 0 altogether
    assert np.isnan(null.low) and not null.has_interval and null.flag == "null" and "no interval" in str(null)
    zero = boot.interval(0.0, np.zeros(10), "u_ece")  # every resample exactly 0 (no under-confident bin at all)
    assert (zero.low, zero.high, zero.flag) == (0.0, 0.0, "zero")
    squared = boot.interval(
        0.1, reps, "debiased_ece", plugin=0.05, estimate=0.04, power=2
    )  # sqrt of 0.09 - (0.085, 0.035)
    assert (squared.low, squared.high) == pytest.approx((np.sqrt(0.005), np.sqrt(0.055)))
    none = boot.interval(0.2, reps, "mce")
    assert np.isnan(none.low) and none.method == "none" and "maximum over bins" in none.note


def test_default_call_unchanged_and_the_interval_behaves_like_the_float():
    logits, labels = _case(n=600)
    for f in FUNCTIONS:
        plain = f(logits, labels)
        assert type(plain) is float
        value = f(logits, labels, ci=0.9, n_boot=200)
        assert isinstance(value, MetricInterval) and float(value) == plain
        assert value.level == 0.9 and value.n_boot == 200
        assert value.low <= value.high if f is not mce else np.isnan(value.low) and np.isnan(value.high)
        assert value + 0 == plain and round(value, 6) == round(plain, 6) and f"{value:.5f}" == f"{plain:.5f}"
        assert json.loads(json.dumps({"v": value}))["v"] == plain
        back = pickle.loads(pickle.dumps(value))
        assert (float(back), back.method, back.note, back.n_boot) == (plain, value.method, value.note, 200)
        assert back.low == value.low or np.isnan(value.low)
    # the defaults: 1,000 resamples, 200 for the metrics that cost O(N) or O(N K) more per resample
    assert smce(logits, labels, ci=0.9).n_boot == 200 and classwise_ece(logits, labels, ci=0.9).n_boot == 200
    assert ece(logits, labels, ci=0.9).n_boot == 1000
    value = ece(logits, labels, ci=0.95)
    assert value.note == "" and str(value) == f"{float(value):.4f} [{value.low:.4f}, {value.high:.4f}]"
    assert value.format(100, 2, " %") == f"{100 * float(value):.2f} % [{100 * value.low:.2f}, {100 * value.high:.2f}]"
    assert flat_intervals({"ece": value, "n": 3}) == {
        "ece": float(value),
        "ece_ci_low": value.low,
        "ece_ci_high": value.high,
        "n": 3,
    }
    assert value.to_dict() == {
        "value": float(value),
        "low": value.low,
        "high": value.high,
        "level": 0.95,
        "n_boot": 1000,
        "method": "basic",
        "note": "",
    }
    split = ece_split(logits, labels, ci=0.95)
    assert float(split.over) + float(split.under) == pytest.approx(ece(logits, labels), abs=1e-12)


def test_mce_has_no_interval_and_says_why():
    logits, labels = _case(n=600)
    value = mce(logits, labels, ci=0.95)
    assert float(value) == mce(logits, labels) and not value.has_interval and value.method == "none"
    assert str(value) == f"{float(value):.4f} [no interval] ({value.note})" and "Andrews" in value.note
    assert value.to_dict()["low"] is None and json.dumps(value.to_dict())  # strict JSON: null, never NaN
    flat = flat_intervals({"mce": value})
    assert np.isnan(flat["mce_ci_low"]) and np.isnan(flat["mce_ci_high"])
    assert "MetricInterval(value=" in repr(value) and "note=" in repr(value)


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
        ({"ci": 95}, ValueError, "`ci`"),
        ({"ci": 1.0}, ValueError, "`ci`"),
        ({"ci": "0.95"}, TypeError, "`ci`"),
        ({"ci": 0.95, "n_boot": 5}, ValueError, "`n_boot`"),
        ({"ci": 0.95, "n_boot": 1.5}, TypeError, "`n_boot`"),
        ({"ci": 0.95, "seed": -1}, ValueError, "`seed`"),
    ]:
        with pytest.raises(err, match=word):
            f(logits, labels, **kwargs)


def test_report_intervals_are_the_functions_intervals_and_print_as_the_papers():
    logits, labels = _case(n=700, seed=9)
    report = calibration_report(logits, labels, ci=0.95, n_boot=300, seed=4)
    functions = {
        "ece": ece,
        "adaece": adaece,
        "mce": mce,
        "classwise_ece": classwise_ece,
        "smce": smce,
        "smece": smece,
        "brier": brier,
        "nll": nll,
    }
    for name, f in functions.items():  # the same seed gives the same resamples: the same intervals, exactly
        value = f(logits, labels, ci=0.95, n_boot=300, seed=4)
        assert float(report[name]) == float(value), name
        np.testing.assert_array_equal([report[name].low, report[name].high], [value.low, value.high])
        assert (report[name].method, report[name].note) == (value.method, value.note)
    split = ece_split(logits, labels, ci=0.95, n_boot=300, seed=4)
    assert report.o_ece.low == split.over.low and report.u_ece.high == split.under.high
    text = str(report)
    assert f"{100 * float(report.ece):.2f} % [{100 * report.ece.low:.2f}, {100 * report.ece.high:.2f}]" in text
    assert "(95 % bootstrap intervals, 300 resamples; " in text  # n_boot given: every metric's
    assert "basic (bias-corrected): ECE" in text and "percentile: Accuracy" in text and "none: MCE" in text
    assert (
        f"{100 * float(report.mce):.2f} % [no interval] (1)" in text and "(1) MCE: MCE is a maximum over bins" in text
    )
    assert "[" not in str(calibration_report(logits, labels))  # the default table is unchanged
    assert calibration_report(logits, labels).intervals() == {}


def test_every_interval_of_a_calibrated_model_holds_its_estimate_or_says_why():
    """The issue's complaint: intervals that exclude their own estimate. On a calibrated model (where the plug-in
    errors are mostly bias) every interval of the report holds its estimate, or carries a note that is printed."""
    rng = np.random.default_rng(1)
    flagged = 0
    for _ in range(5):
        z = rng.normal(size=(1000, 10)) * 2
        p = ref.softmax(z)
        y = (p.cumsum(1) > rng.random((1000, 1))).argmax(1)  # labels drawn from the model itself
        report = calibration_report(z, y, ci=0.95)
        text = str(report)
        for name, value in report.intervals().items():
            if not value.low <= float(value) <= value.high:
                assert value.note and value.note in text, name
            flagged += bool(value.note)
        assert report.mce.note in text
    assert flagged > 5  # near 0 the notes do appear (the interval reaches 0, or the estimate is above it)


# ------------------------------------------------------------------------------------------------ coverage
# Synthetic data with a known calibration map: K = 3 rows [p, (1-p)/2, (1-p)/2] with p ~ U(1/3, 1), right
# with probability f(p) = 0.7 p (over-confident, as deep networks are), else one of the two others. The gap
# p - f(p) = 0.3 p is positive everywhere, so every population ECE-type value (any bins) is
# E[p - f(p)] = 0.3 * 2/3, and smCE (sup over 1-Lipschitz w) takes w = 1: the same number. It is at least
# 0.1, ~2.5 times a bin's noise at N = 2,000, so the plug-in is nearly unbiased here; near 0 it is not, and
# benchmarks/bootstrap_coverage.py measures every metric there too. Brier and NLL are integrals of the known
# map (scipy's quad).

_LO = 1.0 / 3.0


def _f(p):
    return 0.7 * p


def _true_values() -> dict[str, float]:
    gap = 0.3 * (1 + _LO) / 2
    other = lambda p: (1 - p) / 2  # noqa: E731

    def brier_row(p):
        return _f(p) * ((1 - p) ** 2 + 2 * other(p) ** 2) + (1 - _f(p)) * (p**2 + (1 - other(p)) ** 2 + other(p) ** 2)

    nll_row = lambda p: -(_f(p) * np.log(p) + (1 - _f(p)) * np.log(other(p)))  # noqa: E731
    mean = lambda g: integrate.quad(g, _LO, 1)[0] / (1 - _LO)  # noqa: E731
    return {"ece": gap, "adaece": gap, "smce": gap, "brier": mean(brier_row), "nll": mean(nll_row)}


def test_true_values_by_a_huge_sample():
    """The analytic truths against the plain metrics of one sample of 2e6 (their noise is ~1e-3)."""
    rng = np.random.default_rng(0)
    probs, labels = _synthetic(rng, 2_000_000)
    for name, value in _true_values().items():
        assert {"ece": ece, "adaece": adaece, "smce": smce, "brier": brier, "nll": nll}[name](
            probs, labels
        ) == pytest.approx(value, abs=2e-3)


def _synthetic(rng, n):
    p = rng.uniform(_LO, 1.0, n)
    probs = np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)
    return probs, np.where(rng.random(n) < _f(p), 0, rng.integers(1, 3, n))


def test_intervals_cover_the_true_values_at_their_level():
    """200 draws of N = 2,000, a 95 % interval each (1,000 resamples; smCE its default 200; basic intervals for
    ECE, AdaECE and smCE, percentile for Brier and NLL): every interval covers the truth >= 93 % of the time (the
    binomial noise of 200 draws is 1.5 points)."""
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
