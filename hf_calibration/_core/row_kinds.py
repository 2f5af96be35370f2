"""Logits or probabilities: which rows of an (N, K) array are probability vectors, in one compiled pass.

A row is a probability vector when every value is in [0, 1] (NaN is not) and the row sums to 1 within a
tolerance. :func:`count_rows` counts them (coarse rows apart: exact quarters, such as one-hot rows or ``[0.5, 0.5]``,
read as well as hand-written or rounded logits), and the other rows whose values all lie in [0, 1], with the first
row of each kind. It looks at every row, but leaves a row at its first value outside [0, 1] — for logits nearly always
the row's first value, so the pass reads one value a row, not the whole array. Probability rows are read whole (their sum is needed), 16 values at a time so that each
block's checks and sum vectorise.

Float32 and float64 arrays of any layout are read in place; other dtypes (float16, non-native byte order)
are converted a block of rows at a time, never as a whole copy.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from hf_calibration._core.numpy_twin import NumpyTwin

__all__ = ["RowCounts", "count_rows"]

_BLOCK = 16  # values per block: one 64-byte cache line of float32
_CONVERT_ROWS_ELEMENTS = 1 << 18  # rows converted at a time for dtypes the kernel does not read (~1 MB of float32)


# fastmath "reassoc" only vectorises the row sum (its rounding, within the 1e-2 tolerance); the range test that
# rejects NaN and inf is a comparison, which no fastmath flag here may change
@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})  # pragma: no cover - compiled
def _count_rows(x, tol, stop_at_other, offset, counts):
    """Add to ``counts`` = [probability rows (coarse ones aside), coarse probability rows (exact quarters: one-hot,
    [0.5, 0.5], ...), other rows in [0, 1]^K, first probability row (coarse aside), first other row] (row indices +
    ``offset``; -1 while not seen) over the rows of ``x``. Returns True when it stopped early."""
    n, k = x.shape
    for i in range(n):
        first = np.float64(x[i, 0])
        inside = first >= 0.0 and first <= 1.0  # a logit row nearly always ends here: one value read
        s = 0.0
        if inside:
            for start in range(0, k, _BLOCK):
                outside = False
                for j in range(start, min(start + _BLOCK, k)):
                    v = np.float64(x[i, j])
                    outside |= not (v >= 0.0 and v <= 1.0)  # NaN fails both comparisons: no float arithmetic decides
                    s += v
                if outside:
                    inside = False
                    break
        if inside and abs(s - 1.0) <= tol:
            coarse = True  # only exact quarters (0, 0.25, 0.5, 0.75, 1)? a softmax row fails at its first value
            for j in range(k):
                q = np.float64(x[i, j]) * 4.0
                if q != np.floor(q):
                    coarse = False
                    break
            if coarse:
                counts[1] += 1
            else:
                counts[0] += 1
                if counts[3] < 0:
                    counts[3] = offset + i
        else:
            if inside:
                counts[2] += 1
            if counts[4] < 0:
                counts[4] = offset + i
                if stop_at_other:
                    return True
    return False


def _twin_count_rows(x, tol, stop_at_other, offset, counts):
    """``_count_rows`` in numpy: the same counts and first rows (a row whose sum is within rounding of ``1 +- tol``
    could be read either way by the two sums' orders; the tolerance is 1e-2)."""
    with np.errstate(invalid="ignore"):
        inside = ((x >= 0.0) & (x <= 1.0)).all(axis=1)
        probability = inside & (np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol)
        quarters = x.astype(np.float64) * 4.0
        coarse = probability & (quarters == np.floor(quarters)).all(axis=1)
    other = ~probability
    stopped = bool(stop_at_other and other.any())
    if stopped:  # the kernel's rows: up to the first other row, included
        end = int(np.argmax(other)) + 1
        inside, probability, coarse, other = inside[:end], probability[:end], coarse[:end], other[:end]
    fine = probability & ~coarse
    counts[0] += int(fine.sum())
    counts[1] += int(coarse.sum())
    counts[2] += int((other & inside).sum())
    if counts[3] < 0 and fine.any():
        counts[3] = offset + int(np.argmax(fine))
    if counts[4] < 0 and other.any():
        counts[4] = offset + int(np.argmax(other))
    return stopped


_TWIN = NumpyTwin(_count_rows, compile_seconds=0.2, seconds_per_value=5e-9)


def _count(x, tol, stop_at_other, offset, counts):
    if _TWIN.use(x.size):
        return _TWIN.run(_twin_count_rows, x, tol, stop_at_other, offset, counts)
    return _count_rows(x, tol, stop_at_other, offset, counts)


class RowCounts(NamedTuple):
    probability: int  # rows that are probability vectors, coarse rows aside
    coarse: int  # probability vectors of exact quarters (one-hot, [0.5, 0.5]): as plausible as rounded logits
    boxed_other: int  # other rows with every value in [0, 1] (their sum is away from 1)
    first_probability: int  # -1: none (coarse rows aside)
    first_other: int  # -1: none


def count_rows(x: np.ndarray, tol: float, *, stop_at_other: bool = False) -> RowCounts:
    """Count the probability rows of the (N, K) float array ``x`` (and the other rows inside [0, 1]^K), with the first
    row of each kind. ``stop_at_other``: stop at the first row that is not a probability vector (the counts are then
    partial; only ``first_other == -1``, every row a probability vector, is meaningful)."""
    counts = np.array([0, 0, 0, -1, -1], dtype=np.int64)
    if x.dtype in (np.float32, np.float64) and x.dtype.isnative:
        _count(x, float(tol), stop_at_other, 0, counts)
        return RowCounts(*map(int, counts))
    n, k = x.shape
    step = max(1, _CONVERT_ROWS_ELEMENTS // max(k, 1))
    work = np.float64 if x.dtype.itemsize >= 8 else np.float32  # float16 → float32 is exact
    for start in range(0, n, step):
        chunk = np.ascontiguousarray(x[start : start + step], dtype=work)
        if _count(chunk, float(tol), stop_at_other, start, counts):
            break
    return RowCounts(*map(int, counts))
