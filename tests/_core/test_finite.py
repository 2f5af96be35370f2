"""Every compiled kernel that checks finiteness, fed NaN, +inf and -inf at the first, a middle and the last value of
the first, a middle and the last row, in float32 and float64, whole and in blocks: each must name the row.

These kernels once summed a row with ``fastmath={"reassoc", "nsz"}`` and lost the NaN of float32 rows on AVX-512
CPUs; CI runs this file (with the other ``kernels`` tests) again with numba targeting a CPU without AVX-512.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hf_calibration._core import finite as _finite
from hf_calibration._core import row_kinds as _row_kinds
from hf_calibration.calibrators import create_calibrator
from hf_calibration.calibrators._machinery import base as _base
from hf_calibration.calibrators._machinery.fitting import rows as _rows
from hf_calibration.metrics import ece

pytestmark = pytest.mark.kernels

N = 300
K_VALUES = (3, 17, 300)  # shorter than, about, and many times a SIMD register
CASES = list(itertools.product((np.float32, np.float64), (np.nan, np.inf, -np.inf), K_VALUES))


def _poisoned(dtype, value, k):
    """(array, bad row) pairs: ``value`` at the first, a middle and the last column of the first, a middle and the last row."""
    x = np.random.default_rng(k).normal(size=(N, k)).astype(dtype)
    for row, col in itertools.product((0, N // 2 - 27, N - 1), (0, k // 2, k - 1)):
        bad = x.copy()
        bad[row, col] = value
        yield bad, row


@pytest.mark.parametrize(("dtype", "value", "k"), CASES)
def test_row_finite_and_first_non_finite(dtype, value, k):
    x = np.random.default_rng(0).normal(size=(N, k)).astype(dtype)
    assert _finite._first_non_finite_serial(x) == -1 and _finite._first_non_finite_parallel(x) == -1
    for bad, row in _poisoned(dtype, value, k):
        assert not _finite.row_finite(bad[row])
        assert _finite._first_non_finite_serial(bad) == row
        assert _finite._first_non_finite_parallel(bad) == row
        assert _finite.first_non_finite(bad) == row


@pytest.mark.parametrize(("dtype", "value", "k"), CASES)
def test_fit_rows_in_blocks(dtype, value, k, monkeypatch):
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", 7 * k)  # blocks of 7 rows: the bad row inside a later block
    for bad, row in _poisoned(dtype, value, k):
        assert _rows.FitRows(bad).first_non_finite() == row


@pytest.mark.parametrize(("dtype", "value", "k"), CASES)
def test_probability_detection_never_takes_a_non_finite_row_for_probabilities(dtype, value, k):
    p = np.random.default_rng(1).dirichlet(np.ones(k), size=N).astype(dtype)
    for bad, row in _poisoned(dtype, value, k):
        bad[:] = p
        bad[row, [0, k // 2, k - 1][row % 3]] = value
        counts = _row_kinds.count_rows(bad, 1e-2)
        assert counts.first_other == row and counts.probability + counts.coarse == N - 1


@pytest.fixture(scope="module", params=["temperature_scaling", "smart"])
def fitted(request):
    rng = np.random.default_rng(2)
    fits = {}
    for k in K_VALUES:
        z = (4 * rng.normal(size=(400, k))).astype(np.float32)
        fits[k] = create_calibrator(request.param).fit(z, z.argmax(axis=1), progress_bar=False)
    return fits


@pytest.mark.parametrize(("dtype", "value", "k"), CASES)
def test_fused_forward_whole_and_in_blocks(fitted, dtype, value, k, monkeypatch):
    calibrator = fitted[k]
    for blocks in (False, True):
        if blocks:
            monkeypatch.setattr(_base, "FORWARD_BLOCK_ELEMENTS", 11 * k)
        for bad, row in _poisoned(dtype, value, k):
            with pytest.raises(ValueError, match=f"row {row} contains NaN"):
                calibrator(torch.from_numpy(bad))


@pytest.mark.parametrize(("dtype", "value", "k"), CASES)
def test_top_label_pass(dtype, value, k):
    labels = np.zeros(N, dtype=np.int64)
    for bad, row in _poisoned(dtype, value, k):
        with pytest.raises(ValueError, match=f"row {row} contains NaN or inf"):
            ece(bad, labels)
