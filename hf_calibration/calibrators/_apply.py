"""Fused CPU kernels for applying a calibrator: one pass over the (N, K) logits instead of five.

``Calibrator.forward`` must divide each row by its temperature, refuse non-finite logits, never
overflow, and keep the argmax. In torch that is a top-2 (SMART's margin), a division, a finiteness
reduction and two argmax passes over (N, K) memory. :func:`scale_rows` reads each row from memory
once and does the rest while the row is in cache:

* finiteness (a vectorised sum, exact check only when it is not finite), the top logit and its first
  index (``torch.argmax``'s tie rule), SMART's margin top-1 minus top-2 in float64;
* SMART's temperature ``T(m)`` from the margin, in float64 scalar code: a row's temperature does not
  depend on the batch it comes in (torch's vectorised ``exp``/``log1p`` round their tails differently);
  it agrees with ``SMARTCalibrator.temperature_of_margin`` to ~1e-15 relative;
* ``out = z / T`` correctly rounded (as ``torch.div``), then the argmax guard: division by ``T > 0`` is
  monotone, so the argmax can only move when rounding merges the winner with an earlier entry; then
  the winner is raised by one ulp, as the torch path does.

A non-finite row or one whose ``|z| / T`` overflows the dtype sends the call back to the torch path,
which raises or rescales.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

OK, NOT_FINITE, OVERFLOW = 0, 1, 2


@numba.njit(cache=True)
def _all_finite(row):  # pragma: no cover - compiled
    for v in row:  # only reached when a row's sum is not finite: NaN/inf, or finite values summing past the dtype
        if not math.isfinite(v):
            return False
    return True


@numba.njit(cache=True, fastmath={"reassoc", "nsz"})
def _finite(row):  # pragma: no cover - compiled
    """Whether every entry is finite: a vectorised sum (inf or NaN if any entry is), exact check if it is not."""
    total = row[0] - row[0]
    for v in row:
        total += v
    return math.isfinite(total) or _all_finite(row)


@numba.njit(cache=True, fastmath=True)
def _max(row, start, stop, init):  # pragma: no cover - compiled
    """max(init, row[start:stop]), vectorised; only called on rows already known to be finite."""
    top = init
    for j in range(start, stop):
        top = max(top, row[j])
    return top


@numba.njit(cache=True, fastmath=True)
def _min(row):  # pragma: no cover - compiled
    low = row[0]
    for v in row:
        low = min(low, v)
    return low


@numba.njit(cache=True)
def _first(row, value):  # pragma: no cover - compiled
    """Index of the first entry equal to ``value`` (torch.argmax's tie rule)."""
    j = 0
    while row[j] != value:
        j += 1
    return j


@numba.njit(cache=True)
def _smart_temperature(margin, mean, std, w1, b1, w2, b2, eps):  # pragma: no cover - compiled
    """SMART's ``T(m) = softplus(W2 . ReLU(W1 m_hat + b1) + b2) + eps`` for one margin, in float64."""
    if not math.isfinite(margin):
        return np.nan
    m_hat = (margin - mean) / std
    a = b2
    for j in range(w1.shape[0]):
        a += w2[j] * max(w1[j] * m_hat + b1[j], 0.0)
    return max(a, 0.0) + math.log1p(math.exp(-abs(a))) + eps


@numba.njit(cache=True)
def _margin(row, top, first):  # pragma: no cover - compiled
    """top-1 minus top-2 logit in float64 (0 for tied top logits), as ``torch.topk``'s values give it."""
    k = row.shape[0]
    second = _max(row, first + 1, k, _max(row, 0, first, -np.inf))
    return np.float64(top) - np.float64(second)


@numba.njit(parallel=True, cache=True)
def _temperatures(z, smart, mean, std, w1, b1, w2, b2, eps, temps):  # pragma: no cover - compiled
    n, k = z.shape
    for i in numba.prange(n):
        row = z[i]
        if not _finite(row):
            temps[i] = np.nan
            continue
        top = _max(row, 0, k, row[0])
        temps[i] = _smart_temperature(_margin(row, top, _first(row, top)), mean, std, w1, b1, w2, b2, eps)


@numba.njit(parallel=True, cache=True)
def _scale_rows(z, t_fixed, smart, mean, std, w1, b1, w2, b2, eps, posinf, temps, out, status):  # pragma: no cover - compiled
    n, k = z.shape
    for i in numba.prange(n):
        row = z[i]
        dst = out[i]
        if not _finite(row):
            status[i] = NOT_FINITE
            continue
        top = _max(row, 0, k, row[0])
        first = _first(row, top)
        if smart:
            temps[i] = _smart_temperature(_margin(row, top, first), mean, std, w1, b1, w2, b2, eps)  # cast to z's dtype
        else:
            temps[i] = t_fixed
        t = temps[i]
        if not (math.isfinite(top / t) and math.isfinite(_min(row) / t)):  # |z| / T beyond the dtype: the caller rescales
            status[i] = OVERFLOW
            continue
        status[i] = OK
        for j in range(k):  # correctly rounded division, as torch's
            dst[j] = row[j] / t
        if first > 0 and _max(dst, 0, first, dst[0]) >= dst[first]:  # rounding merged the winner with an earlier entry
            dst[first] = np.nextafter(dst[first], posinf[0])


def supports(z: torch.Tensor) -> bool:
    """Whether the fused kernels can serve ``z``: a CPU float32/float64 tensor that needs no gradient."""
    return (
        z.device.type == "cpu"
        and z.dtype in (torch.float32, torch.float64)
        and not (z.requires_grad and torch.is_grad_enabled())
        and z.shape[0] > 0
    )


def _threads_kept(fn, *args):
    threads = torch.get_num_threads()
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)  # numba's OpenMP layer may change the count torch reads


_NO_MLP = np.zeros(0)


def _mlp_args(smart_mlp):
    """(smart, mean, std, w1, b1, w2, b2, eps) for the kernels; ``smart_mlp`` is None for a fixed temperature."""
    if smart_mlp is None:
        return False, 0.0, 1.0, _NO_MLP, _NO_MLP, _NO_MLP, 0.0, 0.0
    mean, std, w1, b1, w2, b2, eps = smart_mlp
    return True, float(mean), float(std), w1, b1, w2, float(b2), float(eps)


def temperatures(z: torch.Tensor, smart_mlp) -> torch.Tensor:
    """SMART's per-row temperatures (N,) float64 of a CPU float32/float64 tensor (NaN for non-finite rows)."""
    zn = z.detach().contiguous().numpy()
    temps = np.empty(zn.shape[0], dtype=np.float64)
    _threads_kept(_temperatures, zn, *_mlp_args(smart_mlp), temps)
    return torch.from_numpy(temps)


def scale_rows(z: torch.Tensor, temperature: float | None = None, smart_mlp=None) -> torch.Tensor | None:
    """``z / T`` in one pass (T fixed, or SMART's ``T(m)`` when ``smart_mlp`` is given); None if a row is non-finite
    or would overflow, for the torch path to raise or rescale.

    ``smart_mlp`` = ``(margin_mean, margin_std, W1 (H,), b1 (H,), W2 (H,), b2, eps)``, float64 numpy.
    """
    zn = z.detach().contiguous().numpy()
    n = zn.shape[0]
    temps = np.empty(n, dtype=zn.dtype)
    out = np.empty_like(zn)
    status = np.empty(n, dtype=np.int8)
    t_fixed = 1.0 if temperature is None else float(temperature)
    _threads_kept(_scale_rows, zn, t_fixed, *_mlp_args(smart_mlp), np.full(1, np.inf, dtype=zn.dtype), temps, out, status)
    return None if status.any() else torch.from_numpy(out)
