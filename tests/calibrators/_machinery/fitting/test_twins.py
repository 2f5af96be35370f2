"""The numpy twins of the fitting kernels (``_core.numpy_twin``): temperature scaling's Newton pass and the diagonal map
bit for bit; the affine and structured kernels, which fuse multiply-adds, to rounding; and a whole fit on either side."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration._core import numpy_twin
from hf_calibration._core.parallel import serial_twin
from hf_calibration.calibrators import _structured as structured
from hf_calibration.calibrators import create_calibrator
from hf_calibration.calibrators._machinery.fitting import affine, partition

pytestmark = pytest.mark.kernels

RNG = np.random.default_rng(29)


def _data(n, k, dtype=np.float32):
    """Over-confident logits: labels drawn from ``softmax(z / 2)``."""
    z = (3 * RNG.normal(size=(n, k))).astype(dtype)
    p = np.exp(z / 2 - (z / 2).max(axis=1, keepdims=True))
    return z, (np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1) > RNG.random((n, 1))).argmax(axis=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 2), (777, 13), (5000, 100), (300, 1000)])
def test_newton_pass_twin_is_the_kernel_bit_for_bit(dtype, shape):
    z, y = _data(*shape, dtype)
    step = partition.chunk_rows(shape[1])
    for beta in (0.37, 1.0, 2.5):
        kernel = serial_twin(partition._nll_derivatives_parallel)(z, y, beta, step)
        assert np.array_equal(kernel, partition._twin_nll_derivatives(z, y, beta, step))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centre", [False, True])
def test_diagonal_map_twin_is_the_kernel_bit_for_bit(dtype, centre):
    z, _ = _data(2000, 37, dtype)
    w, b = RNG.uniform(0.5, 1.5, 37).astype(dtype), RNG.normal(size=37).astype(dtype)
    kernel, twin = np.empty_like(z), np.empty_like(z)
    serial_twin(affine.diagonal_map)(z, w, b, centre, kernel)
    affine._twin_diagonal_map(z, w, b, centre, twin)
    assert np.array_equal(kernel, twin)


def _close(a, b, rtol=1e-12):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert np.max(np.abs(a - b), initial=0.0) <= rtol * max(np.max(np.abs(b), initial=0.0), 1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(300, 10), (2000, 100), (200, 1000)])
def test_affine_twins_agree_to_rounding(dtype, shape):
    n, k = shape
    z, y = _data(n, k, dtype)
    w, b = RNG.uniform(0.5, 1.5, k), 0.1 * RNG.normal(size=k)
    for shift in (False, True):
        kernel = affine._diagonal_block(z, y, w, b, True, True, max(1, affine.DIAGONAL_TASK_VALUES // k), shift)
        twin = affine._twin_diagonal_block(z, y, w, b, True, True, shift)
        for a, t in zip(kernel, twin):
            _close(a, t)
    s = 3 * RNG.normal(size=(n, k))
    s_kernel, s_twin = s.copy(), s.copy()
    kernel, twin = affine._softmax_residual(s_kernel, y, True), affine._twin_softmax_residual(s_twin, y, True)
    _close(kernel[0], twin[0])
    _close(kernel[1], twin[1])
    _close(s_kernel, s_twin)
    f = RNG.normal(size=(n, k))
    s_kernel, s_twin = s.copy(), s.copy()
    _close(affine._softmax_curvature(s_kernel, f), affine._twin_softmax_curvature(s_twin, f))
    _close(s_kernel, s_twin)


@pytest.mark.parametrize("k", [2, 10, 40])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_block_solve_twin_agrees_to_rounding(k, dtype):
    m = RNG.normal(size=(k, k + 1, k + 1))
    lower = np.linalg.cholesky(m @ m.transpose(0, 2, 1) + (k + 1) * np.eye(k + 1))
    upper = np.ascontiguousarray(lower.transpose(0, 2, 1)).astype(dtype)
    flipped = np.ascontiguousarray(lower[:, ::-1, ::-1]).astype(dtype)
    v = RNG.normal(size=k * k + k)
    for factor, reverse in ((upper, False), (flipped, True)):
        _close(affine._blocks_solve(factor, v, reverse), affine._twin_blocks_solve(factor, v, reverse), 1e-11)


def test_structured_features_twin_agrees_to_rounding():
    z, _ = _data(1000, 50, np.float64)
    kernel, twin = np.empty_like(z), np.empty_like(z)
    serial_twin(structured._features_block)(z, 1 / 1.3, 1 - 1e-3, 1e-3 / 50, kernel, 100)
    structured._twin_features_block(z, 1 / 1.3, 1 - 1e-3, 1e-3 / 50, twin)
    _close(kernel, twin, 1e-13)


@pytest.mark.parametrize("name", ["temperature_scaling", "vector_scaling", "svs", "sms"])
def test_a_fit_on_the_twins_is_the_fit_on_the_kernels(name, monkeypatch):
    """The same data fitted with every twin in budget, then with the kernels: temperature scaling's to the bit, the
    others to the fit's tolerance (their twins round differently from the kernels' fused multiply-adds)."""
    z, y = _data(3000, 20)
    kernels = create_calibrator(name).fit(z, y, progress_bar=False)
    monkeypatch.setattr(numpy_twin, "BUDGET_SCALE", 1.0)
    for module, attribute in (
        (partition, "_TWIN"),
        (affine, "_BLOCK_TWIN"),
        (affine, "_MATRIX_TWIN"),
        (affine, "_SOLVE_TWIN"),
        (affine, "_MAP_TWIN"),
        (structured, "_TWIN"),
    ):
        monkeypatch.setattr(module, attribute, numpy_twin.NumpyTwin(compile_seconds=100.0, seconds_per_value=0.0))
    twins = create_calibrator(name).fit(z, y, progress_bar=False)
    assert partition._TWIN.spent > 0
    for (key, a), (_, b) in zip(kernels.state_dict().items(), twins.state_dict().items()):
        if name == "temperature_scaling":
            assert torch.equal(a, b), key
        else:
            # SMS stops at a float32 tolerance (its products are float32): its parameters agree to ~4e-6 here
            torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=key)
    x = torch.from_numpy(_data(500, 20)[0])
    # SMS's parameters, ~4e-6 apart, move its outputs by up to ~2e-5 (seen in a full run: 9 of 10,000 values)
    tolerance = 1e-4 if name == "sms" else 1e-5
    torch.testing.assert_close(kernels(x), twins(x), rtol=tolerance, atol=tolerance)
