"""An independent reference for vector / matrix / Dirichlet scaling: the same regularised NLL written in numpy
with its hand-derived gradient, minimised by scipy's L-BFGS-B (float64, tight tolerances)."""

from __future__ import annotations

import numpy as np
import scipy.optimize
from scipy.special import logsumexp


def affine_objective(x, features, labels, diagonal=False, reg_lambda=0.0, reg_mu=0.0):
    """``(mean NLL of softmax(W f + b) + ODIR, gradient, NLL)`` for ``x = [W (K*K) or w (K), b (K)]``."""
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
    penalty = reg_lambda / (k * (k - 1)) * np.sum(w[off] ** 2) + reg_mu / k * np.sum(b**2)
    grad_w = g.T @ features + 2 * reg_lambda / (k * (k - 1)) * np.where(off, w, 0.0)
    grad_b = g.sum(0) + 2 * reg_mu / k * b
    return nll + penalty, np.concatenate([grad_w.reshape(-1), grad_b]), nll


def fit_affine_reference(features, labels, diagonal=False, reg_lambda=0.0, reg_mu=0.0):
    """scipy L-BFGS-B from the identity; returns ``(x, objective, nll)``."""
    n, k = features.shape
    x0 = np.concatenate([np.ones(k) if diagonal else np.eye(k).reshape(-1), np.zeros(k)])
    result = scipy.optimize.minimize(
        lambda x: affine_objective(x, features, labels, diagonal, reg_lambda, reg_mu)[:2], x0, jac=True, method="L-BFGS-B",
        options={"maxiter": 50_000, "maxfun": 100_000, "ftol": 1e-15, "gtol": 1e-11, "maxcor": 30},
    )
    objective, _, nll = affine_objective(result.x, features, labels, diagonal, reg_lambda, reg_mu)
    return result.x, objective, nll


def canonical(logits):
    """What the non-shift-invariant maps see: the logits relative to their row maximum (subtracted in the logits'
    own dtype, as the calibrators do), as float64."""
    z = np.asarray(logits)
    return (z - z.max(axis=1, keepdims=True)).astype(np.float64)


def log_probabilities(logits):
    """The Dirichlet calibrator's input: ``log softmax(z)`` clipped at log(float64 eps), in numpy."""
    z = np.asarray(logits, dtype=np.float64)
    return np.maximum(z - logsumexp(z, axis=1, keepdims=True), np.log(np.finfo(np.float64).eps))
