"""The temperature read off the perturbation ladder, its label-free check, and the shift report's check: the ladder's
temperatures against scipy's NLL minimum, the interpolation worked by hand, and the ATC estimate computed here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.shift import shift_report
from hf_calibration.shift.ladder import DISAGREEMENT, adapt_on_ladder, label_free_check, ladder_table


def _levels(seed: int = 0):
    """Logits whose accuracy falls level by level while their scale (the confidence) falls much less: a ladder."""
    rng = np.random.default_rng(seed)
    n, k = 400, 5
    y = rng.integers(0, k, n)
    levels = []
    for noise in (0.0, 1.0, 2.0, 4.0):
        signal = np.eye(k)[y] * 3.0 + rng.normal(size=(n, k)) * (1.0 + noise)
        levels.append(signal * 2.0)
    return levels, y


@pytest.fixture(scope="module")
def ladder():
    levels, y = _levels()
    ts = TemperatureScaling().fit(levels[0], y, progress_bar=False)
    return ts, levels, y, ladder_table(ts, levels, y)


def test_ladder_temperatures_minimise_each_levels_nll(ladder):
    ts, levels, y, table = ladder
    for z, t in zip(levels, table["temperature"]):
        calibrated = ts(torch.from_numpy(z)).double().numpy()

        def nll(log_t, calibrated=calibrated):
            return -log_softmax(calibrated / np.exp(log_t), axis=1)[np.arange(len(y)), y].mean()

        best = np.exp(minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-8}).x)
        assert t == pytest.approx(best, rel=1e-3)
    assert table["temperature"][-1] > table["temperature"][0] and table["accuracy"][-1] < table["accuracy"][0]


def test_adapt_on_ladder_interpolates_the_temperature_at_the_batch_estimate(ladder):
    ts, levels, y, table = ladder
    batch = levels[2][:200]
    calibrated = ts(torch.from_numpy(batch)).double()
    conf = torch.softmax(calibrated, 1).amax(1).numpy()
    estimate = float(np.mean(conf > table["threshold"]))
    x, logt = np.array(table["atc_estimate"]), np.log(table["temperature"])
    order = np.argsort(x)
    want = np.exp(np.interp(estimate, x[order], logt[order]))
    adapted = adapt_on_ladder(ts, batch, table)
    info = adapted.fit_info_["adaptation"]
    assert info["method"] == "ladder" and info["atc_estimate"] == estimate
    assert info["temperature"] == pytest.approx(want, rel=1e-9)
    out = adapted(torch.from_numpy(batch)).double()
    torch.testing.assert_close(out, calibrated / want)
    assert torch.equal(out.argmax(1), torch.from_numpy(batch).argmax(1))
    assert info["check"]["ok"]  # a batch from the ladder itself passes


def test_label_free_check_flags_disagreement_and_out_of_range():
    table = {"accuracy": [0.9, 0.5, 0.2], "atc_estimate": [0.9, 0.5, 0.2], "mean_confidence": [0.95, 0.8, 0.6]}
    fine = label_free_check(table, 0.5, 0.8)  # both read 0.5
    assert fine["ok"] and fine["disagreement"] == pytest.approx(0.0)
    split = label_free_check(table, 0.9, 0.6)  # ATC reads 0.9, the confidence 0.2
    assert not split["ok"] and split["disagreement"] == pytest.approx(0.7) and split["disagreement"] > DISAGREEMENT
    beyond = label_free_check(table, 0.2, 0.3)  # a mean confidence the ladder never reached
    assert not beyond["ok"] and not beyond["in_ladder_range"]


def test_shift_report_rows_carry_the_label_free_check():
    levels, y = _levels(1)
    report = shift_report((levels[0], y), (levels[0], y), {("noise", 3): (levels[3], y)}, calibrators=("ts",))
    row = next(r for r in report.rows if r["method"] == "ts" and r["severity"] == 3)
    ts = TemperatureScaling().fit(levels[0], y, progress_bar=False)
    p = torch.softmax(ts(torch.from_numpy(levels[3])).double(), 1).amax(1).numpy()
    assert row["estimated_accuracy"] == pytest.approx(np.mean(p > ts.fit_info_["atc_threshold"]))
    assert row["confidence"] == pytest.approx(p.mean())
    assert row["check_flags"] == (abs(p.mean() - row["estimated_accuracy"]) > 0.05)
    assert "Label-free check" in str(report)


def test_fit_on_perturbed_records_its_ladder_and_adapt_on_ladder_reads_it():
    from hf_calibration.shift import fit_on_perturbed

    levels, y = _levels(2)
    recipe = {"perturbation": "gaussian_noise", "strengths": [0.0, 1.0, 2.0, 4.0]}
    with pytest.warns(UserWarning):  # the clean-side cost of a union fit (ShiftTradeoffWarning), said here
        calibrator = fit_on_perturbed(levels, y, "temperature_scaling", recipe=recipe)
    recorded = calibrator.fit_info_["shift_fit"]["ladder"]
    assert recorded == ladder_table(calibrator, levels, y)
    adapted = adapt_on_ladder(calibrator, levels[3][:100])
    assert (
        adapted.fit_info_["adaptation"]
        == adapt_on_ladder(calibrator, levels[3][:100], recorded).fit_info_["adaptation"]
    )
    with pytest.raises(ValueError, match="`table`"):
        adapt_on_ladder(TemperatureScaling().fit(levels[0], y, progress_bar=False), levels[3])
