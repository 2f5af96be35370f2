"""The softmax(W f + b) model shared by vector, matrix and Dirichlet scaling (``_affine.py``): its hand-written
gradient and compiled kernel against an independent numpy implementation, the preconditioner, the fit."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from _affine_reference import affine_objective, fit_affine_reference

from hf_calibration.calibrators._machinery.fitting.affine import (
    AffineNLL,
    affine_curvature,
    affine_preconditioner,
    fit_affine,
    identity_parameters,
)
from hf_calibration.calibrators._machinery.fitting.lbfgs import odir_penalty

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


def _data(n=500, k=6, seed=0, offset=-20.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    f = 2.0 * rng.normal(size=(n, k)) + 3.0 * np.eye(k)[y] + offset  # a large common offset, as log-probabilities have
    return f, y


@pytest.mark.parametrize("diagonal", [True, False])
def test_value_and_gradient_match_numpy(diagonal):
    f, y = _data()
    k = f.shape[1]
    rng = np.random.default_rng(1)
    x = rng.normal(size=2 * k if diagonal else k * k + k)
    value, grad, _ = affine_objective(x, f, y, diagonal)
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), diagonal)
    xt = torch.from_numpy(x).requires_grad_(True)
    out = nll(xt)
    out.backward()
    assert float(out.detach()) == pytest.approx(value, abs=1e-13)
    np.testing.assert_allclose(xt.grad.numpy(), grad, rtol=0, atol=1e-13)
    with torch.no_grad():  # the value-only path
        assert float(nll(torch.from_numpy(x))) == pytest.approx(value, abs=1e-13)


def test_float32_products_stay_within_float32_rounding_of_numpy():
    # the cross-validation fits' objective: the two matrix products in float32, the softmax and the sums in float64
    f, y = _data(n=2000, k=30)
    x = identity_parameters(30) + 0.05 * torch.from_numpy(np.random.default_rng(6).normal(size=30 * 31))
    value, grad, _ = affine_objective(x.numpy(), f, y)
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), products=torch.float32)
    ours, ours_grad = nll.value_and_grad(x)
    assert ours == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(ours_grad.numpy(), grad, rtol=0, atol=1e-5 * np.abs(grad).max())
    assert ours_grad.dtype == torch.float64
    with pytest.raises(ValueError, match="products"):
        AffineNLL(torch.from_numpy(f), torch.from_numpy(y), products=torch.float16)


def test_matrix_kernels_do_not_depend_on_the_thread_count():
    from hf_calibration.calibrators._machinery.fitting.affine import _softmax_curvature, _softmax_residual

    f, y = _data(n=3000, k=20)
    s = f @ (np.eye(20) + 0.1 * np.random.default_rng(7).normal(size=(20, 20))).T
    default = numba.get_num_threads()
    results = []
    try:
        for threads in sorted({1, default}):
            numba.set_num_threads(threads)
            residual, curvature = s.copy(), s.copy()
            results.append(
                (*_softmax_residual(residual, y, True), residual, _softmax_curvature(curvature, f), curvature)
            )
    finally:
        numba.set_num_threads(default)
    for a, b in zip(results[0], results[-1]):
        assert np.array_equal(a, b)


def test_matrix_curvature_kernel_matches_numpy():
    from scipy.special import softmax

    from hf_calibration.calibrators._machinery.fitting.affine import _softmax_curvature

    f, _ = _data(n=700, k=9)
    s = f @ (np.eye(9) + 0.2 * np.random.default_rng(8).normal(size=(9, 9))).T
    p = softmax(s, axis=1)
    v = p * (1 - p)
    out = s.copy()
    sums = _softmax_curvature(out, f)
    np.testing.assert_allclose(out, v, rtol=0, atol=1e-15)  # 1 - p where p ~ 1: both lose the same digits
    np.testing.assert_allclose(sums, np.stack([(v * f).sum(0), v.sum(0)]), rtol=1e-10)


def test_vector_kernel_does_not_depend_on_the_thread_count():
    f, y = _data(n=3000, k=20)
    x = torch.from_numpy(np.random.default_rng(2).normal(size=40))
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), diagonal=True)
    default = numba.get_num_threads()
    results = []
    try:
        for threads in sorted({1, default}):
            numba.set_num_threads(threads)
            results.append(nll._value_and_grad(x, True))
    finally:
        numba.set_num_threads(default)
    assert results[0][0] == results[-1][0]
    assert torch.equal(results[0][1], results[-1][1])


@pytest.mark.parametrize(
    "diagonal, blocks, dtype",
    [
        (True, False, torch.float64),
        (False, False, torch.float64),
        (False, True, torch.float64),
        (False, True, torch.float32),
    ],
)
def test_preconditioner_is_an_exact_change_of_variables(diagonal, blocks, dtype):
    f, y = _data()
    k = f.shape[1]
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), diagonal)
    x = identity_parameters(k, diagonal) + 0.1 * torch.from_numpy(
        np.random.default_rng(3).normal(size=2 * k if diagonal else k * k + k)
    )
    penalty = odir_penalty(k, 2.0, 0.5, diagonal, reg_diagonal=0.3)
    p = affine_preconditioner(nll, x, penalty, affine_curvature(nll, x, blocks=blocks), dtype)
    atol = 1e-10 if dtype == torch.float64 else 1e-4  # float32 factors: a float32-rounded map and inverse
    torch.testing.assert_close(p.to_x(p.to_u(x)), x, rtol=0, atol=atol)
    u = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(p.to_u(p.to_x(u)), u, rtol=0, atol=atol)


def test_block_preconditioner_whitens_the_gauss_newton_blocks():
    # each class's block of the Gauss-Newton curvature, with the penalty's, becomes the identity in the new variables
    from scipy.special import softmax

    f, y = _data(n=300, k=4)
    k = 4
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y))
    x = identity_parameters(k) + 0.1 * torch.from_numpy(np.random.default_rng(4).normal(size=k * k + k))
    penalty = odir_penalty(k, 3.0, 0.7, reg_diagonal=0.2)
    p = affine_preconditioner(nll, x, penalty, affine_curvature(nll, x, blocks=True))
    w, b = x[: k * k].view(k, k).numpy(), x[k * k :].numpy()
    prob = softmax(f @ w.T + b, axis=1)
    g = np.hstack([f, np.ones((len(f), 1))])
    for j in range(k):
        block = (g * (prob[:, j] * (1 - prob[:, j]))[:, None]).T @ g / len(f)
        block[np.arange(k + 1), np.arange(k + 1)] += 2 * penalty.off_diagonal
        block[j, j] += penalty.diagonal_curvature() - 2 * penalty.off_diagonal
        block[k, k] += 2 * penalty.bias - 2 * penalty.off_diagonal
        # the columns of d x / d u for class j's parameters: x = to_x(u) is linear
        columns = []
        for m in range(k + 1):
            e = torch.zeros(k * k + k, dtype=torch.float64)
            e[j * k + m if m < k else k * k + j] = 1.0
            columns.append(p.to_x(e).numpy()[[j * k + c for c in range(k)] + [k * k + j]])
        jacobian = np.stack(columns, 1)
        # to ~1e-4: the blocks are summed in float32 over the rows whose v is above 1e-4 of the largest (a wrong block
        # or penalty term is off by O(1))
        np.testing.assert_allclose(jacobian.T @ block @ jacobian, np.eye(k + 1), atol=1e-3)


@pytest.mark.parametrize("diagonal, lam, mu", [(True, 0.0, 0.0), (False, 0.0, 0.0), (False, 3.0, 0.7)])
def test_fit_reaches_the_scipy_minimum(diagonal, lam, mu):
    f, y = _data(n=400, k=5, seed=4)
    _, ref_objective, ref_nll = fit_affine_reference(f, y, diagonal, lam, mu)
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), diagonal)
    ours = fit_affine(
        nll, identity_parameters(5, diagonal), penalty=odir_penalty(5, lam, mu, diagonal), max_iter=5000, tol=1e-14
    )
    assert ours.objective == pytest.approx(ref_objective, abs=1e-9)
    with torch.no_grad():
        assert float(nll(ours.x)) == pytest.approx(ref_nll, abs=1e-6)


def test_vector_curvature_kernel_matches_numpy():
    from scipy.special import softmax

    from hf_calibration.calibrators._machinery.fitting.affine import _diagonal_curvature

    f, _ = _data(n=700, k=9)
    rng = np.random.default_rng(5)
    w, b = 1 + 0.2 * rng.normal(size=9), rng.normal(size=9)
    p = softmax(f * w + b, axis=1)
    v = p * (1 - p)
    expected = np.stack([(v * f * f).sum(0), (v * f).sum(0), v.sum(0)])
    np.testing.assert_allclose(_diagonal_curvature(f, w, b), expected, rtol=1e-12)


def test_float32_softmax_stays_within_float32_rounding_of_numpy():
    # the cross-validation folds' objective with the softmax pass in float32 too (max, exp and row sums)
    f, y = _data(n=2000, k=30)
    x = identity_parameters(30) + 0.05 * torch.from_numpy(np.random.default_rng(8).normal(size=30 * 31))
    value, grad, _ = affine_objective(x.numpy(), f, y)
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y), products=torch.float32, softmax=torch.float32)
    ours, ours_grad = nll.value_and_grad(x)
    assert ours == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(ours_grad.numpy(), grad, rtol=0, atol=1e-5 * np.abs(grad).max())
    with pytest.raises(
        ValueError, match="softmax"
    ):  # a float32 softmax over float64 products would be a silent downcast
        AffineNLL(torch.from_numpy(f), torch.from_numpy(y), softmax=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_block_preconditioner_newton_step_and_backward_match_dense_algebra(dtype):
    # newton(g) = (L L^T)^-1 g and the autograd transpose of to_x, against the dense map built column by column
    f, y = _data(n=300, k=5)
    k, d = 5, 5 * 6
    nll = AffineNLL(torch.from_numpy(f), torch.from_numpy(y))
    x = identity_parameters(k) + 0.1 * torch.from_numpy(np.random.default_rng(9).normal(size=d))
    p = affine_preconditioner(
        nll, x, odir_penalty(k, 2.0, 0.5, reg_diagonal=0.3), affine_curvature(nll, x, blocks=True), dtype
    )
    dense = np.stack([p.to_x(torch.eye(d, dtype=torch.float64)[i]).numpy() for i in range(d)], 1)  # x = M u
    g = torch.from_numpy(np.random.default_rng(10).normal(size=d))
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(
        p.newton(g).numpy(), dense @ dense.T @ g.numpy(), rtol=0, atol=tol * np.abs(dense @ dense.T @ g.numpy()).max()
    )
    u = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    p.to_x(u).backward(g)
    np.testing.assert_allclose(u.grad.numpy(), dense.T @ g.numpy(), rtol=0, atol=1e-12)
