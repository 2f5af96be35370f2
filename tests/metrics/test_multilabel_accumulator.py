"""CalibrationAccumulator on a binary or multi-label head: batch by batch equals calibration_report at once."""

import numpy as np
import pytest
import torch

from hf_calibration.metrics import CalibrationAccumulator, calibration_report


def _data(n=900, labels=4, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < 0.3).astype(np.int64)
    z = 3.0 * (2 * y - 1) + 2.5 * rng.normal(size=y.shape)
    y[rng.random(y.shape) < 0.05] = -100
    return z, y


def _close(a, b):
    for key in b.macro:
        assert float(a.macro[key]) == pytest.approx(float(b.macro[key]), rel=1e-9, abs=1e-12), key
        assert float(a.micro[key]) == pytest.approx(float(b.micro[key]), rel=1e-9, abs=1e-12), key
        assert np.allclose(
            np.asarray(a.per_label[key], float), np.asarray(b.per_label[key], float), rtol=1e-9, equal_nan=True
        ), key


def test_batches_equal_the_batch_report():
    z, y = _data()
    acc = CalibrationAccumulator(confidence_dtype="float64")
    for start in range(0, len(z), 128):
        acc.update(torch.from_numpy(z[start : start + 128]), torch.from_numpy(y[start : start + 128]))
    _close(acc.compute(), calibration_report(z, y))


def test_binary_head_and_intervals():
    z, y = _data(labels=1)
    acc = CalibrationAccumulator(ci=0.9, n_boot=40)
    for part in np.array_split(np.arange(len(z)), 5):
        acc.update(z[part, 0], y[part, 0])
    batch = calibration_report(z[:, 0], y[:, 0], ci=0.9, n_boot=40)
    report = acc.compute()
    assert report.task == "binary"
    for key in ("ece", "nll", "brier", "mce"):
        assert (report.macro[key].low, report.macro[key].high) == pytest.approx(
            (batch.macro[key].low, batch.macro[key].high), rel=1e-9, nan_ok=True
        )  # MCE: no interval, NaN ends


def test_merge_state_dict_and_trainer_call():
    z, y = _data()
    a, b = CalibrationAccumulator(), CalibrationAccumulator()
    a.update(z[:400], y[:400])
    b.update(z[400:], y[400:])
    a.merge(b)
    whole = calibration_report(z, y)
    assert float(a.compute().macro["ece"]) == pytest.approx(float(whole.macro["ece"]), rel=1e-9)
    restored = CalibrationAccumulator().load_state_dict(a.state_dict())
    assert float(restored.compute().micro["nll"]) == pytest.approx(float(whole.micro["nll"]), rel=1e-9)

    class EvalPrediction:
        predictions, label_ids = z, y

    logged = CalibrationAccumulator()(EvalPrediction())
    assert logged["ece"] == pytest.approx(float(whole.macro["ece"]), rel=1e-6)
    assert logged["nll_micro"] == pytest.approx(float(whole.micro["nll"]), rel=1e-6)


def test_kinds_cannot_mix():
    z, y = _data()
    acc = CalibrationAccumulator()
    acc.update(np.random.default_rng(0).normal(size=(8, 4)), np.zeros(8, dtype=int))
    with pytest.raises(ValueError, match="multi-class batch like the earlier ones"):
        acc.update(z[:8], y[:8])
