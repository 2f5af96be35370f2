"""An independent reference for vector / matrix / Dirichlet scaling: the same regularised NLL written in numpy
with its hand-derived gradient, minimised by scipy's L-BFGS-B (float64, tight tolerances)."""

from __future__ import annotations

import numpy as np
import scipy.optimize
from scipy.special import logsumexp


def affine_objective(x, features, labels, diagonal=False, reg_lambda=0.0, reg_mu=0.0, reg_diagonal=0.0):
    """``(mean NLL of softmax(W f + b) + ODIR, gradient, NLL)`` for ``x = [W (K*K) or w (K), b (K)]``; for a full matrix
    ``reg_diagonal`` adds ``reg_diagonal / K * sum_j (W_jj - mean W_jj)^2``."""
    n, k = features.shape
    if diagonal:
        w, b = x[:k], x[k:]
        s = features * w + b
    else:
        w, b = x[: k * k].reshape(k, k), x[k * k :]
        s = features @ w.T + b
    lse = logsumexp(s, axis=1)
    nll = np.mean(lse - s[np.arange(n), labels])
    g = np.exp(s - lse[:, None])
    g[np.arange(n), labels] -= 1.0
    g /= n
    if diagonal:  # vector scaling: lambda / K sum (w - mean w)^2 + mu / K sum b^2
        d = w - w.mean()  # d/dw_m of sum_j d_j^2 is 2 d_m - (2 / K) sum_j d_j = 2 d_m
        grad = np.concatenate([(g * features).sum(0) + 2 * reg_lambda / k * d, g.sum(0) + 2 * reg_mu / k * b])
        return nll + (reg_lambda * np.sum(d**2) + reg_mu * np.sum(b**2)) / k, grad, nll
    off = ~np.eye(k, dtype=bool)
    d = np.diag(w) - np.diag(w).mean()
    penalty = (
        reg_lambda / (k * (k - 1)) * np.sum(w[off] ** 2) + reg_mu / k * np.sum(b**2) + reg_diagonal / k * np.sum(d**2)
    )
    grad_w = g.T @ features + 2 * reg_lambda / (k * (k - 1)) * np.where(off, w, 0.0) + np.diag(2 * reg_diagonal / k * d)
    grad_b = g.sum(0) + 2 * reg_mu / k * b
    return nll + penalty, np.concatenate([grad_w.reshape(-1), grad_b]), nll


def structured_objective(x, features, labels, diagonal, off_diagonal, diagonal_weight, bias):
    """SMS / SVS (Berta et al. 2026): ``(mean NLL of softmax(W f + b) + off_diagonal * sum_{i != j} W_ij^2 +
    diagonal_weight * sum_j (W_jj - 1)^2 + bias * sum_j b_j^2, gradient, NLL)``; ``x = [W (K*K) or w (K), b (K)]``."""
    k = features.shape[1]
    if diagonal:
        value, grad, nll = affine_objective(x, features, labels, True)
        dw = x[:k] - 1.0
        value += diagonal_weight * np.sum(dw**2) + bias * np.sum(x[k:] ** 2)
        grad = grad + np.concatenate([2 * diagonal_weight * dw, 2 * bias * x[k:]])
        return value, grad, nll
    value, grad, nll = affine_objective(x, features, labels)
    w, b = x[: k * k].reshape(k, k), x[k * k :]
    off = ~np.eye(k, dtype=bool)
    dw = np.diag(w) - 1.0
    value += off_diagonal * np.sum(w[off] ** 2) + diagonal_weight * np.sum(dw**2) + bias * np.sum(b**2)
    grad_w = 2 * off_diagonal * np.where(off, w, 0.0) + np.diag(2 * diagonal_weight * dw)
    return value, grad + np.concatenate([grad_w.reshape(-1), 2 * bias * b]), nll


def _minimise(objective, x0):
    result = scipy.optimize.minimize(
        lambda x: objective(x)[:2],
        x0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 50_000, "maxfun": 100_000, "ftol": 1e-15, "gtol": 1e-11, "maxcor": 30},
    )
    return result.x


def _identity(k, diagonal):
    return np.concatenate([np.ones(k) if diagonal else np.eye(k).reshape(-1), np.zeros(k)])


def fit_affine_reference(features, labels, diagonal=False, reg_lambda=0.0, reg_mu=0.0, reg_diagonal=0.0):
    """scipy L-BFGS-B from the identity; returns ``(x, objective, nll)``."""
    k = features.shape[1]
    x = _minimise(
        lambda v: affine_objective(v, features, labels, diagonal, reg_lambda, reg_mu, reg_diagonal),
        _identity(k, diagonal),
    )
    objective, _, nll = affine_objective(x, features, labels, diagonal, reg_lambda, reg_mu, reg_diagonal)
    return x, objective, nll


def fit_structured_reference(features, labels, diagonal, off_diagonal, diagonal_weight, bias):
    """scipy L-BFGS-B from the identity on ``structured_objective``; returns ``(x, objective, nll)``."""
    k = features.shape[1]
    x = _minimise(
        lambda v: structured_objective(v, features, labels, diagonal, off_diagonal, diagonal_weight, bias),
        _identity(k, diagonal),
    )
    objective, _, nll = structured_objective(x, features, labels, diagonal, off_diagonal, diagonal_weight, bias)
    return x, objective, nll


def canonical(logits):
    """What the non-shift-invariant maps see: the logits relative to their row maximum (subtracted in the logits'
    own dtype, as the calibrators do), as float64."""
    z = np.asarray(logits)
    return (z - z.max(axis=1, keepdims=True)).astype(np.float64)


def log_probabilities(logits):
    """The Dirichlet calibrator's input: ``log softmax(z)`` clipped at log(float64 eps), in numpy."""
    z = np.asarray(logits, dtype=np.float64)
    return np.maximum(z - logsumexp(z, axis=1, keepdims=True), np.log(np.finfo(np.float64).eps))


def smoothed_temperature_features(logits, labels):
    """SMS / SVS's input, in numpy: the NLL temperature (scipy's bounded scalar minimiser), then
    ``log((1 - eps) softmax(z / T) + eps / K)`` with ``eps = 1 / (N + 1)``; returns ``(features, T, eps)``."""
    from scipy.optimize import minimize_scalar

    z = np.asarray(logits, dtype=np.float64)
    n, k = z.shape

    def nll(log_t):
        s = z / np.exp(log_t)
        return float(np.mean(logsumexp(s, axis=1) - s[np.arange(n), labels]))

    t = float(
        np.exp(minimize_scalar(nll, bounds=(np.log(0.05), np.log(100)), method="bounded", options={"xatol": 1e-12}).x)
    )
    s = z / t
    p = np.exp(s - logsumexp(s, axis=1, keepdims=True))
    eps = 1.0 / (n + 1)
    return np.log((1 - eps) * p + eps / k), t, eps


def probmetrics_fit(kind, logits, labels):
    """The authors' calibrator (probmetrics 1.3, ``get_calibrator(kind)``), fitted on the softmax probabilities it expects."""
    import warnings

    from probmetrics.calibrators import get_calibrator

    cal = get_calibrator(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal.fit(
            np.exp(np.asarray(logits, np.float64) - logsumexp(np.asarray(logits, np.float64), axis=1, keepdims=True)),
            labels,
        )
    return cal


def probmetrics_held_out_nll(kind, logits_fit, labels_fit, logits_test, labels_test):
    """Held-out NLL of probmetrics' ``kind`` fitted on the first pair, scored on the second."""
    cal = probmetrics_fit(kind, logits_fit, labels_fit)
    zt = np.asarray(logits_test, np.float64)
    probs = cal.predict_proba(np.exp(zt - logsumexp(zt, axis=1, keepdims=True)))
    return float(-np.log(probs[np.arange(len(labels_test)), labels_test]).mean())
