"""One compiled pass over the probability rows: classwise ECE's signed sums, each row's Brier and NLL terms, and
classwise ECE's bootstrap replicates.

Per row, in float64 (as ``_format.probability_chunks``): ``p = softmax(z)`` (exp after subtracting the row maximum)
or the probabilities themselves, the bin of every ``p_k`` by :func:`~hf_calibration._core.bins.uniform_bin`,
``cells[k, bin(p_k)] += p_k - [y == k]``, Brier ``sum_k p_k^2 - 2 p_y + 1`` and NLL ``-log p_y`` (from logits
``-(z_y - max z - log sum_k exp(z_k - max z))``).

Classwise ECE's resamples (row ``i`` weighted by its count ``c_i``) need every cell's weighted sum. A probability
above the lowest bin's upper edge ``1 / n_bins`` is rare: at most ``n_bins - 1`` classes of a row can have one.
So the cells of the upper bins are sums over a short list of (row, class) entries, O(n_boot) each, and the lowest
bin's cells of all classes and all resamples are one matrix product, counts (n_boot, N) times the rows'
lowest-bin values (N, K) (zero where the value is in an upper bin): a float64 GEMM in row chunks of 8,000 rows at
K = 1,000 (BLAS, both cores), instead of n_boot · N · K scattered additions.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np

from hf_calibration._core.bins import in_lowest_bin, uniform_bin, uniform_edges
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.vmath import exp_taylor
from hf_calibration.metrics._format import Inputs, check_rows
from hf_calibration.metrics.bootstrap import Bootstrap

_CHUNK_ELEMENTS = 1 << 23  # rows of one chunk (>= 256): 64 MB of float64 lowest-bin values, 8,000 rows at K = 1,000
_CHUNK_ROWS = 16_384  # at most: several chunks, so the next chunk's pass overlaps this one's product
_MIN_CHUNK_ROWS = 256  # the matrix product's inner size: fewer rows than this and BLAS runs far below its peak
_BLOCK_ELEMENTS = 1 << 26  # counts of one block of classwise resamples: 256 MB of int32 (all of 200 at N = 3e5)
_GEMM = np.float64  # the lowest bin's product in float64: every resample's value exact to rounding


class ProbabilityRows(NamedTuple):
    """What the pass gives: ``cells`` (K, n_bins) signed sums (None unless asked), ``scores`` (N, 2) each row's Brier
    and NLL terms, ``brier`` and ``nll`` their means (NLL term by term divided by N first, so huge losses sum
    without overflow), and ``replicates`` classwise ECE of every resample (None without a bootstrap)."""

    cells: np.ndarray | None
    scores: np.ndarray
    brier: float
    nll: float
    replicates: np.ndarray | None


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts (fdlibm's): k * _LN2_HI is exact for |k| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2^52: x + _ROUND rounds x to an integer held in the low bits of the sum
_ROUND_BITS = np.float64(_ROUND).view(np.int64)
_EXP_FLOOR = -708.0  # exp below this is under 2^-1021 (subnormal or 0): taken as 0


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def _exp_shifted(d, e, t):  # pragma: no cover - compiled
    """``e[j] = exp(d[j])`` for ``d <= 0`` (a row minus its maximum), within 1 ulp of libm's (0 below -708).

    Written so that LLVM vectorises it (libm's exp is a scalar call, 4-5x slower here): ``d = k ln2 + r`` with
    ``k`` rounded through ``_ROUND`` (no float-to-int conversion), ``exp(r)`` by its Taylor series to ``r^13``
    (``|r| <= ln2 / 2``: the next term is below 2^-53), times ``2^k`` built in the exponent bits.
    """
    n = d.shape[0]
    for j in range(n):
        t[j] = max(d[j], _EXP_FLOOR) * _LOG2E + _ROUND
    bits = t.view(np.int64)
    for j in range(n):
        k = t[j] - _ROUND
        r = (max(d[j], _EXP_FLOOR) - k * _LN2_HI) - k * _LN2_LO
        e[j] = exp_taylor(1.0 / 6227020800.0, r)
        bits[j] = (bits[j] - _ROUND_BITS + 1023) << 52  # 2^k
    for j in range(n):
        e[j] = e[j] * t[j] if d[j] > _EXP_FLOOR else 0.0


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _rows(
    preds, target, start, stop, from_logits, edges, classwise, cells, scores, split, lowest, where, values
):  # pragma: no cover - compiled
    """Rows ``start..stop``: add the signed sums into ``cells`` (when ``classwise``) and write ``scores[i]``. With
    ``split``, also ``lowest[i - start, k]`` (the row's signed value ``p_k - [y == k]`` where ``p_k`` is in the lowest
    bin, else 0) and, for every other class, ``where[m] = (row, k * n_bins + bin)``, ``values[m]`` = that value.
    Returns the number of entries written. Each step is a loop over the row that LLVM vectorises (``reassoc``: the
    row sums are in SIMD order, the same on every call)."""
    k = preds.shape[1]
    n_bins = edges.shape[0] - 1
    p = np.empty(k)
    d = np.empty(k)
    t = np.empty(k)
    row = np.empty(k)
    low = cells[:, 0].copy() if classwise else np.zeros(0)
    m = 0
    for i in range(start, stop):
        y = target[i]
        z = preds[i]
        if from_logits:
            top = np.float64(z[0])
            for j in range(k):
                top = max(top, np.float64(z[j]))
            for j in range(k):
                d[j] = np.float64(z[j]) - top
            _exp_shifted(d, p, t)
            s = 0.0
            for j in range(k):
                s += p[j]
            for j in range(k):
                p[j] = p[j] / s
            scores[i, 1] = -(d[y] - np.log(s))
        else:
            for j in range(k):
                p[j] = np.float64(z[j])
            scores[i, 1] = -np.log(p[y])
        squares = 0.0
        for j in range(k):
            squares += p[j] * p[j]
        scores[i, 0] = squares - 2.0 * p[y] + 1.0
        if not (classwise or split):
            continue
        upper = 0
        for j in range(k):  # the lowest bin's values, 0 where a value is above it
            above = not in_lowest_bin(p[j], edges)
            row[j] = 0.0 if above else p[j]
            upper += above
        if in_lowest_bin(p[y], edges):
            row[y] = p[y] - 1.0
        if classwise:
            for j in range(k):
                low[j] += row[j]
        if split:
            out = lowest[i - start]
            for j in range(k):
                out[j] = row[j]
        if upper or not in_lowest_bin(p[y], edges):
            for j in range(k):
                if not in_lowest_bin(p[j], edges):
                    b = uniform_bin(p[j], edges)
                    r = p[j] - 1.0 if j == y else p[j]
                    if classwise:
                        cells[j, b] += r
                    if split:
                        where[m, 0] = i
                        where[m, 1] = j * n_bins + b
                        values[m] = r
                        m += 1
    if classwise:
        cells[:, 0] = low
    return m


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _entry_sums(counts_t, position, where, values, out):  # pragma: no cover - compiled
    """Add ``|sum over a cell's entries of counts[position[row]] * value|`` of every upper-bin cell into ``out`` (B,).
    Entries sorted by cell; ``counts_t`` the block transposed, (frame positions, resamples)."""
    chunk = counts_t.shape[1]
    acc = np.zeros(chunk)
    n = where.shape[0]
    e = 0
    while e < n:
        cell = where[e, 1]
        acc[:] = 0.0
        while e < n and where[e, 1] == cell:
            weights = counts_t[position[where[e, 0]]]
            value = values[e]
            for b in range(chunk):
                acc[b] += weights[b] * value
            e += 1
        for b in range(chunk):
            out[b] += abs(acc[b])


def _twin_rows(preds, target, from_logits, edges, classwise, cells, scores):
    """``_rows`` over every row in numpy (no bootstrap split): the same quantities, to rounding (the kernel's row sums
    run in the CPU's SIMD order, which numpy does not reproduce; ~1e-16 relative)."""
    n, k = preds.shape
    n_bins = edges.shape[0] - 1
    x = preds.astype(np.float64)
    rows = np.arange(n)
    if from_logits:
        d = x - x.max(axis=1, keepdims=True)
        p = np.where(d > _EXP_FLOOR, np.exp(np.maximum(d, _EXP_FLOOR)), 0.0)
        s = p.sum(axis=1)
        p /= s[:, None]
        scores[:, 1] = -(d[rows, target] - np.log(s))
    else:
        p = x
        with np.errstate(divide="ignore"):
            scores[:, 1] = -np.log(p[rows, target])
    scores[:, 0] = (p * p).sum(axis=1) - 2.0 * p[rows, target] + 1.0
    if classwise:
        signed = p.copy()
        signed[rows, target] -= 1.0
        bins = np.clip(np.searchsorted(edges, p, side="left") - 1, 0, n_bins - 1)  # uniform_bin's rule
        flat = (np.arange(k) * n_bins)[None, :] + bins
        cells += np.bincount(flat.ravel(), weights=signed.ravel(), minlength=k * n_bins).reshape(k, n_bins)


_TWIN = NumpyTwin(_rows, compile_seconds=2.5, seconds_per_value=5e-8)


def probability_rows(
    inputs: Inputs,
    n_bins: int = 15,
    *,
    classwise: bool = True,
    boot: Bootstrap | None = None,
    position: np.ndarray | None = None,
    checked: bool = False,
) -> ProbabilityRows:
    """The pass over ``inputs`` (as :func:`~hf_calibration.metrics._format.prepare` leaves them).

    ``boot`` (with ``position``, each row's frame position: the resamples' counts are over the frame, see
    :mod:`~hf_calibration.metrics.bootstrap`) adds classwise ECE of every resample of ``boot``. ``checked``: the
    rows were already checked (finite; probabilities by the one rule) by ``top_label``; otherwise they are checked
    here first, with the same messages.
    """
    if not checked:
        check_rows(inputs)
    preds, target, from_logits = inputs.preds, inputs.target, inputs.from_logits
    # the compiled pass reads native float32 / float64 (float16 -> float32 is exact; no copy of float32 / float64)
    preds = np.ascontiguousarray(preds, dtype=np.float64 if preds.dtype.itemsize >= 8 else np.float32)
    n, k = preds.shape
    edges = uniform_edges(n_bins)
    cells = np.zeros((k, n_bins)) if classwise else np.zeros((0, 0))
    scores = np.empty((n, 2))
    step = max(_MIN_CHUNK_ROWS, min(_CHUNK_ELEMENTS // k, _CHUNK_ROWS))
    if boot is None and _TWIN.use(n * k):
        _TWIN.run(_twin_rows, preds, target, from_logits, edges, classwise, cells, scores)
        replicates = None
    elif boot is None:
        _rows(
            preds,
            target,
            0,
            n,
            from_logits,
            edges,
            classwise,
            cells,
            scores,
            False,
            np.zeros((0, 0)),
            np.zeros((0, 2), np.int64),
            np.zeros(0),
        )
        replicates = None
    else:
        rows = min(n, step)
        room = rows * min(k, n_bins)  # at most n_bins - 1 classes of a row are above the lowest bin
        # two sets of buffers: the pass over chunk i + 1 (one core, in a thread: _rows releases the GIL) runs while
        # the matrix product of chunk i runs on the other; the chunks still go through _rows in order (same sums)
        buffers = [
            (np.empty((rows, k), dtype=_GEMM), np.empty((room, 2), dtype=np.int64), np.empty(room)) for _ in range(2)
        ]
        chunks = [(start, min(n, start + step)) for start in range(0, n, step)]
        parts = []
        with ThreadPoolExecutor(1) as pool:
            for b, counts in enumerate(boot._blocks(n, _BLOCK_ELEMENTS)):
                counts_t = np.ascontiguousarray(counts.T)  # (frame positions, resamples): each row's counts contiguous
                totals = np.zeros((k, counts.shape[0]))  # (classes, resamples)
                kept_where, kept_values = [], []

                def run(c, first_block=b == 0):
                    start, stop = chunks[c]
                    lowest, where, values = buffers[c % 2]
                    return _rows(
                        preds,
                        target,
                        start,
                        stop,
                        from_logits,
                        edges,
                        classwise and first_block,
                        cells,
                        scores,
                        True,
                        lowest,
                        where,
                        values,
                    )

                pending = pool.submit(run, 0)
                for c, (start, stop) in enumerate(chunks):
                    m = pending.result()
                    if c + 1 < len(chunks):
                        pending = pool.submit(run, c + 1)
                    lowest, where, values = buffers[c % 2]
                    chunk = counts_t[position[start:stop]].astype(_GEMM)  # (rows, resamples): a gather of whole rows
                    # OpenBLAS is fastest with the larger of K and B as the product's first side
                    if k > counts.shape[0]:
                        totals += lowest[: stop - start].T @ chunk
                    else:
                        totals += (chunk.T @ lowest[: stop - start]).T
                    kept_where.append(where[:m].copy())
                    kept_values.append(values[:m].copy())
                out = np.abs(totals).sum(axis=0)
                cell_order = np.argsort(np.concatenate(kept_where)[:, 1], kind="stable")
                _entry_sums(
                    counts_t,
                    position,
                    np.concatenate(kept_where)[cell_order],
                    np.concatenate(kept_values)[cell_order],
                    out,
                )
                parts.append(out / k / n)
        replicates = np.concatenate(parts)
    return ProbabilityRows(
        cells if classwise else None, scores, float(scores[:, 0].sum() / n), float((scores[:, 1] / n).sum()), replicates
    )
