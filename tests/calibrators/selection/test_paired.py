"""Paired bootstrap of every calibrator against the best: pooled values, paired differences, wins."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration.calibrators import compare_calibrators
from hf_calibration.calibrators.selection.paired import paired_bootstrap
from hf_calibration.metrics import adaece, ece, nll, smce
from hf_calibration.metrics.bootstrap import check_bootstrap


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 600)
    logits = 2.5 * rng.standard_normal((600, 4)) + 3.0 * np.eye(4)[labels]
    return compare_calibrators(
        logits, labels, ["temperature_scaling", "isotonic"], cv=3, keep_predictions=True, progress_bar=False
    )


@pytest.mark.parametrize("metric,function", [("ece", ece), ("adaece", adaece), ("smce", smce), ("nll", nll)])
def test_pooled_values_and_paired_differences(table, metric, function):
    result = table.paired_bootstrap(metric, n_boot=40, seed=3)
    best = table.best(metric)
    assert result.best == best and list(result.pooled) == table.methods
    y = table.labels
    for method, predictions in table.predictions.items():
        assert float(result.pooled[method]) == pytest.approx(function(predictions, y, from_logits=True), abs=1e-12)
    # the differences are paired: recompute them on explicit resamples (the rows each count vector draws)
    counts = np.concatenate(list(check_bootstrap(0.95, 40, 3)._blocks(len(y))))
    rows = [np.repeat(np.arange(len(y)), c) for c in counts]

    def resampled(method):
        return np.array([function(table.predictions[method][r], y[r], from_logits=True) for r in rows])

    reference = resampled(best)
    full = {method: function(table.predictions[method], y, from_logits=True) for method in table.methods}
    for method in table.methods:
        diff = resampled(method) - reference
        q_low, q_high = np.quantile(diff, [0.025, 0.975])
        # the metric's own interval method: basic (2 d - q) for the calibration errors, percentile for NLL
        d = full[method] - full[best]
        low, high = (q_low, q_high) if metric == "nll" else (2 * d - q_high, 2 * d - q_low)
        assert (result.difference[method].low, result.difference[method].high) == pytest.approx((low, high), abs=1e-12)
        # issue 29 item 13: counted on the resampled differences centred on the pooled one (a binned metric's resamples
        # are biased, and "wins 62 %" stood beside a positive, worse, difference)
        point = function(table.predictions[method], y, from_logits=True) - function(
            table.predictions[best], y, from_logits=True
        )
        assert result.wins[method] == pytest.approx(np.mean(diff - np.median(diff) + point < 0))
        assert point <= 0 or result.wins[method] <= 0.5
        own = resampled(method)
        q_low, q_high = np.quantile(own, [0.025, 0.975])
        low, high = (
            (q_low, q_high) if metric == "nll" else (max(2 * full[method] - q_high, 0.0), 2 * full[method] - q_low)
        )
        assert (result.pooled[method].low, result.pooled[method].high) == pytest.approx((low, high), abs=1e-12)
    assert (result.difference[best].low, result.difference[best].high, result.wins[best]) == (0.0, 0.0, 0.0)
    text = str(result)
    assert f"Paired bootstrap against the best by {metric} ({best})" in text and "beats" in text


def test_a_copy_of_the_best_never_wins_and_a_failed_method_is_left_out(table):
    best = table.best("ece")
    table.predictions["copy"] = table.predictions[best].copy()
    table.predictions["broken"] = np.full_like(table.predictions[best], np.nan)
    try:
        result = paired_bootstrap(table, "ece", n_boot=50)
        assert result.difference["copy"].low == result.difference["copy"].high == 0.0 and result.wins["copy"] == 0.0
        assert result.skipped == ("broken",) and "broken" not in result.pooled and "broken" in str(result)
        assert result.to_dict()["methods"]["copy"]["wins"] == 0.0
    finally:
        del table.predictions["copy"], table.predictions["broken"]


def test_needs_the_kept_predictions():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 300)
    logits = rng.standard_normal((300, 3)) + 2 * np.eye(3)[labels]
    bare = compare_calibrators(logits, labels, ["temperature_scaling"], cv=2, progress_bar=False)
    with pytest.raises(ValueError, match="keep_predictions"):
        bare.paired_bootstrap("ece")
    kept = compare_calibrators(logits, labels, ["temperature_scaling"], cv=2, keep_predictions=True, progress_bar=False)
    with pytest.raises(ValueError, match="`metric`"):
        kept.paired_bootstrap("accuracy")
    with pytest.raises(ValueError, match="`ci`"):
        kept.paired_bootstrap("ece", ci=95)
    with pytest.raises(ValueError, match="`best`"):
        kept.paired_bootstrap("ece", best="nope")
