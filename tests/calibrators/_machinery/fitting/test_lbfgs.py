"""The shared full-batch LBFGS helper (``_lbfgs.py``) against scipy's L-BFGS-B on the same objectives."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

from hf_calibration.calibrators._machinery.fitting.lbfgs import Preconditioner, l2_penalty, minimize, odir_penalty


def _logistic_problem(seed=0, n=400, d=6):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0, 30.0])  # badly scaled on purpose
    w_true = rng.normal(size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ w_true / 3))).astype(np.float64)
    return x, y


def _logistic_numpy(w, x, y, l2):
    s = x @ w
    loss = np.mean(np.logaddexp(0, s) - y * s) + l2 * np.sum(w[1:] ** 2)
    p = 1 / (1 + np.exp(-s))
    grad = x.T @ (p - y) / len(y)
    grad[1:] += 2 * l2 * w[1:]
    return loss, grad


def test_reaches_scipy_minimum_with_a_masked_l2_penalty():
    x, y = _logistic_problem()
    l2 = 0.01
    ref = scipy.optimize.minimize(
        _logistic_numpy,
        np.zeros(x.shape[1]),
        args=(x, y, l2),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 10_000, "ftol": 1e-15, "gtol": 1e-12},
    )
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    mask = torch.tensor([False] + [True] * (x.shape[1] - 1))

    def fun(w):
        s = xt @ w
        return (torch.nn.functional.softplus(s) - yt * s).mean()

    ours = minimize(fun, torch.zeros(x.shape[1]), penalty=l2_penalty(l2, mask), max_iter=1000)
    assert ours.objective == pytest.approx(ref.fun, abs=1e-9)
    np.testing.assert_allclose(ours.x.numpy(), ref.x, atol=1e-4)
    assert ours.x.dtype == torch.float64 and 0 < ours.iterations <= ours.evaluations


def test_preconditioning_changes_the_path_not_the_minimiser():
    x, y = _logistic_problem(seed=1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def fun(w):
        s = xt @ w
        return (torch.nn.functional.softplus(s) - yt * s).mean() + 1e-3 * (w * w).sum()

    scale = torch.from_numpy(x.std(0))  # x = u / scale: a diagonal change of variables
    plain = minimize(fun, torch.zeros(x.shape[1]), max_iter=2000, tol=1e-14)
    pre = minimize(
        fun,
        torch.zeros(x.shape[1]),
        precondition=Preconditioner(lambda u: u / scale, lambda w: w * scale),
        max_iter=2000,
        tol=1e-14,
    )
    assert pre.objective == pytest.approx(plain.objective, abs=1e-10)
    np.testing.assert_allclose(pre.x.numpy(), plain.x.numpy(), atol=1e-4)
    assert pre.evaluations < plain.evaluations  # the whitened problem takes fewer steps


def test_odir_penalty_is_the_papers_formula():
    k = 4
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(k, k)), rng.normal(size=k)
    lam, mu = 3.0, 0.5
    expected = lam / (k * (k - 1)) * sum(w[i, j] ** 2 for i in range(k) for j in range(k) if i != j) + mu / k * np.sum(
        b**2
    )
    x = torch.from_numpy(np.concatenate([w.reshape(-1), b]))
    assert float(odir_penalty(k, lam, mu)(x)) == pytest.approx(expected, rel=1e-14)
    x.requires_grad_(True)
    odir_penalty(k, lam, mu)(x).backward()
    grad_w = x.grad[: k * k].view(k, k).numpy()
    np.testing.assert_allclose(np.diag(grad_w), 0.0)  # the diagonal is free
    np.testing.assert_allclose(x.grad[k * k :].numpy(), 2 * mu / k * b)


def test_a_non_finite_objective_is_a_clear_error():
    with pytest.raises(FloatingPointError, match="not finite"):
        minimize(lambda w: torch.log(w).sum(), -torch.ones(2))
    with pytest.raises(FloatingPointError, match="non-finite"):
        minimize(lambda w: torch.where(w.sum() > 0.5, torch.log(0.5 - w.sum()), -w.sum()), torch.zeros(2))


def test_runs_torch_on_one_thread_and_restores_the_count():
    seen = []

    def fun(w):
        seen.append(torch.get_num_threads())
        return ((w - 1) ** 2).sum()

    before = torch.get_num_threads()
    result = minimize(fun, torch.zeros(3))
    assert set(seen) == {1} and torch.get_num_threads() == before
    np.testing.assert_allclose(result.x.numpy(), 1.0, atol=1e-8)


def test_runs_under_no_grad():
    # calibrators are often fitted from inference code, inside torch.no_grad(): the fit needs autograd all the same
    target = torch.arange(4, dtype=torch.float64)
    with torch.no_grad():
        result = minimize(lambda x: ((x - target) ** 2).sum(), torch.zeros(4))
    torch.testing.assert_close(result.x, target)
