"""The top-label pass: one compiled pass over the rows of (N, K) logits or probabilities.

For each row it finds the predicted class (the first maximum, ``argmax``'s tie rule) and the top-label confidence
``p_i = max_k softmax(z_i)_k = 1 / sum_k exp(z_ik - max_k z_ik)`` (from probabilities: the largest value), and checks
the row on the way: finite values, and for ``from_logits=False`` values in [0, 1] summing to 1 within
``PROBABILITY_DETECTION_TOLERANCE``. With ``n_bins`` it also adds each row to its equal-width bin (count,
confidence, correctness; the bin rule of :func:`hf_calibration._core.bins.uniform_bin`), so ECE / MCE / the
over-under split need no per-row arrays at all.

Precision: float64 input is computed in float64 as ``1 / exp(z - max).sum()`` with libm's ``exp`` and numpy's pairwise
sum (within a few ulp of the exactly rounded value; numpy's own float64 ``exp`` may dispatch to SIMD code that differs
from libm by an ulp, so this is not numpy's softmax bit for bit on every CPU); float32 (and narrower) logits take their ``exp`` in float32 (a vectorised polynomial, within a
few float32 ulp of libm's) and the row sum in float64: a confidence moves by ~1e-7 relative against the all-float64
pass, the size of the float32 rounding of the logits themselves.

Speed: rows are independent, so tasks of ``task_rows(K)`` rows (``BLOCK`` rows, fewer for long rows) run in parallel (a ``prange``, on as many threads as the
machine's load leaves free: ``hf_calibration._core.parallel``) when the array has at least
``PARALLEL_MIN_ELEMENTS`` values, serially below that (waking threads costs more than it saves). Per-block bin sums
are added in block order, and from ``PARALLEL_MIN_ELEMENTS`` values on the pass always runs in those tasks (on one
thread: the kernel's serial twin), so the result depends on the array's size, never on the number of threads or the
machine's load. Float32 / float64 arrays in C order
are read in place; other dtypes and layouts are converted a block of rows at a time, never as a whole copy.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numba.extending
import numpy as np

from hf_calibration._core.bins import uniform_bin, uniform_edges
from hf_calibration._core.checks import PROBABILITY_DETECTION_TOLERANCE
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_pass, serial_twin
from hf_calibration._core.vmath import exp_f32_numpy, exp_into_f32, libm_exp, sum_of_rows_numpy

__all__ = ["TopLabel", "raise_row_error", "top_label", "top_label_pass"]

BLOCK = 256  # rows per parallel task, at most
TASK_VALUES = 1 << 16  # logits per parallel task, at least: long rows are split finer (see task_rows)
GROUP_VALUES = 128  # logits per exp call when rows are short (see group_rows)
PARALLEL_MIN_ELEMENTS = 1 << 19  # below this many values one thread is as fast as waking the others (even at 2.6e5)
_CONVERT_ELEMENTS = 1 << 20  # values converted at a time for dtypes / layouts the kernel does not read in place
OK, NOT_FINITE, OUT_OF_RANGE, BAD_SUM = 0, 1, 2, 3
_FLOAT64_EXP_COST = 3  # the twin's float64 logits (libm's exp, a Python call a value) against its float32 ones


def exp_row(x, out, bits):  # pragma: no cover - replaced by the overload below in compiled code
    """``out[:] = exp(x)``: float32 arrays by the vectorised ``exp_into_f32``; float64 ones by libm's ``exp``, as numpy
    computes it here (compiled code only)."""
    raise NotImplementedError


def _libm_exp(x, out, bits):  # pragma: no cover - compiled
    for j in range(x.shape[0]):
        out[j] = math.exp(x[j])


@numba.extending.overload(exp_row, jit_options={"cache": True, "fastmath": False})
def _exp_row(x, out, bits):  # pragma: no cover - compiled
    if x.dtype == numba.types.float32:
        return lambda x, out, bits: exp_into_f32(x, out, bits)
    return _libm_exp


def row_sum(e, lo, n):  # pragma: no cover - replaced by the overload below in compiled code
    """The float64 sum of the row ``e[lo:lo + n]``: float64 rows in numpy's pairwise order (``np.add.reduce`` along a
    contiguous axis: its rounding, whatever the CPU), float32 rows in four float64 lanes
    (compiled code only)."""
    raise NotImplementedError


@numba.njit(cache=True, nogil=True, fastmath=False)
def _leaf(a, lo, n):  # pragma: no cover - compiled
    """numpy's ``pairwise_sum`` base cases: a plain loop below 8 values, 8 accumulators up to 128."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3], a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@numba.njit(cache=True, nogil=True, fastmath=False)
def _pairwise(a, lo, n):  # pragma: no cover - compiled
    """numpy's ``pairwise_sum`` of ``a[lo:lo + n]`` (loops_utils.h): above 128 values, the sum of the two halves (the
    first rounded down to a multiple of 8), written as a loop over an explicit stack (numba's cache and recursion do
    not mix)."""
    if n <= 128:
        return _leaf(a, lo, n)
    los = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    phase = np.zeros(64, np.int64)
    left = np.empty(64)
    d = 0
    los[0], ns[0], phase[0] = lo, n, 0
    while True:
        m = ns[d]
        if m > 128:  # descend into the left half
            half = m // 2
            half -= half % 8
            los[d + 1], ns[d + 1], phase[d + 1] = los[d], half, 0
            d += 1
            continue
        ret = _leaf(a, los[d], m)
        d -= 1
        while True:  # hand the value up: a left half waits for its right half, a right half completes its parent
            if d < 0:
                return ret
            if phase[d] == 0:
                left[d], phase[d] = ret, 1
                half = ns[d] // 2
                half -= half % 8
                los[d + 1], ns[d + 1], phase[d + 1] = los[d] + half, ns[d] - half, 0
                d += 1
                break
            ret = left[d] + ret
            d -= 1


def _float32_sum(e, lo, n):  # pragma: no cover - compiled
    s0 = s1 = s2 = s3 = 0.0
    j = lo
    while j + 4 <= lo + n:
        s0 += np.float64(e[j])
        s1 += np.float64(e[j + 1])
        s2 += np.float64(e[j + 2])
        s3 += np.float64(e[j + 3])
        j += 4
    while j < lo + n:
        s0 += np.float64(e[j])
        j += 1
    return (s0 + s1) + (s2 + s3)


@numba.extending.overload(row_sum, jit_options={"cache": True, "fastmath": False})
def _row_sum(e, lo, n):  # pragma: no cover - compiled
    if e.dtype == numba.types.float32:
        return _float32_sum
    return lambda e, lo, n: _pairwise(e, lo, n)


@numba.njit(cache=True, nogil=True, fastmath=False)
def _max_min(row):  # pragma: no cover - compiled
    """``(max, min)`` of a non-empty row in four interleaved lanes (vectorises; exact in any order). A NaN may be
    skipped here: the caller's ``exp`` sum or value sum catches it."""
    n = row.shape[0]
    a0 = a1 = a2 = a3 = row[0]
    b0 = b1 = b2 = b3 = row[0]
    j = 0
    while j + 4 <= n:
        a0, b0 = max(a0, row[j]), min(b0, row[j])
        a1, b1 = max(a1, row[j + 1]), min(b1, row[j + 1])
        a2, b2 = max(a2, row[j + 2]), min(b2, row[j + 2])
        a3, b3 = max(a3, row[j + 3]), min(b3, row[j + 3])
        j += 4
    while j < n:
        a0, b0 = max(a0, row[j]), min(b0, row[j])
        j += 1
    return max(max(a0, a1), max(a2, a3)), min(min(b0, b1), min(b2, b3))


@numba.njit(cache=True, nogil=True, fastmath=False)
def _first_index_of(row, value):  # pragma: no cover - compiled
    """The first ``j`` with ``row[j] == value`` (0 if none: only for a non-finite row, which is reported anyway)."""
    k = row.shape[0]
    if k <= 64:  # a short row: a plain scan (the blocks' set-up cost more than the scan at K = 10)
        for j in range(k):
            if row[j] == value:
                return j
        return 0
    for start in range(0, k, 64):  # vectorised counts per 64-block, then a scan of the block that holds it
        block = row[start : min(start + 64, k)]
        hits = 0
        for j in range(block.shape[0]):
            hits += block[j] == value
        if hits:
            for j in range(block.shape[0]):
                if block[j] == value:
                    return start + j
    return 0


def task_rows(k: int) -> int:
    """Rows per parallel task: ``BLOCK``, or fewer when rows are long, so that a block of a few hundred rows still
    spreads over the threads (a fit's report passes 190-row blocks of K = 21,843: one task, one thread). It depends on
    K only, so the bin sums, added in task order, do not depend on the thread count."""
    return max(1, min(BLOCK, TASK_VALUES // k))


def group_rows(k: int) -> int:
    """Rows whose shifted logits one ``exp`` call takes, laid end to end: at K = 10 a call per row spent more on the
    vectorised loop's set-up than on its ten values (``GROUP_VALUES`` values a call; one row from K = 128)."""
    return max(1, GROUP_VALUES // k)


# no fastmath (and its helpers say so, or they would inherit a caller's): the numpy twin computes the same bits
@numba.njit(cache=True, nogil=True, fastmath=False)
def _rows(x, offset, lo, hi, target, from_logits, tol, edges, conf, pred, sums, shifted, e, bits):  # pragma: no cover
    """Rows ``lo:hi`` of ``x`` (output rows ``offset + i``). Returns ``(first bad row or -1, its kind)``. Logits go a
    group of ``len(shifted) // K`` rows at a time through one ``exp`` call (elementwise: the same values as row by row)."""
    n_bins = edges.shape[0] - 1
    k = x.shape[1]
    group = shifted.shape[0] // k if from_logits else 1
    finite = np.empty(group, np.bool_)
    tops = np.empty(group, x.dtype)
    for g in range(lo, hi, group):
        m = min(hi, g + group) - g
        if from_logits:
            for r in range(m):
                row = x[g + r]
                top, low = _max_min(row)
                tops[r] = top
                finite[r] = np.isfinite(top) and np.isfinite(low)
                for j in range(k):
                    shifted[r * k + j] = row[j] - top
            exp_row(shifted[: m * k], e[: m * k], bits[: m * k])
        for r in range(m):
            i = g + r
            row = x[i]
            if from_logits:
                top = tops[r]
                total = row_sum(e, r * k, k)
                if not (np.isfinite(total) and finite[r]):
                    return offset + i, NOT_FINITE
                c = 1.0 / total
            else:
                top, low = _max_min(row)
                total = 0.0
                for j in range(k):
                    total += np.float64(row[j])
                if not (np.isfinite(total) and np.isfinite(top) and np.isfinite(low)):
                    return offset + i, NOT_FINITE
                if low < 0 or top > 1:
                    return offset + i, OUT_OF_RANGE
                if abs(total - 1.0) > tol:
                    return offset + i, BAD_SUM
                c = np.float64(top)
            arg = _first_index_of(row, top)
            if conf.shape[0]:
                conf[offset + i] = c
                pred[offset + i] = arg
            if n_bins > 0:
                b = uniform_bin(c, edges)
                sums[0, b] += 1.0
                sums[1, b] += c
                if arg == target[offset + i]:
                    sums[2, b] += 1.0
    return -1, OK


@numba.njit(cache=True, nogil=True)
def _serial(x, offset, target, from_logits, tol, edges, conf, pred, sums, group):  # pragma: no cover - compiled
    size = x.shape[1] * group
    shifted, e, bits = np.empty(size, x.dtype), np.empty(size, x.dtype), np.empty(size, x.dtype)
    return _rows(x, offset, 0, x.shape[0], target, from_logits, tol, edges, conf, pred, sums, shifted, e, bits)


@parallel_kernel(cache=True, nogil=True)
def _parallel(x, offset, target, from_logits, tol, edges, conf, pred, sums, group, rows_per_task):  # pragma: no cover
    n, k = x.shape
    blocks = (n + rows_per_task - 1) // rows_per_task
    bad = np.full(blocks, -1, np.int64)
    kind = np.zeros(blocks, np.int64)
    part = np.zeros((blocks, 3, sums.shape[1]))
    for c in numba.prange(blocks):
        shifted, e, bits = np.empty(k * group, x.dtype), np.empty(k * group, x.dtype), np.empty(k * group, x.dtype)
        bad[c], kind[c] = _rows(
            x,
            offset,
            c * rows_per_task,
            min(n, (c + 1) * rows_per_task),
            target,
            from_logits,
            tol,
            edges,
            conf,
            pred,
            part[c],
            shifted,
            e,
            bits,
        )
    for c in range(blocks):  # in block order: the sums do not depend on the number of threads
        if bad[c] >= 0:
            return bad[c], kind[c]
        for r in range(3):
            for b in range(sums.shape[1]):
                sums[r, b] += part[c, r, b]
    return -1, OK


def _pass(x, offset, target, from_logits, edges, conf, pred, sums, parallel):
    group = group_rows(x.shape[1])
    if parallel:  # in tasks, on the threads the load leaves (one thread: the serial twin, the same tasks and sums)
        return run_pass(
            _parallel,
            x.size,
            x,
            offset,
            target,
            from_logits,
            PROBABILITY_DETECTION_TOLERANCE,
            edges,
            conf,
            pred,
            sums,
            group,
            task_rows(x.shape[1]),
        )
    return _serial(x, offset, target, from_logits, PROBABILITY_DETECTION_TOLERANCE, edges, conf, pred, sums, group)


def _twin_rows(x, from_logits):
    """The numpy twin of ``_rows`` over every row of ``x``: ``(confidence, prediction, first bad row or -1, its
    kind)``; the same
    operations in the same order (the float32 ``exp``, the row sums' lanes or pairwise order), so the same bits."""
    with np.errstate(invalid="ignore", over="ignore"):
        top = x.max(axis=1)
        if from_logits:
            shifted = x - top[:, None]
            if x.dtype == np.float32:
                # _float32_sum has sum_of's four float64 lanes
                total = sum_of_rows_numpy(exp_f32_numpy(shifted).astype(np.float64))
            else:
                total = libm_exp(shifted).sum(axis=1)  # numpy's pairwise sum of each row, as _pairwise
            bad = ~np.isfinite(x).all(axis=1)  # a row of finite logits has a finite sum in [1, K]
            kind = np.full(x.shape[0], NOT_FINITE)
            confidence = 1.0 / total
        else:
            low = x.min(axis=1)
            total = np.zeros(x.shape[0])
            for j in range(x.shape[1]):  # in the kernel's order: one running float64 sum
                total += x[:, j]
            not_finite = ~(np.isfinite(total) & np.isfinite(top) & np.isfinite(low))
            out_of_range = ~not_finite & ((low < 0) | (top > 1))
            bad_sum = ~not_finite & ~out_of_range & (np.abs(total - 1.0) > PROBABILITY_DETECTION_TOLERANCE)
            bad = not_finite | out_of_range | bad_sum
            kind = np.where(not_finite, NOT_FINITE, np.where(out_of_range, OUT_OF_RANGE, BAD_SUM))
            confidence = top.astype(np.float64)
    first = int(np.argmax(bad)) if bad.any() else -1
    return confidence, np.argmax(x, axis=1), first, (int(kind[first]) if first >= 0 else OK)


def _twin_pass(x, offset, target, from_logits, edges, conf, pred, sums, parallel):
    """``_pass`` in numpy (module ``NumpyTwin``): the same confidences, predictions, first bad row and bin sums, added
    row by row (``np.add.at``), per task from ``parallel`` on as the parallel kernel adds them."""
    confidence, prediction, bad, kind = _twin_rows(x, from_logits)
    if bad >= 0:
        return offset + bad, kind
    n = x.shape[0]
    if conf.shape[0]:
        conf[offset : offset + n] = confidence
        pred[offset : offset + n] = prediction
    n_bins = edges.shape[0] - 1
    if n_bins > 0:
        b = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)  # uniform_bin's rule
        correct = (prediction == target[offset : offset + n]).astype(np.float64)
        if parallel:  # per task from zero, the tasks added in order
            task = np.arange(n) // task_rows(x.shape[1])
            part = np.zeros((int(task[-1]) + 1 if n else 0, 3, sums.shape[1]))
            np.add.at(part[:, 0], (task, b), 1.0)
            np.add.at(part[:, 1], (task, b), confidence)
            np.add.at(part[:, 2], (task, b), correct)
            for c in range(part.shape[0]):
                sums += part[c]
        else:
            np.add.at(sums[0], b, 1.0)
            np.add.at(sums[1], b, confidence)
            np.add.at(sums[2], b, correct)
    return -1, OK


_TWIN = NumpyTwin(_serial, _parallel, serial_twin(_parallel), compile_seconds=2.0, seconds_per_value=3e-8)


def top_label_pass(preds: np.ndarray, target: np.ndarray, from_logits: bool, *, n_bins: int = 0, arrays: bool = True):
    """One pass over the (N, K) float ``preds``: ``(confidence, prediction, bin_sums, bad)``.

    ``confidence`` (float64) and ``prediction`` (int64) are (N,) arrays (empty with ``arrays=False``); ``bin_sums`` is
    (3, n_bins) float64, per equal-width bin the count, the sum of confidences and the number of correct rows
    (``n_bins = 0``: none, and ``target`` is not read); ``bad`` is ``(row, kind)`` of the first bad row, or None.
    """
    n, k = preds.shape
    conf = np.empty(n if arrays else 0, dtype=np.float64)
    pred = np.empty(n if arrays else 0, dtype=np.int64)
    edges = uniform_edges(n_bins) if n_bins else np.zeros(1)
    sums = np.zeros((3, max(n_bins, 1)))
    target = np.ascontiguousarray(target, dtype=np.int64) if n_bins else np.zeros(0, np.int64)
    parallel = n * k >= PARALLEL_MIN_ELEMENTS
    native = preds.dtype in (np.float32, np.float64) and preds.dtype.isnative and preds.flags.c_contiguous
    one_pass = _pass
    if _TWIN.use(n * k * (_FLOAT64_EXP_COST if from_logits and preds.dtype.itemsize >= 8 else 1)):

        def one_pass(*args):
            return _TWIN.run(_twin_pass, *args)

    if native:
        bad, kind = one_pass(preds, 0, target, from_logits, edges, conf, pred, sums, parallel)
    else:
        work = np.float64 if preds.dtype.itemsize >= 8 else np.float32  # float16 -> float32 is exact
        step = max(1, _CONVERT_ELEMENTS // k)
        bad, kind = -1, OK
        for start in range(0, n, step):
            block = np.ascontiguousarray(preds[start : start + step], dtype=work)
            bad, kind = one_pass(block, start, target, from_logits, edges, conf, pred, sums, parallel)
            if bad >= 0:
                break
    return conf, pred, (sums if n_bins else None), (None if bad < 0 else (int(bad), int(kind)))


class TopLabel(NamedTuple):
    confidence: np.ndarray  # (N,) float64, top-label probability
    correct: np.ndarray  # (N,) float64 in {0, 1}
    prediction: np.ndarray  # (N,) int64, argmax class


def raise_row_error(preds: np.ndarray, bad: tuple[int, int], preds_name: str) -> None:
    """The ``ValueError`` for the first bad row the pass found (its kinds: not finite, out of [0, 1], bad sum)."""
    row, kind = bad
    if kind == NOT_FINITE:
        raise ValueError(f"Expected `{preds_name}` to be finite, but row {row} contains NaN or inf.")
    values = np.asarray(preds[row], dtype=np.float64)
    if kind == OUT_OF_RANGE:
        raise ValueError(
            f"Expected `{preds_name}` to hold probabilities in [0, 1] (from_logits=False), "
            f"but found values in [{values.min():.4g}, {values.max():.4g}] (row {row})."
        )
    raise ValueError(
        f"Expected each row of `{preds_name}` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} "
        f"(from_logits=False), but row {row} sums to {values.sum():.6g}."
    )


def top_label(inputs) -> TopLabel:
    """Top-label confidence and correctness of multi-class :class:`~hf_calibration._core.inputs.Inputs`: one pass
    (which also checks the rows), float64 results."""
    confidence, prediction, _, bad = top_label_pass(inputs.preds, inputs.target, inputs.from_logits)
    if bad is not None:
        raise_row_error(inputs.preds, bad, inputs.name)
    return TopLabel(confidence, (prediction == inputs.target).astype(np.float64), prediction)
