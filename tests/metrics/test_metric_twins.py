"""The metrics' numpy twins (``_core.numpy_twin``) against their kernels: the probability pass (classwise ECE's sums,
each row's Brier and NLL terms) to rounding (the kernel sums rows in the CPU's SIMD order, which numpy does not
reproduce); smECE's deposit and the exact smCE sweep bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration._core.bins import uniform_edges
from hf_calibration.metrics import _probability_pass as probability_pass

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1000, 10), (3000, 100), (200, 1000)])
@pytest.mark.parametrize("from_logits", [True, False])
def test_probability_pass_twin_agrees_to_rounding(dtype, shape, from_logits):
    n, k = shape
    rng = np.random.default_rng(n + k)
    z = 3 * rng.normal(size=(n, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    x = (z if from_logits else p).astype(dtype)
    y = rng.integers(0, k, n)
    edges = uniform_edges(15)
    cells, scores = np.zeros((k, 15)), np.empty((n, 2))
    probability_pass._rows(x, y, 0, n, from_logits, edges, True, cells, scores, False, *_no_split())
    twin_cells, twin_scores = np.zeros((k, 15)), np.empty((n, 2))
    probability_pass._twin_rows(x, y, from_logits, edges, True, twin_cells, twin_scores)
    np.testing.assert_allclose(twin_scores, scores, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(twin_cells, cells, rtol=1e-12, atol=1e-12)
    # and the metrics they make: Brier and NLL means, classwise ECE
    assert abs(twin_scores[:, 0].mean() - scores[:, 0].mean()) <= 1e-14
    assert abs(np.abs(twin_cells).sum() - np.abs(cells).sum()) <= 1e-10


def _no_split():
    return np.zeros((0, 0)), np.zeros((0, 2), np.int64), np.zeros(0)


def test_smooth_deposit_twin_is_the_kernel_bit_for_bit():
    """smECE's linear-interpolation deposit (``metrics.smooth``): ``np.bincount`` adds in sample order, as the kernel."""
    from hf_calibration.metrics import smooth

    rng = np.random.default_rng(7)
    n, m = 5000, 257
    position = rng.random(n) * (m - 1)
    idx = np.minimum(position.astype(np.int64), m - 2)
    frac = position - idx
    residual = rng.random(n) - (rng.random(n) < 0.5)
    counts = rng.poisson(1.0, size=(3, n)).astype(np.int32)
    assert np.array_equal(
        smooth._deposit(idx, frac, residual, counts, m), smooth._twin_deposit(idx, frac, residual, counts, m)
    )


@pytest.mark.parametrize("n", [1, 2, 1000, 5000])
def test_smce_sweep_twin_is_the_kernel_bit_for_bit(n):
    """The exact smCE sweep run as Python (its own source) gives the kernel's optimum and move count, ties and the
    move budget's early stop included."""
    from hf_calibration.metrics import smooth

    rng = np.random.default_rng(n)
    for p in (np.sort(rng.random(n)), np.sort(np.round(rng.random(n), 2))):
        r = (rng.random(n) < p).astype(np.float64) - p
        for budget in (32 * n + 100_000, 3):
            assert smooth._smce_sweep(p, r, budget) == smooth._smce_sweep.py_func(p, r, budget)
