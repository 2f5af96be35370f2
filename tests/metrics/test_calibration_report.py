"""calibration_report: one call, the same numbers as each function, printed as the papers print them."""

import _metric_reference as ref
import numpy as np
import pytest
import torch

from hf_calibration.metrics import (
    CalibrationReport,
    _format,
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    ece,
    ece_split,
    format_reports,
    mce,
    nll,
)


def _case(n=1500, k=10, seed=0):
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(n, k)) * 2).astype(np.float32)
    target = np.where(rng.random(n) < 0.7, logits.argmax(1), rng.integers(0, k, n))
    target[:25] = -100
    return logits, target


def test_values_equal_the_functions():
    logits, target = _case()
    report = calibration_report(torch.from_numpy(logits), torch.from_numpy(target), 12)
    kept = target != -100
    conf, correct = ref.top_label(ref.softmax(logits[kept]), target[kept])
    assert report.n == kept.sum()
    assert report.accuracy == pytest.approx(correct.mean(), abs=1e-15)
    assert report.ece == ece(logits, target, 12)
    assert report.adaece == adaece(logits, target, 12)
    assert report.mce == mce(logits, target, 12)
    assert report.classwise_ece == pytest.approx(classwise_ece(logits, target, 12), abs=1e-14)
    assert (report.o_ece, report.u_ece) == tuple(ece_split(logits, target, 12))
    assert report.brier == pytest.approx(brier(logits, target), abs=1e-14)
    assert report.nll == pytest.approx(nll(logits, target), abs=1e-14)
    assert report.o_ece + report.u_ece == pytest.approx(report.ece, abs=1e-15)
    # against the loop reference too (float32 logits: confidences within ~1e-7 of float64)
    assert report.ece == pytest.approx(ref.loop_ece(conf, correct, 12), abs=1e-6)


def test_smooth_metrics_are_included():
    from hf_calibration.metrics import smce, smece

    logits, target = _case(seed=1)
    report = calibration_report(logits, target)
    assert report.smce is not None and report.smece is not None
    assert report.smce == pytest.approx(smce(logits, target), abs=1e-12)
    assert report.smece == pytest.approx(smece(logits, target), abs=1e-12)


def test_softmax_runs_once_for_the_top_label(monkeypatch):
    calls = []
    original = _format.top_label

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    import hf_calibration.metrics.report as report_module

    monkeypatch.setattr(report_module, "top_label", counting)
    calibration_report(*_case(n=200))
    assert len(calls) == 1


def test_mapping_and_printing():
    logits, target = _case(seed=2)
    report = calibration_report(logits, target)
    assert isinstance(report, CalibrationReport)
    keys = ["n", "accuracy", "ece", "adaece", "mce", "classwise_ece", "o_ece", "u_ece", "smce", "smece", "brier", "nll"]
    assert list(report) == keys and list(report.to_dict()) == keys
    assert dict(report) == report.to_dict()
    assert report["ece"] == report.ece
    with pytest.raises(KeyError):
        report["n_bins"]
    text = str(report)
    for label, key in [
        ("ECE (%)", "ece"),
        ("AdaECE (%)", "adaece"),
        ("O-ECE (%)", "o_ece"),
        ("Accuracy (%)", "accuracy"),
    ]:
        line = next(l for l in text.splitlines() if l.startswith(label + " "))
        assert line.split()[-1] == f"{100 * report[key]:.2f}"
    assert f"{report.nll:.4f}" in text


def test_format_reports_side_by_side():
    logits, target = _case(seed=3)
    reports = {"uncalibrated": calibration_report(logits, target), "T = 2": calibration_report(logits / 2, target)}
    table = format_reports(reports)
    lines = table.splitlines()
    assert lines[0].split("|")[1].strip() == "method"
    assert [c.strip() for c in lines[0].split("|")[2:-1]] == [
        "Accuracy (%)",
        "ECE (%)",
        "AdaECE (%)",
        "smCE (%)",
        "O-ECE (%)",
        "U-ECE (%)",
    ]
    row = [c.strip() for c in lines[3].split("|")[1:-1]]
    r = reports["T = 2"]
    assert row == ["T = 2"] + [f"{100 * r[c]:.2f}" for c in ("accuracy", "ece", "adaece", "smce", "o_ece", "u_ece")]
    custom = format_reports(reports, columns=["ece", "brier"])
    assert "Brier" in custom.splitlines()[0] and f"{r.brier:.4f}" in custom
    with pytest.raises(ValueError, match="`columns`"):
        format_reports(reports, columns=["ECE"])
    with pytest.raises(ValueError, match="`reports`"):
        format_reports({})
