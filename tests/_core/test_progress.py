"""Progress bars: nothing for short fits, a bar that ends at 100 % for long ones, and the global off switches."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibrators"))
from _calibrator_data import overconfident  # noqa: E402

from hf_calibration._core import progress as _progress  # noqa: E402
from hf_calibration.calibrators import SMARTCalibrator  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return overconfident(400, 5, seed=0)


def _fit(data, **kw):
    z, y = data
    return SMARTCalibrator(**kw).fit(z, y)  # progress_bar defaults to True


def test_a_short_fit_prints_nothing(capfd, monkeypatch, data):
    # a fit shorter than the bar's delay (an hour here, so a slow or busy machine cannot make it elapse): the
    # postfix updates of every step must not draw the bar before the delay, as they once did
    monkeypatch.setattr(_progress, "DELAY_S", 3600.0)
    _fit(data, max_steps=300)
    assert capfd.readouterr().err == ""


def test_a_bar_that_shows_ends_at_100_percent(capfd, monkeypatch, data):
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)  # as if the fit lasted
    smart = _fit(data, max_steps=2000, patience=20)
    steps = smart.fit_info_["steps"]
    assert steps < 2000  # early stopping ended it before the step budget
    err = capfd.readouterr().err
    frames = [f for f in re.split(r"[\r\n]", err) if f.strip()]
    assert frames and frames[-1].startswith("SMART: 100%"), frames[-3:]
    assert f"{steps}/{steps}" in frames[-1]
    assert len(frames) < 50  # refreshed at tqdm's pace, not at every postfix update


@pytest.mark.parametrize("switch", ["env", "hub_group", "hub_global"])
def test_global_off_switches(capfd, monkeypatch, data, switch):
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    if switch == "env":
        monkeypatch.setenv("HF_CALIBRATION_DISABLE_PROGRESS_BARS", "1")
        _fit(data, max_steps=50)
    else:
        group = "hf_calibration" if switch == "hub_group" else None
        disable_progress_bars(group)
        try:
            assert _progress.bars_disabled()
            _fit(data, max_steps=50)
        finally:
            enable_progress_bars(group)
    assert capfd.readouterr().err == ""
    assert not _progress.bars_disabled() or switch == "env"


def test_progress_bar_false_prints_nothing(capfd, monkeypatch, data):
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    z, y = data
    SMARTCalibrator(max_steps=50).fit(z, y, progress_bar=False)
    assert capfd.readouterr().err == ""


def test_iterator_bars_follow_the_same_switches(capfd, monkeypatch):
    # the bars over batches and epochs (predict_logits, MaC-Cal) go through progress_iter
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    assert list(_progress.progress_iter(range(3), desc="work")) == [0, 1, 2]
    assert "work: 100%" in capfd.readouterr().err
    monkeypatch.setenv("HF_CALIBRATION_DISABLE_PROGRESS_BARS", "1")
    assert list(_progress.progress_iter(range(3), desc="work")) == [0, 1, 2]
    assert capfd.readouterr().err == ""


def _lbfgs_fit():
    import torch

    from hf_calibration.calibrators._machinery.fitting.lbfgs import minimize

    target = torch.arange(5, dtype=torch.float64)
    minimize(lambda x: ((x - target) ** 2).sum(), torch.zeros(5), progress_bar=True, desc="LBFGS unit")


def _cts_fit(data):
    from hf_calibration.calibrators import ClassBasedTemperatureScaling

    z, y = data
    ClassBasedTemperatureScaling().fit(z, y)


def _matrix_cv_fit(data):
    from hf_calibration.calibrators import MatrixScaling

    z, y = data
    MatrixScaling(lambdas=(10.0, 1.0)).fit(z, y)


@pytest.mark.parametrize("work, desc", [("lbfgs", "LBFGS unit"), ("cts", "CTS"), ("matrix", "MatrixScaling CV")])
@pytest.mark.parametrize("switch", [None, "env", "hub_group"])
def test_every_bar_of_the_calibrators_follows_the_switches(capfd, monkeypatch, data, work, desc, switch):
    # the LBFGS helper's bar, CTS's sweeps, matrix / Dirichlet scaling's cross-validation: shown when the work lasts
    # (a zero delay here), and silenced by the package's off switches like every other bar
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    run = {"lbfgs": _lbfgs_fit, "cts": lambda: _cts_fit(data), "matrix": lambda: _matrix_cv_fit(data)}[work]
    if switch == "env":
        monkeypatch.setenv("HF_CALIBRATION_DISABLE_PROGRESS_BARS", "1")
    elif switch == "hub_group":
        disable_progress_bars("hf_calibration")
    try:
        run()
    finally:
        if switch == "hub_group":
            enable_progress_bars("hf_calibration")
    err = capfd.readouterr().err  # (a fit's logged warnings may land here too: only bars count)
    if switch is None:
        assert f"{desc}:" in err  # (the LBFGS bar is an inner one: erased when done)
    else:
        assert f"{desc}:" not in err and "%|" not in err
