"""One fused SMART step: objective and its gradient in the 3H + 1 MLP parameters, O(N) per call.

The same maths as ``SMARTCalibrator.temperature_of_margin`` → ``LogPartitionTable.stats`` → the
objectives in ``objectives.py`` (the tests check loss and gradient against torch autograd on those),
written out by hand so an Adam step costs ~N * (4H + 3B) flops instead of ~100 small torch kernels.

Rows are processed in fixed chunks of ``CHUNK`` rows, in parallel; each chunk's partial sums are added in
chunk order, so the result does not depend on the number of threads (a fit is deterministic). Within a
chunk the work goes stage by stage over arrays of the chunk's rows (MLP, softplus, table lookup, soft bins,
and back), so that numba vectorises every loop; ``exp``/``log`` come from ``_vmath`` for the same reason.
The per-row intermediates live in one ``workspace(N, n_bins)`` array, allocated once per fit.

Parameter vector layout: ``[W1 (H), b1 (H), W2 (H), b2 (1)]`` for
``T(m_hat) = softplus(W2 . ReLU(W1 m_hat + b1) + b2) + eps``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hf_calibration._core.parallel import parallel_kernel, run_threads
from hf_calibration._core.threads import ThreadCountChooser, numba_threads  # noqa: F401 - smart.py runs the step through it
from hf_calibration._core.vmath import exp_into, log_into, sum_of
from hf_calibration.calibrators._machinery.fitting.partition import LOG2_BETA_MIN, STEPS

OBJECTIVE_CODES = {"nll": 0, "brier": 1, "soft_ece": 2, "charbonnier_soft_ece": 3}
CHUNK = 256  # rows per parallel task: fixed, so the summation order is too
_TINY = 2.2250738585072014e-308
# grid cell of beta = 2**E (1 + frac): (E - LOG2_BETA_MIN) * STEPS + floor(STEPS * frac), from the bits of beta
_CELL_SHIFT = 52 - 3  # STEPS = 8 cells per octave: the exponent and the top 3 mantissa bits
_CELL_OFFSET = (1023 + LOG2_BETA_MIN) * STEPS
assert STEPS == 8

# rows of the workspace: one float64 value per fit row each, then the n_bins soft-bin memberships
PRE, TEMP, SIGMOID, BETA, LOG_BETA, F, DF, CONF, DBETA, BITS, CELL, ACC1, ACC2, ACC3, ACC4, ARG = range(16)
_ROWS = 16

# fastmath for arithmetic only (FMA, reassociated sums, reciprocals, approximate functions): the objective and gradient
# round differently, within what the tests against autograd tolerate. Not "nnan", "ninf" or "nsz" (fastmath=_ARITHMETIC):
# a NaN or inf objective must reach the caller, which stops the fit on it.
_ARITHMETIC = {"contract", "reassoc", "arcp", "afn"}


def workspace(n: int, n_bins: int) -> np.ndarray:
    """Scratch for ``smart_loss_grad`` on ``n`` rows (``n_bins``: 1 for the unbinned objectives)."""
    return np.empty((_ROWS + n_bins, n))


@numba.njit(cache=True, fastmath={"contract"})
def _softplus(a, t, sig, bits, arg, eps):  # pragma: no cover - compiled
    """``t = softplus(a) + eps`` and ``sig = softplus'(a)`` (the logistic function) via ``small = exp(-|a|)``:
    ``softplus(a) = max(a, 0) + log1p(small)``, with ``log1p(s) = log(w) * s / (w - 1)``, ``w = 1 + s``
    (accurate to rounding; ``s`` itself where ``w`` rounds to 1). No reassociation: ``(1 + s) - 1`` must stay."""
    for i in range(a.shape[0]):
        arg[i] = -abs(a[i])
    exp_into(arg, sig, bits)  # small
    for i in range(a.shape[0]):
        arg[i] = 1.0 + sig[i]
    log_into(arg, t, bits)  # log(1 + small)
    for i in range(a.shape[0]):
        small = sig[i]
        w = 1.0 + small
        wm1 = w - 1.0
        log1p = t[i] * (small / wm1) if wm1 != 0.0 else small
        t[i] = log1p + max(a[i], 0.0) + eps
        sig[i] = (1.0 if a[i] >= 0 else small) / w


@numba.njit(cache=True, fastmath=_ARITHMETIC)
def _lookup(fd, grid, beta, u, f, fp, cell, first_row, octaves_up):  # pragma: no cover - compiled
    """``f[i], fp[i] = f(b), df/dbeta`` of table row ``first_row + i`` at ``b = 2**octaves_up beta[i]``
    (cubic Hermite in ``log b``; ``u = log beta``).

    ``fd`` is the flat ``(N, size, 2)`` table of ``(f, df/dlog beta)`` pairs on the grid
    ``beta = 2**(o + LOG2_BETA_MIN) * (STEPS + m) / STEPS``: the cell holding ``b`` is read off its bits, with
    no search. Below the grid, first order in beta; above it, the last value (derivative 0).
    """
    size = grid.shape[0]
    bb = beta.view(np.int64)
    cb = cell.view(np.int64)
    for i in range(beta.shape[0]):
        idx = (bb[i] >> _CELL_SHIFT) - _CELL_OFFSET + octaves_up * STEPS
        cb[i] = min(max(idx, 0), size - 2)
    u_min = grid[0]
    beta_min = math.exp(u_min)
    scale = 2.0**octaves_up
    du = octaves_up * math.log(2.0)
    for i in range(beta.shape[0]):
        idx = cb[i]
        ui = u[i] + du
        bi = beta[i] * scale
        base = 2 * size * (first_row + i)
        k = base + 2 * idx
        lo = grid[idx]
        h = grid[idx + 1] - lo
        t = (ui - lo) / h
        held = t > 1.0
        t = min(t, 1.0)
        f0 = fd[k]
        d0 = fd[k + 1] * h
        f1 = fd[k + 2]
        d1 = fd[k + 3] * h
        t2 = t * t
        t3 = t2 * t
        value = (2 * t3 - 3 * t2 + 1) * f0 + (t3 - 2 * t2 + t) * d0 + (-2 * t3 + 3 * t2) * f1 + (t3 - t2) * d1
        dvalue_dt = (6 * t2 - 6 * t) * f0 + (3 * t2 - 4 * t + 1) * d0 + (-6 * t2 + 6 * t) * f1 + (3 * t2 - 2 * t) * d1
        slope_below = fd[base + 1] / beta_min
        below = ui < u_min
        f[i] = fd[base] + slope_below * (bi - beta_min) if below else value
        # d/dbeta f(2**j beta) = 2**j f'(b), f'(b) = d/dt * dt/du * du/db
        fp[i] = scale * (slope_below if below else (0.0 if held else dvalue_dt / h / bi))


@numba.njit(cache=True)
def _mlp_weights(x):  # pragma: no cover - compiled
    """``(W1, b1, W2, b2)`` of the flat parameter vector ``[W1 (H), b1 (H), W2 (H), b2]`` (views)."""
    hdim = (x.shape[0] - 1) // 3
    return x[:hdim], x[hdim : 2 * hdim], x[2 * hdim : 3 * hdim], x[3 * hdim]


@numba.njit(cache=True)
def _chunk_rows(c, n):  # pragma: no cover - compiled
    """First and past-the-end row of chunk ``c`` of ``n`` rows."""
    start = c * CHUNK
    return start, min(n, start + CHUNK)


@numba.njit(cache=True, fastmath=_ARITHMETIC)
def _forward_chunk(
    c,
    x,
    m_hat,
    fd,
    grid,
    gap_true,
    correct,
    code,
    n_bins,
    inv,
    width,
    half_width,
    shrink,
    recurrence,
    eps,
    work,
    part_loss,
    part_count,
    part_sum,
):  # pragma: no cover - compiled
    """Pass 1 on chunk ``c``: temperatures, the table at ``beta = 1 / T``, per-row terms (NLL, Brier) or the
    chunk's soft-bin sums; the per-row intermediates stay in ``work`` for pass 2."""
    w1, b1, w2, b2 = _mlp_weights(x)
    hdim = w1.shape[0]
    n = m_hat.shape[0]
    s, e = _chunk_rows(c, n)
    rows = e - s
    m = m_hat[s:e]
    a = work[PRE, s:e]
    t = work[TEMP, s:e]
    sig = work[SIGMOID, s:e]
    beta = work[BETA, s:e]
    u = work[LOG_BETA, s:e]
    f = work[F, s:e]
    fp = work[DF, s:e]
    bits = work[BITS, s:e]
    idx = work[CELL, s:e]
    db = work[DBETA, s:e]
    gap = gap_true[s:e]
    # the MLP: a = W2 . ReLU(W1 m_hat + b1) + b2
    for i in range(rows):
        a[i] = b2
    for j in range(hdim):
        wj, bj, vj = w1[j], b1[j], w2[j]
        for i in range(rows):
            a[i] += vj * max(wj * m[i] + bj, 0.0)
    arg = work[ARG, s:e]
    _softplus(a, t, sig, bits, arg, eps)
    for i in range(rows):
        beta[i] = 1.0 / t[i]
    log_into(beta, u, bits)
    _lookup(fd, grid, beta, u, f, fp, idx, s, 0)
    loss_local = 0.0
    if code == 0:  # NLL: mean(beta d_y + f(beta))
        for i in range(rows):
            loss_local += beta[i] * gap[i] + f[i]
            db[i] = (gap[i] + fp[i]) / n
    elif code == 1:  # Brier: mean(sum_k p_k^2 - 2 p_y + 1), sum_k p_k^2 = exp(f(2 beta) - 2 f(beta))
        f2 = work[ACC1, s:e]
        f2p = work[ACC2, s:e]
        sq = work[ACC3, s:e]
        p_y = work[ACC4, s:e]
        _lookup(fd, grid, beta, u, f2, f2p, idx, s, 1)
        arg2 = work[CONF, s:e]
        for i in range(rows):
            arg[i] = f2[i] - 2.0 * f[i]
            arg2[i] = -beta[i] * gap[i] - f[i]
        exp_into(arg, sq, bits)
        exp_into(arg2, p_y, bits)
        for i in range(rows):
            loss_local += sq[i] - 2.0 * p_y[i] + 1.0
            db[i] = (sq[i] * (f2p[i] - 2.0 * fp[i]) - 2.0 * p_y[i] * (-gap[i] - fp[i])) / n
    else:  # soft bins of the confidence p = exp(-f(beta))
        p = work[CONF, s:e]
        cor = correct[s:e]
        total = work[ACC1, s:e]
        for i in range(rows):
            arg[i] = -f[i]
        exp_into(arg, p, bits)
        # Gaussian memberships exp(-inv (c_b - p)^2), relative to the nearest centre c0 so that they never
        # all underflow: exp(-inv ((c_b - p)^2 - (c0 - p)^2)) = exp(-inv (c_b - c0)(c_b + c0 - 2 p))
        c0 = idx
        for i in range(rows):
            b0 = min(n_bins - 1, max(0, int(p[i] * n_bins)))
            c0[i] = (2.0 * b0 + 1.0) / (2.0 * n_bins)
        if recurrence:
            # two exps a row: w_0, and the ratio r_0 = w_1 / w_0; then w_{b+1} = w_b r_b, r_{b+1} = r_b shrink
            first = work[_ROWS, s:e]
            ratio = work[ACC2, s:e]
            arg2 = work[ACC3, s:e]
            for i in range(rows):
                arg[i] = -inv * (half_width - c0[i]) * (half_width + c0[i] - 2.0 * p[i])
                arg2[i] = -inv * width * (2.0 * width - 2.0 * p[i])  # c_0 + c_1 = 2 width
            exp_into(arg, first, bits)
            exp_into(arg2, ratio, bits)
            for i in range(rows):
                total[i] = first[i]
            for b in range(1, n_bins):
                w = work[_ROWS + b, s:e]
                prev = work[_ROWS + b - 1, s:e]
                for i in range(rows):
                    w[i] = prev[i] * ratio[i]
                    ratio[i] *= shrink
                    total[i] += w[i]
        else:
            for i in range(rows):
                total[i] = 0.0
            for b in range(n_bins):
                cb = (2.0 * b + 1.0) / (2.0 * n_bins)
                w = work[_ROWS + b, s:e]
                for i in range(rows):
                    arg[i] = -inv * (cb - c0[i]) * (cb + c0[i] - 2.0 * p[i])
                exp_into(arg, w, bits)
                for i in range(rows):
                    total[i] += w[i]
        for i in range(rows):
            total[i] = 1.0 / total[i]
        for b in range(n_bins):
            w = work[_ROWS + b, s:e]
            cnt = 0.0
            sm = 0.0
            for i in range(rows):
                wb = w[i] * total[i]
                w[i] = wb
                cnt += wb
                sm += wb * (cor[i] - p[i])
            part_count[c, b] = cnt
            part_sum[c, b] = sm
    part_loss[c] = loss_local


@numba.njit(cache=True, fastmath=_ARITHMETIC)
def _backward_chunk(
    c, x, m_hat, correct, binned, n_bins, inv, d_count, d_sum, work, part_grad
):  # pragma: no cover - compiled
    """Pass 2 on chunk ``c``: d loss / d beta per row (through the soft bins for the binned objectives), then
    back through ``T = softplus(a) + eps``, ``beta = 1 / T`` and the MLP into the chunk's row of ``part_grad``."""
    w1, b1, w2, _ = _mlp_weights(x)
    hdim = w1.shape[0]
    two_inv = 2.0 * inv
    s, e = _chunk_rows(c, m_hat.shape[0])
    rows = e - s
    m = m_hat[s:e]
    a = work[PRE, s:e]
    t = work[TEMP, s:e]
    sig = work[SIGMOID, s:e]
    db = work[DBETA, s:e]
    if binned:
        # dw_b/dp = w_b (g_b - sum_b' w_b' g_b'), g_b = 2 inv (c_b - p)
        p = work[CONF, s:e]
        fp = work[DF, s:e]
        cor = correct[s:e]
        sa = work[ACC1, s:e]
        sag = work[ACC2, s:e]
        sg = work[ACC3, s:e]
        sd = work[ACC4, s:e]
        for i in range(rows):
            sa[i] = 0.0
            sag[i] = 0.0
            sg[i] = 0.0
            sd[i] = 0.0
        for b in range(n_bins):
            cb = (2.0 * b + 1.0) / (2.0 * n_bins)
            dc = d_count[b]
            ds = d_sum[b]
            w = work[_ROWS + b, s:e]
            for i in range(rows):
                wb = w[i]
                gb = two_inv * (cb - p[i])
                ab = (dc + ds * (cor[i] - p[i])) * wb
                sa[i] += ab
                sag[i] += ab * gb
                sg[i] += wb * gb
                sd[i] += ds * wb
        for i in range(rows):
            db[i] = (sag[i] - sg[i] * sa[i] - sd[i]) * (-p[i] * fp[i])  # p = exp(-f(beta))
    # back through T = softplus(a) + eps, beta = 1 / T, and the MLP
    for i in range(rows):
        a[i] = db[i] * (-1.0 / (t[i] * t[i])) * sig[i]  # the PRE row now holds d loss / d a (pass 1's is not needed)
    # in sum_of's fixed lanes: a reassociated sum here was vectorised differently in the parallel kernel and in its
    # serial twin (the one sum that differed between them)
    part_grad[c, 3 * hdim] = sum_of(a[:rows])
    for j in range(hdim):
        wj, bj = w1[j], b1[j]
        gw1 = 0.0
        gbias = 0.0
        gw2 = 0.0
        for i in range(rows):
            pre = wj * m[i] + bj
            da = a[i] if pre > 0 else 0.0
            gw2 += da * pre
            gbias += da
            gw1 += da * m[i]
        part_grad[c, j] = gw1 * w2[j]
        part_grad[c, hdim + j] = gbias * w2[j]
        part_grad[c, 2 * hdim + j] = gw2


@numba.njit(cache=True, fastmath=False)  # pragma: no cover - compiled
def _in_order(part):
    """``part.sum(0)``, the chunks added in order: no reassociation (the step's own fastmath allows it, and the
    parallel kernel and its serial twin would then vectorise these sums differently)."""
    out = np.zeros(part.shape[1])
    for c in range(part.shape[0]):
        for k in range(part.shape[1]):
            out[k] += part[c, k]
    return out


@parallel_kernel(extra_compile_seconds=6.0, cache=True, fastmath=_ARITHMETIC)  # 10.8 s to compile, 4.6 s serially
def smart_loss_grad(
    x, m_hat, fd, grid, gap_true, correct, code, n_bins, sigma, delta, eps, work, force_exp
):  # pragma: no cover
    """Objective and gradient (3H + 1,) at parameters ``x``; ``fd``: ``LogPartitionTable.fd`` flattened;
    ``work``: ``workspace(N, n_bins)`` (or ``workspace(N, 1)`` for NLL and Brier). ``force_exp``: the soft-bin
    memberships by one exp each even where the cheaper recurrence is safe (for tests; a required argument, so
    every call has the one compiled signature)."""
    n = m_hat.shape[0]
    dim = x.shape[0]
    n_chunks = (n + CHUNK - 1) // CHUNK
    binned = code >= 2
    nb = n_bins if binned else 1
    part_loss = np.zeros(n_chunks)
    part_count = np.zeros((n_chunks, nb))
    part_sum = np.zeros((n_chunks, nb))
    inv = 1.0 / (2.0 * sigma * sigma)
    width = 1.0 / n_bins
    half_width = 0.5 * width  # c_0
    shrink = math.exp(-2.0 * inv * width * width)
    # from bin 0, w_0 >= exp(-inv (1 - c_0)^2) relative to w_{b0} = 1: a normal float while inv (1 - c_0)^2 < 600
    recurrence = inv * (1.0 - half_width) ** 2 < 600.0 and not force_exp
    for c in numba.prange(n_chunks):  # the chunk bodies are separate functions: parfor compiles a big body slowly
        _forward_chunk(
            c,
            x,
            m_hat,
            fd,
            grid,
            gap_true,
            correct,
            code,
            n_bins,
            inv,
            width,
            half_width,
            shrink,
            recurrence,
            eps,
            work,
            part_loss,
            part_count,
            part_sum,
        )
    loss = _in_order(part_loss.reshape(n_chunks, 1))[0]
    d_count = np.zeros(nb)
    d_sum = np.zeros(nb)
    if not binned:
        loss /= n
    else:  # soft-binned ECE, |gap| (code 2) or Charbonnier (code 3)
        counts, gap_sums = _in_order(part_count), _in_order(part_sum)
        for b in range(n_bins):
            count, gap_sum = counts[b], gap_sums[b]
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
    part_grad = np.zeros((n_chunks, dim))
    for c in numba.prange(n_chunks):
        _backward_chunk(c, x, m_hat, correct, binned, n_bins, inv, d_count, d_sum, work, part_grad)
    return loss, _in_order(part_grad)


def smart_step(*args):
    """``smart_loss_grad(*args)`` on numba's current thread count, or its serial twin until the twin's passes have paid
    for the parallel compile (``_core.parallel``: the same result bit for bit)."""
    return run_threads(smart_loss_grad, numba_threads(), args[1].shape[0], *args)
