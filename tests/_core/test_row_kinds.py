"""``_core.row_kinds``: which rows of an (N, K) array are probability vectors. A probability of exactly 0 is inside
[0, 1]: rows whose first value is 0 (a class the model never predicts) are probability rows, in the compiled kernel and
in its numpy twin alike, and a metric reads them as probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration._core import numpy_twin, row_kinds
from hf_calibration.metrics import ece

pytestmark = pytest.mark.kernels

# Four probability rows, each starting with 0; confidences 0.65, 0.7, 0.85, 0.95 (one to a bin of 15), the second wrong.
ZERO_FIRST = np.array(
    [
        [0.0, 0.65, 0.35],
        [0.0, 0.7, 0.3],
        [0.0, 0.15, 0.85],
        [0.0, 0.05, 0.95],
    ]
)
LABELS = np.array([1, 2, 2, 2])
# by hand: each bin holds one sample, so ECE = mean |correct - confidence| = (0.35 + 0.7 + 0.15 + 0.05) / 4
HAND_ECE = 0.3125


@pytest.fixture(params=["kernel", "twin"])
def path(request, monkeypatch):
    """The compiled kernel (the test session's default: conftest.py) or its numpy twin (a fresh process's first calls)."""
    if request.param == "twin":
        monkeypatch.setattr(numpy_twin, "BUDGET_SCALE", 1.0)  # the session's 0 would give the twin no budget
        twin = numpy_twin.NumpyTwin(compile_seconds=100.0, seconds_per_value=0.0)  # no kernels: the twin every call
        monkeypatch.setattr(row_kinds, "_TWIN", twin)
        yield request.param
        assert twin.spent > 0  # the twin ran
    else:
        monkeypatch.setattr(row_kinds._TWIN, "_kernel_ready", True)
        yield request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_starting_with_zero_are_probability_rows(path, dtype):
    counts = row_kinds.count_rows(ZERO_FIRST.astype(dtype), 1e-2)
    assert counts == row_kinds.RowCounts(probability=4, coarse=0, boxed_other=0, first_probability=0, first_other=-1)
    assert row_kinds.count_rows(ZERO_FIRST.astype(dtype), 1e-2, stop_at_other=True).first_other == -1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ece_reads_rows_starting_with_zero_as_probabilities(path, dtype):
    """Read as logits (softmax of these rows) the same four rows give 0.255, not the hand-worked 0.3125."""
    assert ece(ZERO_FIRST.astype(dtype), LABELS, n_bins=15) == pytest.approx(HAND_ECE, abs=1e-6)
