"""Compiled row kernels of the conformal predictor: label scores, label ranks and prediction sets, one row at a time.

The scores are those of ``scores.py`` (THR: ``1 - p_y``; APS / RAPS: the cumulated probability of the classes ranked
up to ``y``, less ``u p_y``, plus ``lambda max(r - k_reg, 0)``), computed from each row's float64 softmax without an
(N, K) array of probabilities, scores or sort orders:

* a label's APS / RAPS score needs only the classes ranked above it (higher probability, or equal and a lower index,
  the stable descending sort of ``scores.py``): they are gathered and sorted, and their probabilities added in that
  order, as ``torch.cumsum`` adds the sorted row;
* an APS / RAPS set is a run of the most probable classes, and a class can only be in it if the classes ranked above
  it hold less than ``q_hat``: the candidates are the classes of the top binary-exponent buckets of probability
  (one pass) whose total mass exceeds ``q_hat``, a few classes unless the row is nearly flat; only they are sorted and
  scored. Every other class is ranked after all of them, so its score exceeds ``q_hat``.

The probabilities are float64: ``exp`` by ``_vmath.exp_into_exact`` (a few ulp from libm's or torch's), so a threshold
agrees with the torch computation of ``scores.py`` to ~1e-15, not bit for bit. Until the kernels' compile has paid for
itself, numpy twins compute the same scores and sets bit for bit (``_core.numpy_twin``; tested). Rows are independent: they run in parallel
over chunks of rows (``hf_calibration._core.parallel``), the same numbers on any number of threads. Inputs are float32 or
float64 logits (or probabilities, read as ``log(max(p, tiny))``), indexed by a row list so that a split of the
calibration data needs no copy.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_pass, serial_twin
from hf_calibration._core.vmath import exp_into_exact, exp_numpy, libm_log, max_of, sum_of, sum_of_rows_numpy

__all__ = ["THR", "APS", "RAPS", "METHOD_CODES", "label_scores", "set_rows"]

THR, APS, RAPS = 0, 1, 2
METHOD_CODES = {"thr": THR, "aps": APS, "raps": RAPS}
TINY = np.finfo(np.float64).tiny
BUCKETS = 64  # binary-exponent buckets of a probability: bucket b holds p in [2^-b, 2^(1-b)), the last one the rest
CANDIDATE_MARGIN = 1e-9  # the candidates' mass exceeds q_hat by this much, beyond any rounding of the sums
CHUNK_VALUES = 1 << 15  # values per parallel task


@numba.njit(cache=True, nogil=True)  # no FMA contraction: the numpy twin computes the same bits (``_twin_softmax``)
def _softmax(row, from_probs, p, e, bits):  # pragma: no cover - compiled
    """``p = softmax(row)`` in float64 (of ``log(max(row, tiny))`` when ``from_probs``)."""
    k = row.shape[0]
    if from_probs:
        for j in range(k):
            e[j] = math.log(max(np.float64(row[j]), TINY))
    else:
        for j in range(k):
            e[j] = np.float64(row[j])
    top = max_of(e)
    for j in range(k):
        e[j] = e[j] - top
    exp_into_exact(e, p, bits)
    total = sum_of(p)
    for j in range(k):
        p[j] = p[j] / total


@numba.njit(cache=True, nogil=True)
def _bucket(p):  # pragma: no cover - compiled
    """0 for p = 1, b for p in [2^-b, 2^(1-b)), BUCKETS - 1 below: non-increasing in p."""
    if p <= 0.0:
        return BUCKETS - 1
    exponent = math.frexp(p)[1]  # p = m 2^exponent, m in [0.5, 1)
    return min(max(1 - exponent, 0), BUCKETS - 1)


@numba.njit(cache=True, nogil=True)
def _sorted_desc(p, idx, m, keys):  # pragma: no cover - compiled
    """Sort ``idx[:m]`` (ascending class indices) by decreasing probability, ties by index (a stable sort)."""
    for i in range(m):
        keys[i] = -p[idx[i]]
    order = np.argsort(keys[:m], kind="mergesort")
    tmp = idx[:m].copy()
    for i in range(m):
        idx[i] = tmp[order[i]]


@numba.njit(cache=True, nogil=True)
def _first_max(p):  # pragma: no cover - compiled
    best, arg = p[0], 0
    for j in range(1, p.shape[0]):
        if p[j] > best:
            best, arg = p[j], j
    return arg


@numba.njit(cache=True, nogil=True)
def _label_score(p, y, method, u, k_reg, penalty, idx, keys):  # pragma: no cover - compiled
    """``(score, rank)`` of class ``y``: rank 1-based in the stable descending order."""
    py = p[y]
    if method == THR:
        m = 0
        for j in range(p.shape[0]):
            if p[j] > py or (p[j] == py and j < y):
                m += 1
        return 1.0 - py, m + 1
    m = 0
    for j in range(p.shape[0]):
        if p[j] > py or (p[j] == py and j < y):
            idx[m] = j
            m += 1
    _sorted_desc(p, idx, m, keys)
    c = 0.0
    for i in range(m):  # the cumulated sum in sorted order, as torch.cumsum adds the sorted row
        c += p[idx[i]]
    c += py
    c = 1.0 if m + 1 == p.shape[0] else min(c, 1.0)  # capped at 1, exactly 1 at the last rank (scores.ranked_scores)
    score = c - u * py
    if method == RAPS:
        score = score + penalty * max(np.float64(m + 1) - k_reg, 0.0)
    return score, m + 1


@numba.njit(cache=True, nogil=True)
def _set_of_row(p, q, method, u, k_reg, penalty, allow_empty, out, idx, keys, mass):  # pragma: no cover - compiled
    """Write the row's set ``{y : s(y) <= q}`` into ``out`` (bool, K; None-like when empty: 0-length) and return its
    size; an empty set gets the most probable class unless ``allow_empty``."""
    k = p.shape[0]
    write = out.shape[0] == k
    size = 0
    if method == THR:
        for j in range(k):
            inside = (1.0 - p[j]) <= q
            if write:
                out[j] = inside
            size += inside
    else:
        for b in range(BUCKETS):
            mass[b] = 0.0
        for j in range(k):
            mass[_bucket(p[j])] += p[j]
        last, total = BUCKETS - 1, 0.0
        for b in range(BUCKETS):
            total += mass[b]
            if total > q + CANDIDATE_MARGIN:
                last = b
                break
        m = 0
        for j in range(k):
            if write:
                out[j] = False
            if _bucket(p[j]) <= last:
                idx[m] = j
                m += 1
        _sorted_desc(p, idx, m, keys)
        c = 0.0
        for i in range(m):
            j = idx[i]
            c += p[j]
            score = (1.0 if i + 1 == k else min(c, 1.0)) - u * p[j]  # as scores.ranked_scores caps the cumulated mass
            if method == RAPS:
                score = score + penalty * max(np.float64(i + 1) - k_reg, 0.0)
            if score <= q:
                if write:
                    out[j] = True
                size += 1
    if size == 0 and not allow_empty:
        if write:
            out[_first_max(p)] = True
        size = 1
    return size


@parallel_kernel(cache=True, nogil=True)
def _label_scores(z, rows, labels, from_probs, method, u, k_reg, penalty, scores, ranks):  # pragma: no cover - compiled
    n, k = rows.shape[0], z.shape[1]
    chunk = max(1, CHUNK_VALUES // k)
    for c in numba.prange((n + chunk - 1) // chunk):
        p, e, bits, keys = np.empty(k), np.empty(k), np.empty(k), np.empty(k)
        idx = np.empty(k, np.int64)
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            _softmax(z[rows[i]], from_probs, p, e, bits)
            scores[i], ranks[i] = _label_score(
                p, labels[i], method, u[i] if u.shape[0] else 0.0, k_reg, penalty, idx, keys
            )


@parallel_kernel(cache=True, nogil=True)
def _sets(
    z, rows, labels, from_probs, method, u, k_reg, penalty, q, allow_empty, out, sizes, covered
):  # pragma: no cover
    n, k = rows.shape[0], z.shape[1]
    chunk = max(1, CHUNK_VALUES // k)
    empty = np.zeros(0, np.bool_)
    for c in numba.prange((n + chunk - 1) // chunk):
        p, e, bits, keys = np.empty(k), np.empty(k), np.empty(k), np.empty(k)
        idx = np.empty(k, np.int64)
        mass = np.empty(BUCKETS)
        row_out = np.empty(k, np.bool_)
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            _softmax(z[rows[i]], from_probs, p, e, bits)
            target = out[i] if out.shape[0] else (row_out if labels.shape[0] else empty)
            sizes[i] = _set_of_row(
                p, q, method, u[i] if u.shape[0] else 0.0, k_reg, penalty, allow_empty, target, idx, keys, mass
            )
            if labels.shape[0]:
                covered[i] = target[labels[i]]


# ------------------------------------------------------------------------------------------- the numpy twins
def _twin_softmax(x: np.ndarray, from_probs: bool) -> np.ndarray:
    """``_softmax`` of every row of ``x`` in numpy: the same operations in the same order (the exact ``exp``, the four
    lanes of ``sum_of``), so the same bits."""
    e = x.astype(np.float64)
    if from_probs:
        e = libm_log(np.maximum(e, TINY))
    p = exp_numpy(e - e.max(axis=1, keepdims=True))
    return p / sum_of_rows_numpy(p)[:, None]


def _ranked(p: np.ndarray):
    """The stable descending order of each row (ties by class index, as ``_sorted_desc``) and the cumulated sums in it."""
    order = np.argsort(-p, axis=1, kind="stable")
    return order, np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)


def _ranked_scores(cums, ranks, k, p_ranked, method, u, k_reg, penalty):
    """``_label_score``'s APS / RAPS score at 0-based ``ranks`` of ``k`` (cumulated mass capped at 1, exactly 1 at the
    last)."""
    c = np.where(ranks + 1 == k, 1.0, np.minimum(cums, 1.0))
    score = c - u * p_ranked
    if method == RAPS:
        score = score + penalty * np.maximum((ranks + 1).astype(np.float64) - k_reg, 0.0)
    return score


def _twin_label_scores(z, rows, labels, from_probs, method, u, k_reg, penalty, scores, ranks):
    """``_label_scores`` in numpy, the same bits."""
    p = _twin_softmax(z[rows], from_probs)
    n, k = p.shape
    at = np.arange(n)
    py = p[at, labels]
    above = (p > py[:, None]) | ((p == py[:, None]) & (np.arange(k)[None, :] < labels[:, None]))
    m = above.sum(axis=1)
    ranks[:] = m + 1
    if method == THR:
        scores[:] = 1.0 - py
        return
    _, cums = _ranked(p)
    scores[:] = _ranked_scores(cums[at, m], m, k, py, method, u if u.shape[0] else 0.0, k_reg, penalty)


def _buckets(p: np.ndarray) -> np.ndarray:
    """``_bucket`` of every value."""
    exponent = np.frexp(p)[1]
    return np.where(p <= 0.0, BUCKETS - 1, np.clip(1 - exponent, 0, BUCKETS - 1))


def _twin_sets(z, rows, labels, from_probs, method, u, k_reg, penalty, q, allow_empty, out, sizes, covered):
    """``_sets`` in numpy, the same bits (the candidates of APS / RAPS as the kernel finds them)."""
    p = _twin_softmax(z[rows], from_probs)
    n, k = p.shape
    at = np.arange(n)
    if method == THR:
        inside = (1.0 - p) <= q
    else:
        buckets = _buckets(p)
        mass = np.zeros((n, BUCKETS))
        np.add.at(mass, (np.repeat(at, k), buckets.ravel()), p.ravel())  # class by class, as the kernel adds them
        reached = np.cumsum(mass, axis=1) > q + CANDIDATE_MARGIN
        last = np.where(reached.any(axis=1), np.argmax(reached, axis=1), BUCKETS - 1)
        order, cums = _ranked(p)
        p_ranked = np.take_along_axis(p, order, axis=1)
        draws = u[:, None] if u.shape[0] else 0.0
        score = _ranked_scores(cums, np.arange(k)[None, :], k, p_ranked, method, draws, k_reg, penalty)
        in_ranked = (score <= q) & (np.take_along_axis(buckets, order, axis=1) <= last[:, None])
        inside = np.zeros((n, k), dtype=np.bool_)
        np.put_along_axis(inside, order, in_ranked, axis=1)
    size = inside.sum(axis=1)
    if not allow_empty:
        empty = size == 0
        inside[empty, np.argmax(p[empty], axis=1)] = True
        size = np.maximum(size, 1)
    sizes[:] = size
    if out.shape[0]:
        out[:] = inside
    if labels.shape[0]:
        covered[:] = inside[at, labels]


_TWIN = NumpyTwin(
    _label_scores, serial_twin(_label_scores), _sets, serial_twin(_sets), compile_seconds=4.5, seconds_per_value=2e-7
)


def _run(kernel, twin, size, *args) -> None:
    """``kernel`` on the threads the load leaves, or (until its compile pays) its numpy twin."""
    if _TWIN.use(size):
        _TWIN.run(twin, *args)
    else:
        run_pass(kernel, size, *args)


def _rows(z: np.ndarray, rows) -> np.ndarray:
    return np.arange(z.shape[0], dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)


def _draws(u, n: int) -> np.ndarray:
    return np.zeros(0) if u is None else np.ascontiguousarray(u, dtype=np.float64)


def label_scores(
    z: np.ndarray,
    labels: np.ndarray,
    method: str,
    *,
    rows=None,
    u=None,
    k_reg: int = 0,
    penalty: float = 0.0,
    from_probs: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, ranks)`` of each row's label: float64 scores and 1-based int64 ranks, for the rows ``rows`` of the
    (N, K) float32 / float64 C-ordered ``z`` (all rows if None; ``labels``, ``u`` align with ``rows``)."""
    rows = _rows(z, rows)
    n = rows.shape[0]
    scores, ranks = np.empty(n), np.empty(n, dtype=np.int64)
    _run(
        _label_scores,
        _twin_label_scores,
        n * z.shape[1],
        z,
        rows,
        np.ascontiguousarray(labels, dtype=np.int64),
        from_probs,
        METHOD_CODES[method],
        _draws(u, n),
        float(k_reg),
        float(penalty if method == "raps" else 0.0),
        scores,
        ranks,
    )
    return scores, ranks


def set_rows(
    z: np.ndarray,
    method: str,
    q_hat: float,
    *,
    rows=None,
    u=None,
    k_reg: int = 0,
    penalty: float = 0.0,
    allow_empty: bool = False,
    from_probs: bool = False,
    labels=None,
    masks: bool = True,
):
    """The sets of the rows ``rows`` of ``z`` at threshold ``q_hat``: ``(masks (n, K) bool or None, sizes (n,) int64,
    covered (n,) bool or None)``; ``covered`` says whether each row's label (``labels``, aligned with ``rows``) is in its
    set."""
    rows = _rows(z, rows)
    n, k = rows.shape[0], z.shape[1]
    out = np.empty((n, k) if masks else (0, k), dtype=np.bool_)
    sizes = np.empty(n, dtype=np.int64)
    labels_arr = np.zeros(0, np.int64) if labels is None else np.ascontiguousarray(labels, dtype=np.int64)
    covered = np.empty(n if labels is not None else 0, dtype=np.bool_)
    _run(
        _sets,
        _twin_sets,
        n * k,
        z,
        rows,
        labels_arr,
        from_probs,
        METHOD_CODES[method],
        _draws(u, n),
        float(k_reg),
        float(penalty if method == "raps" else 0.0),
        float(q_hat),
        allow_empty,
        out,
        sizes,
        covered,
    )
    return (out if masks else None), sizes, (covered if labels is not None else None)
