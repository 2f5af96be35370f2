"""One fused SMART step: objective and its gradient in the 3H + 1 MLP parameters, O(N) per call.

The same maths as ``SMARTCalibrator.temperature_of_margin`` → ``LogPartitionTable.stats`` → the
objectives in ``objectives.py`` (the tests check loss and gradient against torch autograd on those),
written out by hand so an Adam step costs ~N * (4H + 3B) flops instead of ~100 small torch kernels.

Rows are processed in fixed chunks of ``CHUNK`` rows, in parallel; each chunk's partial sums are added in
chunk order, so the result does not depend on the number of threads (a fit is deterministic).

Parameter vector layout: ``[W1 (H), b1 (H), W2 (H), b2 (1)]`` for
``T(m_hat) = softplus(W2 . ReLU(W1 m_hat + b1) + b2) + eps``.
"""

from __future__ import annotations

import math
import time

import numba
import numpy as np

from ._partition import LOG2_BETA_MIN, STEPS

OBJECTIVE_CODES = {"nll": 0, "brier": 1, "soft_ece": 2, "charbonnier_soft_ece": 3}
CHUNK = 256  # rows per parallel task: fixed, so the summation order is too
_TINY = 2.2250738585072014e-308


@numba.njit(cache=True, fastmath=True)
def _lookup(fd, grid, row, beta):  # pragma: no cover - compiled
    """(f, df/dbeta) of the tabulated log-partition function of ``row`` at ``beta`` (cubic Hermite in log beta).

    ``fd`` is the flat ``(N, size, 2)`` table of ``(f, df/dlog beta)`` pairs. The grid is
    ``beta = 2**(o + LOG2_BETA_MIN) * (STEPS + m) / STEPS``: the cell holding ``beta`` follows from its
    binary exponent and mantissa, with no search.
    """
    size = grid.shape[0]
    base = 2 * row * size
    u = math.log(beta)
    if u < grid[0]:
        beta_min = math.exp(grid[0])
        slope = fd[base + 1] / beta_min
        return fd[base] + slope * (beta - beta_min), slope
    mant, expo = math.frexp(beta)  # beta = mant * 2**expo, mant in [0.5, 1)
    idx = (expo - 1 - LOG2_BETA_MIN) * STEPS + int((2.0 * mant - 1.0) * STEPS)
    if idx > size - 2:
        idx = size - 2
    elif idx < 0:
        idx = 0
    h = grid[idx + 1] - grid[idx]
    t = (u - grid[idx]) / h
    held = t > 1.0
    if held:
        t = 1.0
    k = base + 2 * idx
    f0 = fd[k]
    d0 = fd[k + 1] * h
    f1 = fd[k + 2]
    d1 = fd[k + 3] * h
    t2 = t * t
    t3 = t2 * t
    value = (2 * t3 - 3 * t2 + 1) * f0 + (t3 - 2 * t2 + t) * d0 + (-2 * t3 + 3 * t2) * f1 + (t3 - t2) * d1
    if held:
        return value, 0.0
    dvalue_dt = (6 * t2 - 6 * t) * f0 + (3 * t2 - 4 * t + 1) * d0 + (-6 * t2 + 6 * t) * f1 + (3 * t2 - 2 * t) * d1
    return value, dvalue_dt / h / beta  # d/dbeta = d/dt * dt/du * du/dbeta


@numba.njit(cache=True, fastmath=True)
def _soft_bins(p, n_bins, inv, width, shrink, out):  # pragma: no cover - compiled
    """Normalised Gaussian memberships of confidence ``p`` in ``n_bins`` bins, written to ``out``.

    Relative to the nearest centre ``c0``, neighbouring membership ratios are geometric
    (``ratio_{b+1} = ratio_b * exp(-2 inv width^2)``), so a row costs one exp instead of ``n_bins``.
    """
    b0 = min(n_bins - 1, max(0, int(p * n_bins)))
    c0 = (2.0 * b0 + 1.0) / (2.0 * n_bins)
    up = math.exp(inv * (2.0 * width * (p - c0) - width * width))
    down = shrink / up if up > 1e-150 else math.exp(-inv * (2.0 * width * (p - c0) + width * width))
    out[b0] = 1.0
    total = 1.0
    e = 1.0
    ratio = up
    for b in range(b0 + 1, n_bins):
        e *= ratio
        ratio *= shrink
        out[b] = e
        total += e
    e = 1.0
    ratio = down
    for b in range(b0 - 1, -1, -1):
        e *= ratio
        ratio *= shrink
        out[b] = e
        total += e
    scale = 1.0 / total
    for b in range(n_bins):
        out[b] *= scale


@numba.njit(cache=True, fastmath=True, parallel=True)
def smart_loss_grad(
    x, m_hat, fd, grid, gap_true, correct, code, n_bins, sigma, delta, eps, weights
):  # pragma: no cover - compiled
    """Objective and gradient (3H + 1,) at parameters ``x``; ``fd``: ``LogPartitionTable.fd`` flattened;
    ``weights``: (N, n_bins) scratch buffer."""
    n = m_hat.shape[0]
    dim = x.shape[0]
    hdim = (dim - 1) // 3
    w1 = x[:hdim]
    b1 = x[hdim : 2 * hdim]
    w2 = x[2 * hdim : 3 * hdim]
    b2 = x[3 * hdim]
    n_chunks = (n + CHUNK - 1) // CHUNK
    binned = code >= 2
    nb = n_bins if binned else 1
    temp = np.empty(n)
    sigmoid = np.empty(n)
    fprime = np.empty(n)
    conf = np.empty(n)
    dbeta = np.empty(n)  # d loss / d beta_i
    part_loss = np.zeros(n_chunks)
    part_count = np.zeros((n_chunks, nb))
    part_sum = np.zeros((n_chunks, nb))
    inv = 1.0 / (2.0 * sigma * sigma)
    width = 1.0 / n_bins
    shrink = math.exp(-2.0 * inv * width * width)
    # pass 1: temperatures, the log-partition function at 1 / T, and per-row (or per-bin) loss terms
    for c in numba.prange(n_chunks):
        stop = min(n, (c + 1) * CHUNK)
        loss_local = 0.0
        count_local = np.zeros(nb)
        sum_local = np.zeros(nb)
        for i in range(c * CHUNK, stop):
            a = b2
            for j in range(hdim):
                a += w2[j] * max(w1[j] * m_hat[i] + b1[j], 0.0)
            small = math.exp(-abs(a))
            t = math.log1p(small) + max(a, 0.0) + eps  # softplus(a) + eps
            temp[i] = t
            sigmoid[i] = 1.0 / (1.0 + small) if a >= 0 else small / (1.0 + small)  # softplus'(a)
            beta = 1.0 / t
            f, fp = _lookup(fd, grid, i, beta)
            fprime[i] = fp
            if code == 0:  # NLL: mean(beta d_y + f(beta))
                loss_local += beta * gap_true[i] + f
                dbeta[i] = (gap_true[i] + fp) / n
            elif code == 1:  # Brier: mean(sum_k p_k^2 - 2 p_y + 1)
                f2, f2prime = _lookup(fd, grid, i, 2.0 * beta)
                sq = math.exp(f2 - 2.0 * f)
                p_y = math.exp(-beta * gap_true[i] - f)
                loss_local += sq - 2.0 * p_y + 1.0
                dbeta[i] = (sq * (2.0 * f2prime - 2.0 * fp) - 2.0 * p_y * (-gap_true[i] - fp)) / n
            else:  # soft bins of the confidence p = exp(-f(beta))
                p = math.exp(-f)
                conf[i] = p
                row = weights[i]
                _soft_bins(p, n_bins, inv, width, shrink, row)
                r = correct[i] - p
                for b in range(n_bins):
                    count_local[b] += row[b]
                    sum_local[b] += row[b] * r
        part_loss[c] = loss_local
        for b in range(nb):
            part_count[c, b] = count_local[b]
            part_sum[c, b] = sum_local[b]
    loss = 0.0
    for c in range(n_chunks):
        loss += part_loss[c]
    if not binned:
        loss /= n
    else:  # soft-binned ECE, |gap| (code 2) or Charbonnier (code 3)
        d_count = np.zeros(n_bins)  # d loss / d count_b (gap_sum fixed)
        d_sum = np.zeros(n_bins)  # d loss / d gap_sum_b
        for b in range(n_bins):
            count = 0.0
            gap_sum = 0.0
            for c in range(n_chunks):
                count += part_count[c, b]
                gap_sum += part_sum[c, b]
            g = gap_sum / max(count, _TINY)
            if code == 3:
                root = math.sqrt(g * g + delta * delta)
                phi = root - delta
                dphi = g / root if root > 0 else 0.0
            else:
                phi = abs(g)
                dphi = 1.0 if g > 0 else (-1.0 if g < 0 else 0.0)
            loss += count / n * phi
            d_count[b] = (phi - g * dphi) / n
            d_sum[b] = dphi / n
    # pass 2: d loss / d beta_i for the binned objectives, then back through T = softplus(a) + eps, beta = 1/T, the MLP
    part_grad = np.zeros((n_chunks, dim))
    for c in numba.prange(n_chunks):
        stop = min(n, (c + 1) * CHUNK)
        g_local = np.zeros(dim)
        for i in range(c * CHUNK, stop):
            if binned:
                # membership derivative: dw_b/dp = w_b (g_b - sum_b' w_b' g_b'), g_b = 2 inv (c_b - p)
                p = conf[i]
                r = correct[i] - p
                s_ag = 0.0
                s_a = 0.0
                s_g = 0.0
                s_d = 0.0
                for b in range(n_bins):
                    wb = weights[i, b]
                    gb = 2.0 * inv * ((2.0 * b + 1.0) / (2.0 * n_bins) - p)
                    ab = (d_count[b] + d_sum[b] * r) * wb
                    s_ag += ab * gb
                    s_a += ab
                    s_g += wb * gb
                    s_d += d_sum[b] * wb
                dp = s_ag - s_g * s_a - s_d
                dbeta[i] = dp * (-p * fprime[i])  # p = exp(-f(beta))
            t = temp[i]
            da = dbeta[i] * (-1.0 / (t * t)) * sigmoid[i]
            g_local[3 * hdim] += da
            m = m_hat[i]
            for j in range(hdim):  # branch-free ReLU: which units are active varies unpredictably from row to row
                pre = w1[j] * m + b1[j]
                active = 1.0 if pre > 0 else 0.0
                dpre = da * w2[j] * active
                g_local[2 * hdim + j] += da * pre * active
                g_local[j] += dpre * m
                g_local[hdim + j] += dpre
        for k in range(dim):
            part_grad[c, k] = g_local[k]
    grad = np.zeros(dim)
    for c in range(n_chunks):
        for k in range(dim):
            grad[k] += part_grad[c, k]
    return loss, grad


class ThreadCountChooser:
    """Calls ``fn`` with the numba thread count that was fastest lately; ``fn``'s result never depends on it.

    On an idle machine the step's chunks run on every core. When other processes hold the cores, each
    parallel region waits for a descheduled worker thread (measured on 2 shared cores: steps up to 40x
    slower than on one thread). So every ``period`` calls, ``probe`` calls are timed with each candidate
    count (1 and numba's default) and the faster one is kept until the next probe. The caller's thread
    count is restored after every call.
    """

    def __init__(self, fn, period: int = 250, probe: int = 3):
        self.fn, self.period, self.probe = fn, period, probe
        self.candidates = sorted({1, numba.get_num_threads()})
        self.best = self.candidates[-1]
        self.calls = 0
        self._times: dict[int, float] = {}

    def __call__(self, *args):
        phase = self.calls % self.period
        self.calls += 1
        probing = len(self.candidates) > 1 and phase < self.probe * len(self.candidates)
        threads = self.candidates[phase % len(self.candidates)] if probing else self.best
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            start = time.perf_counter()
            out = self.fn(*args)
            elapsed = time.perf_counter() - start
        finally:
            numba.set_num_threads(before)
        if probing:
            if phase == 0:
                self._times = {}
            self._times[threads] = min(self._times.get(threads, math.inf), elapsed)
            if phase == self.probe * len(self.candidates) - 1:
                self.best = min(self._times, key=self._times.get)
        return out
