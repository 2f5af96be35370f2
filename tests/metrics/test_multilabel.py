"""Binary and multi-label (sigmoid head) metrics against torchmetrics, scikit-learn and brute-force bootstraps."""

import numpy as np
import pytest
import torch

from hf_calibration.metrics import (
    adaece,
    brier,
    calibration_report,
    ece,
    mce,
    nll,
    reliability_diagram,
    reliability_table,
    rmsce,
)
from hf_calibration.metrics.bootstrap import INTERVALS, Bootstrap
from hf_calibration.metrics.multilabel import SigmoidCalibrationReport


def _binary(n=3000, seed=0, shift=1.5):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.int64)
    z = shift * (2 * y - 1) + 2.0 * rng.normal(size=n)  # over-confident logits of a binary head
    return z, y


def _multilabel(n=2000, labels=4, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < np.linspace(0.1, 0.6, labels)).astype(np.int64)
    z = 2.5 * (2 * y - 1) + 2.0 * rng.normal(size=(n, labels)) + rng.normal(size=labels)
    return z, y


def _torchmetrics_binary(p, y, norm):
    from torchmetrics.functional.classification import binary_calibration_error

    return float(binary_calibration_error(torch.from_numpy(p).double(), torch.from_numpy(y), n_bins=15, norm=norm))


@pytest.mark.parametrize("norm, fn", [("l1", ece), ("l2", rmsce), ("max", mce)])
@pytest.mark.parametrize("as_probs", [False, True])
def test_binary_equals_torchmetrics(norm, fn, as_probs):
    z, y = _binary()
    p = 1 / (1 + np.exp(-z))
    preds = p if as_probs else z
    expected = _torchmetrics_binary(p, y, norm)
    assert fn(preds, y) == pytest.approx(expected, abs=1e-6)
    assert fn(preds[:, None], y) == pytest.approx(expected, abs=1e-6)  # (N, 1) column
    assert fn(torch.from_numpy(preds), torch.from_numpy(y), task="binary") == pytest.approx(expected, abs=1e-6)


def test_binary_two_softmax_logits_equal_one_logit():
    z, y = _binary()
    two = np.stack([np.zeros_like(z) - 0.3, z - 0.3], axis=1)  # log-odds z, shifted: softmax unchanged
    for fn in (ece, rmsce, mce, adaece, brier, nll):
        assert fn(two, y, task="binary") == pytest.approx(fn(z, y), rel=1e-10, abs=1e-12)
    # the same head read as a K = 2 softmax gives the top-label ECE: another number, and the default for (N, 2)
    assert ece(two, y) != pytest.approx(ece(z, y))


def test_binary_scores_equal_sklearn():
    from sklearn.metrics import brier_score_loss, log_loss

    z, y = _binary()
    p = 1 / (1 + np.exp(-z))
    assert brier(z, y) == pytest.approx(brier_score_loss(y, p), rel=1e-12)
    assert nll(z, y) == pytest.approx(log_loss(y, p), rel=1e-9)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(torch.from_numpy(z), torch.from_numpy(y).double())
    assert nll(z, y) == pytest.approx(float(bce), rel=1e-12)


def test_binary_adaece_by_hand():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    y = np.array([0, 0, 1, 1])
    # equal-mass bins {0.1, 0.2} and {0.3, 0.4}: |0 - 0.15| / 2 + |1 - 0.35| / 2
    assert adaece(p, y, n_bins=2) == pytest.approx(0.4)
    assert ece(p, y, n_bins=2) == pytest.approx(0.25)  # equal-width: all four in (0, 0.5], |0.5 - 0.25|


def test_multilabel_macro_micro_per_label():
    z, y = _multilabel()
    p = 1 / (1 + np.exp(-z))
    per = np.array([_torchmetrics_binary(p[:, l], y[:, l], "l1") for l in range(y.shape[1])])
    assert ece(z, y, average="none") == pytest.approx(per, abs=1e-6)
    assert ece(z, y) == pytest.approx(per.mean(), abs=1e-6)
    assert ece(z, y, average="micro") == pytest.approx(_torchmetrics_binary(p.ravel(), y.ravel(), "l1"), abs=1e-6)
    from sklearn.metrics import brier_score_loss, log_loss

    assert brier(z, y) == pytest.approx(np.mean([brier_score_loss(y[:, l], p[:, l]) for l in range(4)]), rel=1e-10)
    assert nll(z, y, average="micro") == pytest.approx(log_loss(y.ravel(), p.ravel()), rel=1e-9)


def test_multilabel_ignore_index_per_element():
    z, y = _multilabel(n=500)
    y = y.copy()
    rng = np.random.default_rng(1)
    hide = rng.random(y.shape) < 0.2
    y_masked = np.where(hide, -100, y)
    p = 1 / (1 + np.exp(-z))
    per = [_torchmetrics_binary(p[~hide[:, l], l], y[~hide[:, l], l], "l1") for l in range(4)]
    assert ece(z, y_masked, average="none") == pytest.approx(per, abs=1e-6)
    assert ece(z, y_masked, average="micro") == pytest.approx(_torchmetrics_binary(p[~hide], y[~hide], "l1"), abs=1e-6)


def _brute_force_replicates(fn, z, y, n_boot, seed):
    """The statistic recomputed from explicitly resampled arrays (np.repeat of each resample's counts)."""
    boot = Bootstrap(0.9, n_boot, seed)
    values = []
    for block in boot._blocks(z.shape[0]):
        for counts in block:
            rows = np.repeat(np.arange(z.shape[0]), counts)
            values.append(fn(z[rows], y[rows]))
    return boot, np.array(values)


@pytest.mark.parametrize("average", ["macro", "micro"])
@pytest.mark.parametrize("name", ["ece", "rmsce", "mce", "brier", "nll"])
def test_multilabel_interval_equals_brute_force_bootstrap(name, average):
    fn = {"ece": ece, "rmsce": rmsce, "mce": mce, "brier": brier, "nll": nll}[name]
    z, y = _multilabel(n=300, labels=3, seed=2)
    y = np.where(np.random.default_rng(3).random(y.shape) < 0.1, -100, y)  # ignored elements: totals vary by resample
    value = fn(z, y, average=average, ci=0.9, n_boot=50, seed=7)
    boot, reps = _brute_force_replicates(lambda a, b: fn(a, b, average=average), z, y, 50, 7)
    # each metric's interval method, as the multi-class one (basic for the errors, none for MCE, percentile for scores)
    expected = boot.interval(fn(z, y, average=average), reps, INTERVALS.get(name, INTERVALS["ece"]))
    assert float(value) == pytest.approx(float(expected), rel=1e-12)
    assert (value.low, value.high) == pytest.approx((expected.low, expected.high), rel=1e-9, abs=1e-12, nan_ok=True)
    assert value.method == {"mce": "none", "brier": "percentile", "nll": "percentile"}.get(name, "basic")


def test_binary_adaece_interval_equals_brute_force():
    z, y = _binary(n=400)
    value = adaece(z, y, ci=0.9, n_boot=40, seed=3)
    boot, reps = _brute_force_replicates(lambda a, b: adaece(a, b), z, y, 40, 3)
    expected = boot.interval(adaece(z, y), reps, "adaece")
    assert value.method == "basic" and (value.low, value.high) == pytest.approx((expected.low, expected.high), rel=1e-9)


def test_calibration_report_multilabel():
    z, y = _multilabel(n=800)
    report = calibration_report(z, y, label_names=["a", "b", "c", "d"])
    assert isinstance(report, SigmoidCalibrationReport) and report.task == "multilabel"
    assert report["ece"] == pytest.approx(ece(z, y), rel=1e-12)
    assert report.micro["nll"] == pytest.approx(nll(z, y, average="micro"), rel=1e-12)
    assert report.per_label["brier"] == pytest.approx(brier(z, y, average="none"), rel=1e-12)
    text = str(report)
    assert "macro (mean over labels)" in text and "pooled (micro)" in text
    table = report.per_label_table()
    assert "| a " in table and "macro (mean)" in table and "pooled (micro)" in table
    with_ci = calibration_report(z, y, ci=0.9, n_boot=30)
    assert with_ci.macro["ece"].low <= float(with_ci.macro["ece"]) <= with_ci.macro["ece"].high
    assert "bootstrap interval" in str(with_ci)


def test_calibration_report_binary_and_format():
    from hf_calibration.metrics import format_reports

    z, y = _binary(n=600)
    report = calibration_report(z, y)
    assert report.task == "binary" and report["ece"] == pytest.approx(ece(z, y), rel=1e-12)
    assert "binary head" in str(report)
    zm, ym = _multilabel(n=400)
    table = format_reports({"uncalibrated": calibration_report(zm, ym), "scaled": calibration_report(zm / 2, ym)})
    assert "Multi-label: macro" in table
    assert "pooled (micro)" in format_reports({"a": calibration_report(zm, ym)}, average="micro")


def test_reliability_table_and_diagram():
    z, y = _multilabel(n=500, labels=3)
    p = 1 / (1 + np.exp(-z))
    table = reliability_table(z, y, label=1, n_bins=10)
    bins = np.searchsorted(np.linspace(0, 1, 11)[1:-1], p[:, 1], side="left")
    assert table.count.tolist() == np.bincount(bins, minlength=10).tolist()
    assert table.ece == pytest.approx(ece(z, y, n_bins=10, average="none")[1], rel=1e-12)
    assert reliability_table(z, y).n == z.size  # pooled
    fig = reliability_diagram(z, y, ci=None)
    titles = [a.get_title() for a in fig.axes if a.get_title()]
    assert any("pooled (micro)" in t for t in titles) and sum("label" in t for t in titles) == 4
    fig = reliability_diagram(z, y, calibrated=z / 2, labels=["pooled"], ci=None)
    assert len([a for a in fig.axes if a.get_ylabel() == "observed frequency"]) == 2


def test_bad_inputs():
    z, y = _multilabel(n=50)
    with pytest.raises(ValueError, match="0/1 labels"):
        ece(z, y * 2)
    with pytest.raises(ValueError, match="Expected argument `average`"):
        ece(z, y, average="weighted")
    with pytest.raises(ValueError, match="`average` to be left at 'macro' for a multi-class"):
        ece(np.random.default_rng(0).normal(size=(10, 3)), np.zeros(10, dtype=int), average="micro")
    with pytest.raises(ValueError, match="same shape"):
        ece(z[:, :3], y)
    with pytest.raises(ValueError, match="finite"):
        ece(np.where(z > 3, np.nan, z), y)
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        ece(z, y, from_logits=False)


def test_binary_ignored_samples_are_dropped():
    z, y = _binary(n=400)
    y = y.copy()
    y[:25] = -100
    assert ece(z, y) == pytest.approx(ece(z[25:], y[25:]), rel=1e-12)
    value = adaece(z, y, ci=0.9, n_boot=20)  # an interval needs every kept sample: ignored ones are gone, not masked
    assert float(value) == pytest.approx(adaece(z[25:], y[25:]), rel=1e-12)


# ------------------------------------------------------------------ issue 45: changes to the maths no test saw


def test_probabilities_with_exact_zeros_and_ones_are_detected_as_probabilities():
    """Probabilities holding an exact 0.0 or 1.0 are probabilities: a ``<`` for ``<=`` in the detection read them as
    logits (binary ECE 0.053 -> 0.298, NLL 0.342 -> 0.629). torchmetrics puts p = 1.0 in a phantom bin (its issue 3510),
    so against it the 1.0 entries are moved one ulp down: in our rule both values share the last bin."""
    from torchmetrics.functional.classification import binary_calibration_error

    rng = np.random.default_rng(0)
    p = rng.random(2000)
    y = (rng.random(2000) < p).astype(np.int64)
    p[:40], y[:40] = 1.0, 1
    p[40:70], y[40:70] = 0.0, 0
    p[70:80] = 1.0  # confidently wrong
    below_one = np.where(p == 1.0, np.nextafter(1.0, 0.0), p)
    expected = binary_calibration_error(torch.from_numpy(below_one), torch.from_numpy(y), n_bins=15).item()
    assert ece(p, y, task="binary") == pytest.approx(expected, abs=1e-12)
    three = np.stack([p, p, p], axis=1), np.stack([y, y, y], axis=1)  # three copies of the label: the macro is the one
    assert ece(*three, task="multilabel") == pytest.approx(expected, abs=1e-12)
    with np.errstate(divide="ignore"):
        bce = -np.mean(np.where(y == 1, np.log(p), np.log1p(-p)))  # inf: a confidently wrong 1.0
    assert nll(p, y, task="binary") == bce == np.inf
    finite = slice(80, None)
    reference = torch.nn.functional.binary_cross_entropy(
        torch.from_numpy(p[finite]), torch.from_numpy(y[finite]).double()
    )
    assert nll(p[finite], y[finite], task="binary") == pytest.approx(float(reference), rel=1e-12)


def test_a_label_whose_entries_are_all_ignored_is_left_out_of_the_macro_average_with_a_warning():
    """By hand: the macro ECE is the mean over the labels that have kept entries (np.mean would turn it into NaN)."""
    rng = np.random.default_rng(1)
    y = (rng.random((500, 3)) < 0.3).astype(np.int64)
    z = 2 * (2 * y - 1) + 2 * rng.normal(size=y.shape)
    y_ignored = y.copy()
    y_ignored[:, 1] = -100
    by_hand = np.mean([ece(z[:, l], y[:, l], task="binary") for l in (0, 2)])
    with pytest.warns(UserWarning, match=r"Label\(s\) 1 have no kept entry"):
        macro = ece(z, y_ignored, task="multilabel")
    assert macro == pytest.approx(by_hand, abs=1e-15)
    with pytest.warns(UserWarning, match="no kept entry"):
        per_label = ece(z, y_ignored, task="multilabel", average="none")
    assert np.isnan(per_label[1]) and per_label[0] == pytest.approx(ece(z[:, 0], y[:, 0], task="binary"), abs=1e-15)


def test_a_sigmoid_report_lists_its_intervals_as_the_softmax_one_does():
    """``report.intervals()``, which the docs use, was missing on a sigmoid head's report (issue 40)."""
    rng = np.random.default_rng(2)
    y = (rng.random((600, 3)) < 0.3).astype(np.int64)
    z = 2 * (2 * y - 1) + 2 * rng.normal(size=y.shape)
    report = calibration_report(z, y, ci=0.9, n_boot=50)
    macro = report.intervals()
    assert set(macro) >= {"ece", "nll"} and all(
        np.isfinite([macro[k].low, macro[k].high]).all() for k in ("ece", "nll")
    )
    assert macro["ece"] == report.macro["ece"] and report.intervals("micro")["ece"] == report.micro["ece"]
    per_label = report.intervals("none")["ece"]
    assert len(per_label) == 3 and per_label[0] == pytest.approx(ece(z[:, 0], y[:, 0], task="binary"), abs=1e-12)
    assert calibration_report(z, y).intervals() == {}
