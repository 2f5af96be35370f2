"""benchmarks/serving.py publishes the calibrator's share of the serving time only beyond the rounds' own spread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

serving = pytest.importorskip("serving")


def test_a_share_inside_the_noise_is_not_published_as_a_number():
    """Issue 40 item 13: the table showed shares of -54.8 % (a calibrated path faster than the plain one). Inside the
    rounds' spread a share is "within noise"; beyond it, a negative share is printed as measured and flagged."""
    row = {"share_torch": -0.548, "noise_torch": 0.60, "share_onnx": 0.22, "noise_onnx": 0.05}
    assert serving._share(row, "torch") == "within noise (±60 %)"
    beyond = {"share_torch": -0.548, "noise_torch": 0.09}
    assert serving._share(beyond, "torch") == "-54.8 % (±9 %): plain slower, a measurement artefact"
    assert serving._share(row, "onnx") == "22.0 %"
    assert serving._share({"share_onnx": 0.04, "noise_onnx": 0.05}, "onnx") == "within noise (±5 %)"
    assert serving._share({"share_torch": -0.02}, "torch") == "within noise"  # a row written before the spread
    assert serving._iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(3.0)  # statistics.quantiles' exclusive method
