"""The metric table: a metric added as one row (its function is the test's) appears in the report, its intervals, the
binary / multi-label report, both accumulators and the evaluate scripts; the table's rows are well formed."""

from __future__ import annotations

import evaluate
import numpy as np
import pytest
from scipy.special import expit, softmax

from hf_calibration import metric_path
from hf_calibration.hub.evaluate_metric import metric_class
from hf_calibration.metrics import CalibrationAccumulator, calibration_report, format_reports
from hf_calibration.metrics.bootstrap import INTERVALS, Bootstrap, MetricInterval, frame
from hf_calibration.metrics.table import HEADS, Metric, get_metric, list_metrics, register_metric, unregister_metric

RNG = np.random.default_rng(7)
Z = RNG.normal(scale=2.0, size=(120, 4))
Y = RNG.integers(0, 4, 120)
ZL = RNG.normal(size=(80, 3))
YL = (RNG.random((80, 3)) < 0.4).astype(int)


def _gap(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    """Calibration in the large, ``|mean(a - p)|``: the toy metric the tests register."""
    return float(abs(np.mean(a - p)))


def mean_gap(preds, target, *, from_logits=None, ci=None, n_boot=None, seed=0):
    """The toy metric's function (multi-class): ``|mean(a - p)|`` of the top label."""
    return calibration_report(preds, target, from_logits=from_logits, ci=ci, n_boot=n_boot, seed=seed)["mean_gap"]


@pytest.fixture()
def toy():
    row = register_metric(
        Metric("mean_gap", mean_gap, "Mean gap", heads=("multiclass",), report_heads=HEADS, point=_gap)
    )
    yield row
    unregister_metric("mean_gap")


def _hand_multiclass(z: np.ndarray, y: np.ndarray) -> float:
    p = softmax(z, axis=1)
    return abs(float(np.mean((p.argmax(1) == y) - p.max(1))))


def test_a_new_metric_is_one_row(toy) -> None:
    expected = _hand_multiclass(Z, Y)
    report = calibration_report(Z, Y)
    assert report["mean_gap"] == pytest.approx(expected, abs=1e-12) and report.mean_gap == report["mean_gap"]
    assert list(report)[-1] == "mean_gap" and "Mean gap (%)" in str(report)
    assert "Mean gap" in format_reports({"model": report}, ["ece", "mean_gap"])

    # the intervals: the basic bootstrap of the same resamples, formed by hand from the count vectors
    with_ci = calibration_report(Z, Y, ci=0.9, n_boot=20, seed=3)
    value = with_ci["mean_gap"]
    assert isinstance(value, MetricInterval) and value.method == "basic" and float(value) == report["mean_gap"]
    p = softmax(Z, axis=1)
    conf, correct = p.max(1), (p.argmax(1) == Y).astype(float)
    order = frame(conf)
    boot = Bootstrap(0.9, 20, 3)
    reps = np.array([abs(np.sum(c * (correct[order] - conf[order])) / c.sum()) for c in boot._draw(len(Y), 0, 20)])
    q_low, q_high = np.quantile(reps, [0.05, 0.95])
    assert value.low == pytest.approx(max(2 * expected - q_high, 0.0), abs=1e-12)
    assert value.high == pytest.approx(max(2 * expected - q_low, 0.0), abs=1e-12)
    assert INTERVALS["mean_gap"] is toy.interval

    # a multi-label head: the row's point form per label, against each label's sigmoid probability
    multilabel = calibration_report(ZL, YL)
    per_label = [abs(float(np.mean(YL[:, l] - expit(ZL[:, l])))) for l in range(3)]
    assert multilabel.per_label["mean_gap"] == pytest.approx(per_label, abs=1e-12)
    assert multilabel.macro["mean_gap"] == pytest.approx(np.mean(per_label), abs=1e-12)
    assert multilabel.micro["mean_gap"] == pytest.approx(abs(float(np.mean(YL - expit(ZL)))), abs=1e-12)
    ml_ci = calibration_report(ZL, YL, ci=0.9, n_boot=20)
    assert isinstance(ml_ci.macro["mean_gap"], MetricInterval) and ml_ci.macro["mean_gap"].has_interval

    # both accumulators: from the kept (confidence, correct) pairs
    acc = CalibrationAccumulator(confidence_dtype="float64")
    for rows in np.array_split(np.arange(len(Y)), 3):
        acc.update(Z[rows], Y[rows])
    assert acc.compute()["mean_gap"] == pytest.approx(expected, abs=1e-12)
    acc = CalibrationAccumulator(metrics=["mean_gap"], ci=0.9, n_boot=20, seed=3)
    acc.update(Z, Y)
    assert acc.compute()["mean_gap"].low == pytest.approx(value.low, abs=1e-12)
    ml_acc = CalibrationAccumulator(confidence_dtype="float64")
    ml_acc.update(ZL, YL)
    assert ml_acc.compute().macro["mean_gap"] == pytest.approx(np.mean(per_label), abs=1e-12)

    # the evaluate scripts: the report's script has it, and the one script class serves the row's own function
    results = evaluate.load(metric_path("calibration")).compute(predictions=Z, references=Y)
    assert results["calibration_mean_gap"] == pytest.approx(expected, abs=1e-12)
    script = metric_class("mean_gap", __name__)()
    assert script.compute(predictions=Z, references=Y) == {"mean_gap": report["mean_gap"]}
    assert "mean_gap (`float`): Mean gap" in script.inputs_description


def test_rows_are_well_formed() -> None:
    for name in list_metrics():
        row = get_metric(name)
        assert row.fn is None or callable(row.fn), name
        if row.point is not None:
            assert isinstance(row.top_label(np.array([0.9, 0.6]), np.array([1.0, 0.0]), 15), float), name
    assert list_metrics(head="multiclass", report=True) == (
        "accuracy",
        "ece",
        "adaece",
        "mce",
        "classwise_ece",
        "o_ece",
        "u_ece",
        "smce",
        "smece",
        "brier",
        "nll",
    )
    assert get_metric("mce").interval.method == "none" and get_metric("nll").interval.method == "percentile"


def test_bad_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="`name`"):
        Metric("not a name", None, "X", point=_gap)
    with pytest.raises(ValueError, match="`heads`"):
        Metric("x", None, "X", heads=("softmax",), point=_gap)
    with pytest.raises(ValueError, match="`point`"):
        Metric("x", None, "X")  # state 'pairs' needs the point form
    with pytest.raises(ValueError, match="already registered"):
        register_metric(Metric("ece", None, "ECE", point=_gap))
    with pytest.raises(ValueError, match="state"):
        register_metric(Metric("x", None, "X", state="bins", point=_gap))
    with pytest.raises(TypeError, match="`metric`"):
        register_metric("x")
    with pytest.raises(ValueError, match="`name`"):
        get_metric("no_such_metric")
    with pytest.raises(ValueError, match="user metric"):
        unregister_metric("ece")
