"""Tabulated log-partition function of temperature-scaled logits, for fast full-batch fits.

Every objective a calibrator is fitted with depends on the logits of row ``i`` only through

    f_i(beta) = log sum_k exp(-beta * (z_i,max - z_ik)),      beta = 1 / T_i,

(``log p_top = -f(beta)``, ``log p_y = -beta * d_iy - f(beta)``, ``sum_k p_k^2 = exp(f(2 beta) - 2 f(beta))``
with ``d_iy = z_i,max - z_iy``). Evaluating it exactly costs an (N, K) pass per optimiser step, i.e. 2000 such passes for
SMART's up-to-2000 Adam steps. Instead ``f_i`` and its derivative are
tabulated once, in one fused pass over the logits, on the grid ``beta = 2**o * (8 + m) / 8 * 2**-8``
(``o`` = 0..14 octaves, ``m`` = 0..7: T from 256 down to 1/64), and evaluated per step by cubic Hermite
interpolation in ``u = log beta``: O(N) per step. The table needs one ``exp`` per logit: within an octave
the exponentials are powers of ``q = exp(-beta_0 d / 8)``, and each octave squares the previous one.
The interpolation error in ``f`` (the relative error of every probability) is below 1e-4 (~1e-5 typical);
the tests compare it with the exact softmax.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_pass, serial_twin
from hf_calibration._core.vmath import exp_into, exp_into_exact, exp_numpy, libm_log, max_of, sum_of_rows_numpy
from hf_calibration.calibrators.objectives import ScaledStats

LOG2_BETA_MIN = -8  # T = 256
OCTAVES = 14  # up to beta = 64, T = 1/64
STEPS = 8  # grid points per octave
GRID = np.log(
    2.0**LOG2_BETA_MIN
    * np.array([2.0**o * (STEPS + m) / STEPS for o in range(OCTAVES) for m in range(STEPS)] + [2.0**OCTAVES])
)
GRID_SIZE = GRID.shape[0]


# arithmetic-only fastmath (no "nnan", "ninf", "nsz"): the argmax scan compares values, exactly on every CPU
@numba.njit(parallel=True, fastmath={"contract", "reassoc", "arcp", "afn"}, cache=True)
def _tabulate(logits, labels, beta0, steps, octaves):  # pragma: no cover - compiled
    n, k = logits.shape
    size = octaves * steps + 1
    fd = np.empty((n, size, 2))  # (f, df) side by side: one lookup reads one or two cache lines, not four
    gap_true = np.empty(n)
    correct = np.empty(n)
    for i in numba.prange(n):
        gaps = np.empty(k)
        q = np.empty(k)
        p = np.empty(k)
        e = np.empty(k)
        bits = np.empty(k)
        top = logits[i, 0]
        arg = 0
        for j in range(1, k):
            if logits[i, j] > top:
                top = logits[i, j]
                arg = j
        for j in range(k):
            d = np.float64(top) - np.float64(logits[i, j])
            gaps[j] = d
            e[j] = -beta0 / steps * d
        exp_into(e, q, bits)  # vectorised: the row's only transcendental passes
        for j in range(k):
            e[j] = -beta0 * gaps[j]
        exp_into(e, p, bits)  # exp(-beta0 d)
        gap_true[i] = gaps[labels[i]]
        correct[i] = 1.0 if arg == labels[i] else 0.0
        for m in range(steps):
            for j in range(k):
                e[j] = p[j]
            beta = beta0 * (steps + m) / steps
            for o in range(octaves + 1):
                g = o * steps + m
                if g >= size:
                    break
                total = 0.0
                moment = 0.0
                for j in range(k):  # one fused, vectorised pass: both sums, then square for the next octave
                    ej = e[j]
                    total += ej
                    moment += ej * gaps[j]
                    e[j] = ej * ej
                fd[i, g, 0] = math.log(total)
                fd[i, g, 1] = -beta * moment / total  # d f / d log(beta)
                beta = 2.0 * beta
            for j in range(k):
                p[j] = p[j] * q[j]
    return fd, gap_true, correct


@numba.njit(cache=True, fastmath={"contract", "reassoc"})
def _nll_rows(logits, labels, beta):  # pragma: no cover - compiled
    """Per-row ``(beta d_iy + f_i(beta), d_iy - E_p[d_i])``: the NLL of ``softmax(beta z_i)`` and its derivative in beta."""
    n, k = logits.shape
    value = np.empty(n)
    slope = np.empty(n)
    gaps = np.empty(k)
    arg = np.empty(k)
    e = np.empty(k)
    bits = np.empty(k)
    for i in range(n):
        row = logits[i]
        top = row[0]
        for j in range(1, k):
            top = max(top, row[j])
        for j in range(k):
            d = np.float64(top) - np.float64(row[j])  # exact: float32 or float64 inputs, float64 difference
            gaps[j] = d
            arg[j] = -beta * d
        exp_into(arg, e, bits)
        total = 0.0
        moment = 0.0
        for j in range(k):
            total += e[j]
            moment += e[j] * gaps[j]
        gap_true = gaps[labels[i]]
        value[i] = beta * gap_true + math.log(total)
        slope[i] = gap_true - moment / total
    return value, slope


def scaled_nll(logits: np.ndarray, labels: np.ndarray, beta: float) -> tuple[float, float]:
    """Exact mean NLL of ``softmax(beta * logits)`` and its derivative in ``beta``, in float64, one pass, no (N, K) copy.

    ``logits``: finite (N, K) float32/float64 C-contiguous; ``labels``: (N,) int64 in range. ~2 ns a logit on one core:
    temperature scaling's LBFGS evaluates it ~10 times a fit.
    """
    value, slope = _nll_rows(logits, labels, float(beta))
    return float(value.mean()), float(slope.mean())


def chunk_rows(k: int) -> int:
    """Rows per parallel task of the block kernels: ~64K values, so that a block of a few hundred long rows still splits
    into enough tasks for every thread. Depends on K only, so the sums are the same for any source and thread count."""
    return max(1, (1 << 16) // max(k, 1))


@numba.njit(cache=True, nogil=True)  # no FMA contraction: its numpy twin computes the same bits (``_twin_rows``)
def _nll_derivatives_rows(z, labels, beta, lo, hi, arg, e, bits):  # pragma: no cover - compiled
    """Sums over rows ``lo:hi`` of the NLL of ``softmax(beta z_i)`` and its first two derivatives in ``beta``.

    With ``d_j = max z - z_j`` (exact in float64) and ``e_j = exp(-beta d_j)``: NLL ``beta d_y + log sum e``, first
    derivative ``d_y - E_p[d]``, second ``Var_p[d]``. The three sums run in four interleaved lanes (a fixed order, so
    the same result on any machine), which keeps them from waiting on one another's additions."""
    k = z.shape[1]
    f = g = h = 0.0
    for i in range(lo, hi):
        row = z[i]
        top = np.float64(max_of(row))  # in the row's dtype, four lanes: exact
        for j in range(k):
            arg[j] = -beta * (top - np.float64(row[j]))
        exp_into_exact(arg, e, bits)
        a0 = a1 = a2 = a3 = 0.0
        b0 = b1 = b2 = b3 = 0.0
        c0 = c1 = c2 = c3 = 0.0
        j = 0
        while j + 4 <= k:
            d0, d1, d2, d3 = (
                top - np.float64(row[j]),
                top - np.float64(row[j + 1]),
                top - np.float64(row[j + 2]),
                top - np.float64(row[j + 3]),
            )
            w0, w1, w2, w3 = e[j], e[j + 1], e[j + 2], e[j + 3]
            a0 += w0
            a1 += w1
            a2 += w2
            a3 += w3
            b0 += w0 * d0
            b1 += w1 * d1
            b2 += w2 * d2
            b3 += w3 * d3
            c0 += w0 * d0 * d0
            c1 += w1 * d1 * d1
            c2 += w2 * d2 * d2
            c3 += w3 * d3 * d3
            j += 4
        while j < k:
            d0 = top - np.float64(row[j])
            a0 += e[j]
            b0 += e[j] * d0
            c0 += e[j] * d0 * d0
            j += 1
        s0, s1, s2 = (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3), (c0 + c1) + (c2 + c3)
        mean = s1 / s0
        gap_true = top - np.float64(row[labels[i]])
        f += beta * gap_true + math.log(s0)
        g += gap_true - mean
        h += max(s2 / s0 - mean * mean, 0.0)  # the variance of the gap under p: >= 0, rounding aside
    return f, g, h


@parallel_kernel(cache=True, nogil=True)
def _nll_derivatives_parallel(z, labels, beta, rows_per_chunk):  # pragma: no cover - compiled
    n, k = z.shape
    chunks = (n + rows_per_chunk - 1) // rows_per_chunk
    part = np.zeros((chunks, 3))
    for c in numba.prange(chunks):
        arg, e, bits = np.empty(k), np.empty(k), np.empty(k)
        part[c, 0], part[c, 1], part[c, 2] = _nll_derivatives_rows(
            z, labels, beta, c * rows_per_chunk, min(n, (c + 1) * rows_per_chunk), arg, e, bits
        )
    out = np.zeros(3)
    for c in range(chunks):  # in chunk order: the same sums for any number of threads
        for r in range(3):
            out[r] += part[c, r]
    return out


def _sequential_sum(values: np.ndarray) -> float:
    """``values[0] + values[1] + ...`` in order, as the kernel's running sum (numpy's ``sum`` is pairwise)."""
    return float(np.cumsum(values)[-1]) if values.shape[0] else 0.0


def _twin_nll_derivatives(z, labels, beta, rows_per_chunk):
    """``_nll_derivatives_parallel`` in numpy: the same operations in the same order, so the same three sums."""
    n = z.shape[0]
    top = z.max(axis=1).astype(np.float64)
    gaps = top[:, None] - z.astype(np.float64)
    e = exp_numpy(-beta * gaps)
    weighted = e * gaps
    s0, s1, s2 = (sum_of_rows_numpy(v) for v in (e, weighted, weighted * gaps))  # the kernel's four lanes each
    mean = s1 / s0
    gap_true = top - z[np.arange(n), labels].astype(np.float64)
    rows = np.stack(
        [
            beta * gap_true + libm_log(s0),
            gap_true - mean,
            np.maximum(s2 / s0 - mean * mean, 0.0),
        ]
    )
    out = np.zeros(3)
    for lo in range(0, n, rows_per_chunk):  # each chunk's running sums, then the chunks in order
        for r in range(3):
            out[r] += _sequential_sum(rows[r, lo : lo + rows_per_chunk])
    return out


_TWIN = NumpyTwin(
    _nll_derivatives_parallel, serial_twin(_nll_derivatives_parallel), compile_seconds=1.5, seconds_per_value=4e-8
)


def nll_derivatives(rows, labels: np.ndarray, beta: float) -> tuple[float, float, float]:
    """Exact mean NLL of ``softmax(beta * z)`` over ``rows`` (a ``FitRows`` or an (N, K) array) and its first and second
    derivatives in ``beta``, in float64: one pass, a block of rows at a time (blocks and chunks summed in order)."""
    from hf_calibration.calibrators._machinery.fitting.rows import as_rows

    rows = as_rows(rows)
    n, k = rows.shape
    step = chunk_rows(k)
    total = np.zeros(3)
    for start, block in rows.blocks():
        y = labels[start : start + block.shape[0]]
        if _TWIN.use(block.size):
            total += _TWIN.run(_twin_nll_derivatives, block, y, float(beta), step)
        else:
            total += run_pass(_nll_derivatives_parallel, block.size, block, y, float(beta), step)
    return float(total[0] / n), float(total[1] / n), float(total[2] / n)


def _tabulate_checked(logits: np.ndarray, labels: np.ndarray):
    """``_tabulate`` with torch's thread count restored (numba's OpenMP layer resets the process-wide count that torch
    also reads; a fit must not change the user's ``torch.get_num_threads()``: it changes matmul results bitwise)."""
    threads = torch.get_num_threads()
    try:
        return _tabulate(logits, labels, 2.0**LOG2_BETA_MIN, STEPS, OCTAVES)
    finally:
        torch.set_num_threads(threads)


class LogPartitionTable:
    """``f_i(beta)`` for every fit row, differentiable in ``beta``; built once from (N, K) logits.

    Attributes:
        correct: (N,) float64 hard correctness ``[argmax z_i == y_i]`` (unchanged by any temperature).
        gap_true: (N,) float64 ``z_i,max - z_iy``.
    """

    def __init__(self, logits: np.ndarray, labels: np.ndarray):
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float32)
        self._build(
            *_tabulate_checked(np.ascontiguousarray(logits), np.ascontiguousarray(labels, dtype=np.int64)),
            logits.shape[1],
        )

    @classmethod
    def from_rows(cls, rows, labels: np.ndarray) -> LogPartitionTable:
        """The table of a ``FitRows`` (or an array), tabulated a block of rows at a time: no copy of the logits (the
        table itself is N x 226 float64: 90 MB at N = 50,000)."""
        if not hasattr(rows, "blocks"):
            return cls(rows, labels)
        n, k = rows.shape
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        fd, gap_true, correct = np.empty((n, GRID_SIZE, 2)), np.empty(n), np.empty(n)
        for start, block in rows.blocks():
            stop = start + block.shape[0]
            fd[start:stop], gap_true[start:stop], correct[start:stop] = _tabulate_checked(block, labels[start:stop])
        table = cls.__new__(cls)
        table._build(fd, gap_true, correct, k)
        return table

    def _build(self, fd: np.ndarray, gap_true: np.ndarray, correct: np.ndarray, num_classes: int) -> None:
        self.fd = torch.from_numpy(fd)  # (N, GRID_SIZE, 2): the compiled SMART step reads it flat
        self.f, self.df = self.fd[..., 0], self.fd[..., 1]
        self.gap_true = torch.from_numpy(gap_true)
        self.correct = torch.from_numpy(correct)
        self.num_classes = num_classes
        self._grid = torch.from_numpy(GRID)
        self._pairs = self.fd.reshape(-1, 2)  # a view: row i's grid point g is pair i * GRID_SIZE + g
        self._offsets = torch.arange(fd.shape[0]) * GRID_SIZE

    def __len__(self) -> int:
        return self.f.shape[0]

    def __call__(self, beta: torch.Tensor) -> torch.Tensor:
        """``f_i(beta_i)`` (``beta`` of shape (N,) or a scalar), float64, differentiable in ``beta``."""
        beta = torch.as_tensor(beta, dtype=torch.float64).expand(len(self))
        u = torch.log(beta)
        idx = (torch.searchsorted(self._grid, u.detach(), right=True) - 1).clamp(0, GRID_SIZE - 2)
        u0, u1 = self._grid[idx], self._grid[idx + 1]
        h = u1 - u0
        t = ((u - u0) / h).clamp(max=1.0)  # beyond the largest beta (T < 1/64): hold the last value
        flat = self._offsets + idx
        (f0, d0), (f1, d1) = self._pairs[flat].unbind(1), self._pairs[flat + 1].unbind(1)
        d0, d1 = d0 * h, d1 * h
        t2, t3 = t * t, t * t * t
        value = (2 * t3 - 3 * t2 + 1) * f0 + (t3 - 2 * t2 + t) * d0 + (-2 * t3 + 3 * t2) * f1 + (t3 - t2) * d1
        # below the smallest beta (T > 256): first-order expansion in beta, exact at beta = 0 up to O(beta_min^2)
        beta_min = math.exp(GRID[0])
        below = self.f[:, 0] + self.df[:, 0] / beta_min * (beta - beta_min)
        return torch.where(u < GRID[0], below, value)

    def stats(self, beta: torch.Tensor, sum_p_sq: bool = False) -> ScaledStats:
        """``ScaledStats`` of ``softmax(beta_i * z_i)`` for every fit row, differentiable in ``beta``.

        ``sum_p_sq`` (needed by the Brier score only) costs a second table lookup, at ``2 beta``; else it is None.
        """
        beta = torch.as_tensor(beta, dtype=torch.float64)
        f1 = self(beta)
        sq = torch.exp(self(2 * beta) - 2 * f1) if sum_p_sq else None
        return ScaledStats(-f1, self.correct, -beta * self.gap_true - f1, sq)
