"""Smooth calibration errors: the exact Lipschitz smCE and the kernel smECE.

* ``smce`` — smooth calibration error of Błasiok, Gopalan, Hu & Nakkiran (2023, "A unifying
  theory of distance from calibration", Def. 7.1), the quantity SMART's Theorem 3.1 bounds::

      smCE = sup_{w: [0,1] -> [-1,1], 1-Lipschitz} (1/N) sum_i w(p_i) (a_i - p_i)

  On the sorted confidences this is the linear programme ``max (1/N) sum_i w_i r_i`` with
  ``|w_i| <= 1`` and ``|w_{i+1} - w_i| <= p_(i+1) - p_(i)`` (``r_i = a_i - p_i``); the ``-r``
  programme has the same optimum (``w -> -w``), so the absolute value costs nothing.
  We solve it exactly with a dynamic programme over the concave piecewise-linear value function
  (the "slope trick"), see ``_smce_sweep``: O(n log n) for the sort, then one sweep.

* ``smece`` — kernel smooth ECE of Błasiok & Nakkiran (2023, "Smooth ECE: principled
  reliability diagrams via kernel smoothing"): the residual ``p - a`` smoothed with a
  reflected Gaussian kernel of bandwidth sigma, integrated against the smoothed density, with
  sigma the fixed point ``sigma = smECE_sigma`` found by bisection. Numerically identical (to
  ~1e-12) to ``relplot.smECE``, which discretises the kernel on a grid in the same way; here the
  convolutions are FFTs and the grid deposit a ``bincount``.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import scipy.fft

from hf_calibration._core.checks import IGNORE_INDEX, to_numpy
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics.bootstrap import SMOOTH_N_BOOT, check_bootstrap, frame

__all__ = ["smce", "smce_from_confidence", "smece", "smece_from_confidence"]


# --------------------------------------------------------------------------------------------
# exact smCE
# --------------------------------------------------------------------------------------------
#
# Derivation (primal dynamic programme).  Group equal confidences (d = 0 forces equal w, so a
# tie group acts as one point whose residual is the group's sum).  For groups g = 1..G with
# distinct sorted confidences q_g, summed residuals s_g and gaps d_g = q_{g+1} - q_g let
#
#     F_1(w)     = s_1 w                                         w in [-1, 1]
#     F_{g+1}(w) = s_{g+1} w + max_{w' in [w-d_g, w+d_g] ∩ [-1,1]} F_g(w')
#
# Then  N * smCE = max_w F_G(w).  Each F_g is concave and piecewise linear.  We keep it as
#
#     F(w) = M - sum_{l in L} a_l max(0, l - w) - sum_{r in R} b_r max(0, w - r),
#
# exact on [-1, 1], with positive weights a, b and max L <= min R, so F is flat (= M) on
# [max L, min R] and that interval meets [-1, 1]; M is then max F over [-1, 1].
#
# * Window max ("max over [w-d, w+d]") of a concave function with a flat top: the increasing
#   part moves left by d, the decreasing part right by d, the top widens by 2d. So every point
#   of L moves by -d and every point of R by +d: two lazy offsets, O(1).  (Because the flat top
#   meets [-1, 1], the window max over the real line equals the one over [-1, 1] there.)
# * Adding s*w with s > 0: identity  -c max(0, w-r) + c w = -c max(0, r-w) + c r  moves weight
#   c from the smallest point r of R to L and adds c*r to M; repeat until s is used up.
#   Points of R at r >= 1 are zero on [-1, 1] (inactive) and stay so (R only moves right):
#   drop them.  What is left of s, s', is  s' w = -s' max(0, 1-w) + s'  on w <= 1: a new
#   point at 1 in L, M += s'.  s < 0 mirrors this (largest point of L to R, M -= c*l; points
#   of L at l <= -1 are dropped; a new point at -1 in R, M += |s'|).
#
# Points only ever enter L or R next to the flat top, and a window max moves the whole of L
# (resp. R) rigidly, so both sets stay sorted as stacks: the top of L is its largest point, the
# top of R its smallest.  No heap is needed: each group pushes at most two new points (one
# partial split, one boundary point), and every other operation pops a stack.
#
# Cost: O(n log n) for the sort plus O(G + C) for the sweep, where C counts the points that
# cross between the stacks.  Measured C / n: ~2 on random data, 1.3-1.5 on strong CIFAR models,
# 6.5-9.8 on a weak CIFAR-100 LeNet resampled to n = 1e4..1e6.  An adversarial input can make
# blocks of points cross back and forth (C ~ n^2); past a budget of 32 n + 1e5 moves we rerun
# the sweep on balanced trees (``_smce_sweep_tree``), so the worst case is O(n log n).
#
# Hand check, p = (0.2, 0.6), a = (1, 0): r = (0.8, -0.6).  Group 1: R empty -> L = {1: 0.8},
# M = 0.8.  Shift d = 0.4 -> L = {0.6: 0.8}.  Group 2 (s = -0.6): move 0.6 of the point at 0.6
# to R, M = 0.8 - 0.6 * 0.6 = 0.44.  smCE = 0.44 / 2 = 0.22 (w = (1, 0.6)).


@numba.njit(cache=True, nogil=True)
def _smce_sweep(p: np.ndarray, r: np.ndarray, max_moves: int) -> tuple[float, int]:  # pragma: no cover - compiled
    """max_w sum_i w_i r_i s.t. |w_i| <= 1, |w_{i+1} - w_i| <= p_{i+1} - p_i; p sorted ascending.

    Returns ``(optimum, moves)``, or ``(-1.0, moves)`` once more than ``max_moves`` points have
    crossed between the stacks (the caller then switches to ``_smce_sweep_tree``).
    """
    n = p.shape[0]
    cap = 2 * n + 4
    l_key = np.empty(cap)  # L stack: position = key + off_l, top = largest position
    l_w = np.empty(cap)
    r_key = np.empty(cap)  # R stack: position = key + off_r, top = smallest position
    r_w = np.empty(cap)
    nl = 0
    nr = 0
    best = 0.0  # M
    moves = 0
    p0 = p[0]
    i = 0
    while i < n:
        if moves > max_moves:
            return -1.0, moves
        q = p[i]
        s = 0.0
        while i < n and p[i] == q:
            s += r[i]
            i += 1
        shift = q - p0  # total window widening so far: L moved by -shift, R by +shift
        off_l = -shift
        off_r = shift
        if s > 0.0:
            nr, nl, best, moves = _smce_move(s, 1.0, r_key, r_w, nr, off_r, l_key, l_w, nl, off_l, best, moves)
        elif s < 0.0:
            nl, nr, best, moves = _smce_move(-s, -1.0, l_key, l_w, nl, off_l, r_key, r_w, nr, off_r, best, moves)
    return best, moves


@numba.njit(cache=True, nogil=True, inline="always")
def _smce_move(rem, sign, src_key, src_w, ns, off_s, dst_key, dst_w, nd, off_d, best, moves):  # pragma: no cover
    """One group of :func:`_smce_sweep`: weight ``rem`` moves from the top of the source stack to the other one,
    ``sign = 1`` from R to L (``s > 0``), ``-1`` from L to R; what is left becomes a new point at ``sign``. Returns the
    stacks' new heights, M and the move count. (``sign * x`` is exact, so both directions compute as written apart.)"""
    while rem > 0.0 and ns > 0:
        moves += 1
        pos = src_key[ns - 1] + off_s
        if sign * pos >= 1.0:  # all of the source is inactive on [-1, 1]
            ns = 0
            break
        w = src_w[ns - 1]
        c = w if w <= rem else rem
        if w <= rem:
            ns -= 1
        else:
            src_w[ns - 1] = w - rem
        dst_key[nd] = pos - off_d
        dst_w[nd] = c
        nd += 1
        best += sign * c * pos
        rem -= c
    if rem > 0.0:
        dst_key[nd] = sign - off_d
        dst_w[nd] = rem
        nd += 1
        best += rem
    return ns, nd, best, moves


# Balanced-tree fallback.  The stacks above move points one at a time; a block of many light
# points can be moved back and forth by successive groups (e.g. residuals of alternating sign
# next to a cluster of tiny ones), costing O(n) per group.  Holding L and R in treaps (ordered by
# position, with subtree sums of w and w * key and a lazy key shift) moves any block with one
# split and one merge, so every group costs O(log n) expected and the whole sweep O(n log n).


@numba.njit(cache=True, inline="always")
def _tag(t, delta, key, lz, sw, swk):
    key[t] += delta
    lz[t] += delta
    swk[t] += delta * sw[t]


@numba.njit(cache=True, inline="always")
def _push(x, key, lz, sw, swk, lc, rc):
    d = lz[x]
    if d != 0.0:
        c = lc[x]
        if c >= 0:
            _tag(c, d, key, lz, sw, swk)
        c = rc[x]
        if c >= 0:
            _tag(c, d, key, lz, sw, swk)
        lz[x] = 0.0


@numba.njit(cache=True, inline="always")
def _pull(x, key, w, sw, swk, lc, rc):
    s = w[x]
    sk = w[x] * key[x]
    c = lc[x]
    if c >= 0:
        s += sw[c]
        sk += swk[c]
    c = rc[x]
    if c >= 0:
        s += sw[c]
        sk += swk[c]
    sw[x] = s
    swk[x] = sk


@numba.njit(cache=True)
def _split(t, mode, val, key, w, lz, sw, swk, lc, rc, path):
    """mode 0: A = key < val; 1: A = key <= val; 2: A = longest prefix of weight <= val; 3: B = longest suffix of weight <= val."""
    a_root = -1
    b_root = -1
    a_last = -1
    b_last = -1
    depth = 0
    acc = 0.0
    x = t
    while x >= 0:
        _push(x, key, lz, sw, swk, lc, rc)
        path[depth] = x
        depth += 1
        if mode == 0:
            go_a = key[x] < val
        elif mode == 1:
            go_a = key[x] <= val
        elif mode == 2:
            part = w[x] + (sw[lc[x]] if lc[x] >= 0 else 0.0)
            go_a = acc + part <= val
            if go_a:
                acc += part
        else:
            part = w[x] + (sw[rc[x]] if rc[x] >= 0 else 0.0)
            go_a = not (acc + part <= val)
            if not go_a:
                acc += part
        if go_a:
            if a_last >= 0:
                rc[a_last] = x
            else:
                a_root = x
            a_last = x
            x = rc[x]
        else:
            if b_last >= 0:
                lc[b_last] = x
            else:
                b_root = x
            b_last = x
            x = lc[x]
    if a_last >= 0:
        rc[a_last] = -1
    if b_last >= 0:
        lc[b_last] = -1
    for i in range(depth - 1, -1, -1):
        _pull(path[i], key, w, sw, swk, lc, rc)
    return a_root, b_root


@numba.njit(cache=True)
def _merge(a, b, key, w, lz, sw, swk, lc, rc, pri, path):
    if a < 0:
        return b
    if b < 0:
        return a
    root = -1
    parent = -1
    right = False
    depth = 0
    while a >= 0 and b >= 0:
        if pri[a] > pri[b]:
            _push(a, key, lz, sw, swk, lc, rc)
            node = a
            nxt_right = True
            a_next = rc[a]
        else:
            _push(b, key, lz, sw, swk, lc, rc)
            node = b
            nxt_right = False
            a_next = lc[b]
        if parent < 0:
            root = node
        elif right:
            rc[parent] = node
        else:
            lc[parent] = node
        path[depth] = node
        depth += 1
        parent = node
        right = nxt_right
        if nxt_right:
            a = a_next
        else:
            b = a_next
    rest = a if a >= 0 else b
    if right:
        rc[parent] = rest
    else:
        lc[parent] = rest
    for i in range(depth - 1, -1, -1):
        _pull(path[i], key, w, sw, swk, lc, rc)
    return root


@numba.njit(cache=True)
def _take_end(t, leftmost, amount, key, w, lz, sw, swk, lc, rc, path):
    """Remove `amount` of weight from the leftmost (or rightmost) point; return its key."""
    depth = 0
    x = t
    while True:
        _push(x, key, lz, sw, swk, lc, rc)
        path[depth] = x
        depth += 1
        nxt = lc[x] if leftmost else rc[x]
        if nxt < 0:
            break
        x = nxt
    w[x] -= amount
    k = key[x]
    for i in range(depth - 1, -1, -1):
        _pull(path[i], key, w, sw, swk, lc, rc)
    return k


@numba.njit(cache=True)
def _new(i, k, weight, key, w, lz, sw, swk, lc, rc, pri):
    key[i] = k
    w[i] = weight
    lz[i] = 0.0
    sw[i] = weight
    swk[i] = weight * k
    lc[i] = -1
    rc[i] = -1
    pri[i] = np.random.random()


@numba.njit(cache=True)
def _smce_sweep_tree(p, r):  # pragma: no cover - compiled
    """Same optimum as ``_smce_sweep`` with L and R held in treaps: O(n log n) expected, any input."""
    np.random.seed(20230101)  # priorities only shape the trees, never the value
    n = p.shape[0]
    cap = n + 4
    key = np.empty(cap)  # position - offset of the tree (L: off_l, R: off_r)
    w = np.empty(cap)  # weight (slope change) of the point
    lz = np.empty(cap)  # pending key shift for the node's children
    sw = np.empty(cap)  # subtree sum of w
    swk = np.empty(cap)  # subtree sum of w * key
    lc = np.empty(cap, np.int64)
    rc = np.empty(cap, np.int64)
    pri = np.empty(cap)
    path = np.empty(cap, np.int64)
    nodes = 0
    L = -1
    R = -1
    best = 0.0
    p0 = p[0]
    i = 0
    while i < n:
        q = p[i]
        s = 0.0
        while i < n and p[i] == q:
            s += r[i]
            i += 1
        off_l = -(q - p0)
        off_r = q - p0
        if s > 0.0:
            if R >= 0:  # drop the inactive part of R (positions >= 1)
                R, _ = _split(R, 0, 1.0 - off_r, key, w, lz, sw, swk, lc, rc, path)
            rem = s
            if R >= 0:
                A, R = _split(R, 2, rem, key, w, lz, sw, swk, lc, rc, path)
                if A >= 0:
                    moved = sw[A]
                    best += swk[A] + off_r * moved
                    _tag(A, off_r - off_l, key, lz, sw, swk)
                    L = _merge(L, A, key, w, lz, sw, swk, lc, rc, pri, path)
                    rem -= moved
            if rem > 0.0:
                if R >= 0:
                    pos = _take_end(R, True, rem, key, w, lz, sw, swk, lc, rc, path) + off_r
                else:
                    pos = 1.0
                _new(nodes, pos - off_l, rem, key, w, lz, sw, swk, lc, rc, pri)
                L = _merge(L, nodes, key, w, lz, sw, swk, lc, rc, pri, path)
                nodes += 1
                best += rem * pos
        elif s < 0.0:
            if L >= 0:  # drop the inactive part of L (positions <= -1)
                _, L = _split(L, 1, -1.0 - off_l, key, w, lz, sw, swk, lc, rc, path)
            rem = -s
            if L >= 0:
                L, B = _split(L, 3, rem, key, w, lz, sw, swk, lc, rc, path)
                if B >= 0:
                    moved = sw[B]
                    best -= swk[B] + off_l * moved
                    _tag(B, off_l - off_r, key, lz, sw, swk)
                    R = _merge(B, R, key, w, lz, sw, swk, lc, rc, pri, path)
                    rem -= moved
            if rem > 0.0:
                if L >= 0:
                    pos = _take_end(L, False, rem, key, w, lz, sw, swk, lc, rc, path) + off_l
                    best -= rem * pos
                else:
                    pos = -1.0
                    best += rem
                _new(nodes, pos - off_r, rem, key, w, lz, sw, swk, lc, rc, pri)
                R = _merge(nodes, R, key, w, lz, sw, swk, lc, rc, pri, path)
                nodes += 1
    return best


# the sweep's twin (``_core.numpy_twin``) is its own source run by Python: no fastmath, IEEE float64 throughout
_SWEEP_TWIN = NumpyTwin(_smce_sweep, compile_seconds=0.4, seconds_per_value=6e-6)


def _smce_sum(p: np.ndarray, r: np.ndarray, max_moves: int | None = None) -> float:
    """N * smCE for sorted ``p`` and residuals ``r``: stack sweep, or the treap sweep past a move budget."""
    if max_moves is None:
        max_moves = 32 * p.shape[0] + 100_000  # real data needs < 10 n (see module notes)
    if _SWEEP_TWIN.use(p.shape[0]):  # the kernel's own Python source: the same float64 operations, so the same bits
        best, _ = _SWEEP_TWIN.run(_smce_sweep.py_func, p, r, max_moves)
    else:
        best, _ = _smce_sweep(p, r, max_moves)
    if best < 0.0:
        best = _smce_sweep_tree(p, r)
    return float(best)


@numba.njit(cache=True, nogil=True)
def _smce_replicates(counts, p, r):  # pragma: no cover - compiled
    """smCE of each resample: the sweep over the sorted rows drawn at least once, residual ``c_i r_i``
    (a row drawn c times is c tied points: the sweep sums tie groups anyway). ``counts`` in the sorted
    order of ``p``. (B,)."""
    chunk = counts.shape[0]
    n = p.shape[0]
    out = np.empty(chunk)
    q = np.empty(n)
    w = np.empty(n)
    for b in range(chunk):
        m = 0
        for j in range(n):
            c = counts[b, j]
            if c:
                q[m] = p[j]
                w[m] = c * r[j]
                m += 1
        best, _ = _smce_sweep(q[:m], w[:m], 32 * m + 100_000)
        if best < 0.0:
            best = _smce_sweep_tree(q[:m], w[:m])
        out[b] = best / n
    return out


def _sorted_residuals(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p, a - p)`` in frame order: the rows sorted by confidence once (the sweep sums ties: any order would do)."""
    order = frame(confidence)
    p = np.ascontiguousarray(confidence[order])
    return p, np.ascontiguousarray(correct[order] - p)


def _smce_statistic(confidence: np.ndarray, correct: np.ndarray):
    """``counts -> (B,)`` smCE of each resample (counts in frame order)."""
    p, r = _sorted_residuals(confidence, correct)
    return lambda counts: _smce_replicates(counts, p, r)


def _check_1d(x: Any, name: str) -> np.ndarray:
    x = to_numpy(x, name)
    if x.ndim != 1:
        raise ValueError(f"Expected `{name}` to be 1-D, but got shape {tuple(x.shape)}.")
    if x.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, but got 0 elements.")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise TypeError(f"Expected `{name}` to be numeric, but got dtype {x.dtype}.")
    x = x.astype(np.float64, copy=False)
    if not np.isfinite(x).all():
        raise ValueError(f"Expected `{name}` to be finite, but it contains NaN or inf.")
    if x.min() < 0.0 or x.max() > 1.0:
        raise ValueError(f"Expected `{name}` to lie in [0, 1], but found values in [{x.min():.4g}, {x.max():.4g}].")
    return x


def _confidence_correct(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    confidence = _check_1d(confidence, "confidence")
    correct = _check_1d(correct, "correct")
    if confidence.shape != correct.shape:
        raise ValueError(
            f"Expected `confidence` and `correct` to have the same length, but got {confidence.shape[0]} and {correct.shape[0]}."
        )
    return confidence, correct


def smce_from_confidence(
    confidence: Any, correct: Any, *, ci: float | None = None, n_boot: int | None = None, seed: int = 0
) -> float:
    """Exact smCE of confidences ``p`` (N,) in [0, 1] against outcomes ``a`` (N,) in [0, 1].

    ``max (1/N) sum_i w_i (a_i - p_i)`` over ``|w_i| <= 1``, ``|w_i - w_j| <= |p_i - p_j|``
    (Błasiok et al. 2023, Def. 7.1), solved exactly in O(N log N). ``ci`` / ``n_boot`` / ``seed`` as
    :func:`smce`.
    """
    boot = check_bootstrap(ci, n_boot, seed, default_n_boot=SMOOTH_N_BOOT)
    confidence, correct = _confidence_correct(confidence, correct)
    value = _smce_sum(*_sorted_residuals(confidence, correct)) / confidence.shape[0]
    if boot is None:
        return value
    return boot.interval(value, boot.replicates([_smce_statistic(confidence, correct)], confidence.shape[0])[0], "smce")


def smce(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
) -> float:
    """Exact (Lipschitz) smooth calibration error of the top-label confidence, in [0, 1].

    ``smCE = sup_w (1/N) sum_i w(p_i) (a_i - p_i)`` over 1-Lipschitz ``w: [0,1] -> [-1,1]``
    (Błasiok, Gopalan, Hu & Nakkiran 2023; the quantity bounded by SMART's Theorem 3.1), with
    ``p_i = max_k softmax(z_i)_k`` and ``a_i = [argmax_k z_i == y_i]``. Computed exactly (it is
    the optimum of a linear programme) in O(N log N); N = 1e6 takes well under a second.
    Equal confidences get one ``w`` (the Lipschitz bound forces it), so a tie group counts only
    through its summed residual: neither the order of the samples nor their correctness can
    split it.

    Args:
        preds: (N, K) logits or probabilities; torch or numpy.
        target: (N,) integer labels; ``ignore_index`` rows are dropped.
        from_logits: ``None`` (default) detects probabilities (every value in [0, 1], rows
            summing to 1 within 1e-2), as :func:`hf_calibration.metrics.ece`; True/False win.
        ci, n_boot, seed: a percentile bootstrap interval, as :func:`hf_calibration.metrics.ece`, but
            ``n_boot`` defaults to 200: each resample costs one O(N) sweep over the rows sorted once
            (timings: ``benchmarks/RESULTS.md``).

    Example:
        >>> import numpy as np
        >>> round(smce(np.log([[0.8, 0.2], [0.4, 0.6]]), np.array([0, 1])), 6)  # all correct
        0.3
        >>> round(smce(np.array([[0.8, 0.2], [0.4, 0.6]]), np.array([0, 1])), 6)  # probabilities, detected
        0.3
    """
    check_bootstrap(ci, n_boot, seed)  # before any work
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return smce_from_confidence(top.confidence, top.correct, ci=ci, n_boot=n_boot, seed=seed)


# --------------------------------------------------------------------------------------------
# kernel smECE (relplot-compatible)
# --------------------------------------------------------------------------------------------

_MESH_POINTS = 200  # relplot.config.smECE_mesh_pts
_DENSITY_EPS = 1e-4  # relplot's BaseKernelMixin.smooth eps
_SIGMA_EPS = 1e-3  # smallest bandwidth considered (relplot's smECE eps)
_BISECTION_STEPS = 10


def _grid_points(sigma: float) -> int:
    return max(2000, round(20 / sigma)) // 2 + 1


def _grid_position(f: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Left grid point and interpolation fraction of each ``f`` on m equispaced points of [0, 1]."""
    x = f * (m - 1)
    idx = x.astype(np.int64).clip(0, m - 2)
    return idx, x - idx


@numba.njit(cache=True, nogil=True)
def _deposit(idx, frac, residual, counts, m):  # pragma: no cover - compiled
    """Linear-interpolation deposit of each sample's residual and unit mass onto m grid points, one
    (2, m) grid per row of ``counts`` (sample i weighted by ``counts[r, i]``, as that many copies).
    The left and right shares are summed separately in sample order, as two ``np.bincount`` would."""
    rows, n = counts.shape
    left = np.zeros((rows, 2, m))
    right = np.zeros((rows, 2, m))
    for r in range(rows):
        for i in range(n):  # branch-free: a sample weighted 0 adds 0
            c = np.float64(counts[r, i])
            v = c * residual[i]
            j = idx[i]
            left[r, 0, j] += (1.0 - frac[i]) * v
            right[r, 0, j + 1] += frac[i] * v
            left[r, 1, j] += (1.0 - frac[i]) * c
            right[r, 1, j + 1] += frac[i] * c
    return left + right


def _twin_deposit(idx, frac, residual, counts, m):
    """``_deposit`` by ``np.bincount`` (which adds in sample order, as the kernel): the same bits."""
    rows = counts.shape[0]
    out = np.empty((rows, 2, m))
    for r in range(rows):
        c = counts[r].astype(np.float64)
        v = c * residual
        for q, mass in enumerate((v, c)):
            left = np.bincount(idx, weights=(1.0 - frac) * mass, minlength=m)
            right = np.bincount(idx + 1, weights=frac * mass, minlength=m)
            out[r, q] = left[:m] + right[:m]
    return out


_TWIN = NumpyTwin(_deposit, compile_seconds=0.5, seconds_per_value=2e-8)


def _fft_length(m: int) -> int:
    """Circular convolution length for a reflected grid of m points: 3m - 2 suffices (see ``_reflected_smooth``)."""
    return scipy.fft.next_fast_len(3 * m - 2, real=True)


def _reflected_spectrum(grid: np.ndarray) -> np.ndarray:
    """Spectrum of gridded values (R, 2, m) reflected at 0 and 1 (length 3m - 2), zero-padded to ``_fft_length``."""
    m = grid.shape[-1]
    ext = np.concatenate([grid[..., ::-1][..., :-1], grid, grid[..., ::-1][..., 1:]], axis=-1)
    return scipy.fft.rfft(ext, n=_fft_length(m), axis=-1)


def _reflected_smooth(spectrum: np.ndarray, sigma: np.ndarray, m: int) -> np.ndarray:
    """Gaussian smoothing (unnormalised kernel on the m grid points, bandwidth ``sigma[r]`` for row r) of
    gridded values given by their reflected spectrum, on the m grid points: (R, 2, m).

    The linear convolution of the 3m - 2 reflected values with the m kernel values is wanted at indices
    m - 1 + m // 2 onwards, m of them; a circular convolution of length L >= 3m - 2 folds index k + L
    onto k only for k <= 4m - 4 - L <= m - 2, so those indices are exact.
    """
    t = np.linspace(0, 1, m)
    s = sigma[:, None]
    kernel = np.exp(-((t - 0.5) ** 2) / (2 * s**2)) / (np.sqrt(2 * np.pi) * s)
    full = scipy.fft.irfft(
        spectrum * scipy.fft.rfft(kernel, n=_fft_length(m), axis=-1)[:, None, :], n=_fft_length(m), axis=-1
    )
    start = m - 1 + m // 2
    return full[..., start : start + m]


def _interpolate(t: np.ndarray, y: np.ndarray) -> np.ndarray:
    m = y.shape[-1]
    idx = (t * (m - 1)).astype(np.int64).clip(0, m - 2)
    frac = (t - idx / (m - 1)) * (m - 1)
    return y[..., idx] * (1 - frac) + y[..., idx + 1] * frac


class _SmoothECE:
    """smECE at a bandwidth per row, for R weightings of one sample at once (vectorised over rows).

    Row r weights sample i by ``counts[r, i]`` (a bootstrap resample's counts; default one row of ones,
    the sample itself). Gridded deposits are cached by grid size and computed only for the rows that
    need that size (as the spectra of their reflections: those do not depend on the bandwidth); each row's
    value is exactly what that row alone would give.
    """

    _BATCH = 128  # rows per FFT batch: (128, 2, ~1.5k) complex products, a few MB

    def __init__(self, f: np.ndarray, y: np.ndarray, counts: np.ndarray | None = None):
        self.f = f
        self.residual = f - y
        self.counts = np.ones((1, f.shape[0]), dtype=np.int32) if counts is None else counts
        self._spectra: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # m -> (spectra, rows computed)

    @property
    def rows(self) -> int:
        return self.counts.shape[0]

    def spectrum(self, m: int, rows: np.ndarray) -> np.ndarray:
        """The reflected spectrum of the (2, m) deposit of each of ``rows``, computed once per grid size."""
        if m not in self._spectra:
            self._spectra[m] = (
                np.empty((self.rows, 2, _fft_length(m) // 2 + 1), dtype=np.complex128),
                np.zeros(self.rows, dtype=bool),
            )
        spectra, done = self._spectra[m]
        missing = rows[~done[rows]]
        if missing.size:
            idx, frac = _grid_position(self.f, m)
            counts = self.counts[missing]
            if _TWIN.use(counts.size):
                gridded = _TWIN.run(_twin_deposit, idx, frac, self.residual, counts, m)
            else:
                gridded = _deposit(idx, frac, self.residual, counts, m)
            spectra[missing] = _reflected_spectrum(gridded)
            done[missing] = True
        return spectra[rows]

    def __call__(self, sigma: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """smECE at bandwidth ``sigma[j]`` for row ``rows[j]``."""
        out = np.empty(rows.shape[0])
        points = np.array([_grid_points(s) for s in sigma])
        for m in np.unique(points):
            for chunk in np.array_split(np.flatnonzero(points == m), -(-np.count_nonzero(points == m) // self._BATCH)):
                smoothed = _reflected_smooth(self.spectrum(int(m), rows[chunk]), sigma[chunk], int(m))
                mesh = np.array([max(round(10 / s), _MESH_POINTS) for s in sigma[chunk]])
                for length in np.unique(mesh):
                    same = mesh == length
                    num, dens = np.moveaxis(_interpolate(np.linspace(0, 1, length), smoothed[same]), 1, 0)
                    dens = dens + _DENSITY_EPS
                    out[chunk[same]] = np.sum(np.abs(num / dens) * dens, axis=-1) / np.sum(dens, axis=-1)
        return out


def _fixed_point_sigma(value: _SmoothECE) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth sigma with sigma ~= smECE_sigma (Błasiok & Nakkiran 2023, Sec. 4), by bisection, for
    every row of ``value`` at once; returns (sigma, smECE at sigma) per row.

    Same search as relplot: sigma = 1 if smECE_1 >= 1, else 10 halvings of [0, 1] keeping the
    upper end, where "sigma too small" means sigma < 1e-3 or sigma < smECE_sigma.
    """
    rows = np.arange(value.rows)
    at_hi = value(np.ones(value.rows), rows)  # smECE at the upper end, which is where the search ends
    search = ~(at_hi > 1.0)  # too small at sigma = 1: sigma = 1
    hi, lo = np.ones(value.rows), np.zeros(value.rows)
    for _ in range(_BISECTION_STEPS):
        mid = (hi + lo) / 2
        small = search & (mid < _SIGMA_EPS)
        ask = search & ~small
        at_mid = np.full(value.rows, np.nan)
        at_mid[ask] = value(mid[ask], rows[ask])
        small |= ask & (mid < at_mid)
        lo = np.where(small, mid, lo)
        moved = search & ~small
        hi = np.where(moved, mid, hi)
        at_hi = np.where(moved, at_mid, at_hi)
    return hi, at_hi


def _smece_statistic(confidence: np.ndarray, correct: np.ndarray):
    """``counts -> (B,)`` smECE of each resample (counts in frame order): deposits weighted by the counts,
    every resample's own bandwidth search, all resamples of a block smoothed together."""
    order = frame(confidence)
    f, y = np.ascontiguousarray(confidence[order]), np.ascontiguousarray(correct[order])
    return lambda counts: _fixed_point_sigma(_SmoothECE(f, y, counts))[1]


def smece_from_confidence(
    confidence: Any,
    correct: Any,
    *,
    return_sigma: bool = False,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
):
    """Kernel smooth ECE of confidences (N,) against outcomes (N,), both in [0, 1].

    Equals ``relplot.smECE(confidence, correct)``; with ``return_sigma=True`` returns
    ``(smece, sigma)``, sigma being the fixed-point bandwidth. ``ci`` / ``n_boot`` / ``seed`` as
    :func:`smece` (each resample searches its own bandwidth).
    """
    boot = check_bootstrap(ci, n_boot, seed, default_n_boot=SMOOTH_N_BOOT)
    confidence, correct = _confidence_correct(confidence, correct)
    sigma, result = (float(x[0]) for x in _fixed_point_sigma(_SmoothECE(confidence, correct)))
    if boot is not None:
        replicates = boot.replicates([_smece_statistic(confidence, correct)], confidence.shape[0])[0]
        result = boot.interval(result, replicates, "smece")
    return (result, sigma) if return_sigma else result


def smece(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
) -> float:
    """Kernel smooth ECE (smECE, Błasiok & Nakkiran 2023) of the top-label confidence, in [0, 1].

    The residual ``p_i - a_i`` is smoothed with a reflected Gaussian kernel of bandwidth sigma
    and ``smECE_sigma = ∫ |smoothed residual| · smoothed density``; sigma is the fixed point
    ``sigma = smECE_sigma``. Matches ``relplot.smECE`` on ``(confidence, correct)`` to 1e-6.
    The kernel sees the values only (sums over samples), so the order of tied samples is irrelevant.

    Args:
        preds: (N, K) logits or probabilities; torch or numpy.
        target: (N,) integer labels; ``ignore_index`` rows are dropped.
        from_logits: ``None`` (default) detects probabilities (every value in [0, 1], rows
            summing to 1 within 1e-2), as :func:`hf_calibration.metrics.ece`; True/False win.
        ci, n_boot, seed: a percentile bootstrap interval, as :func:`hf_calibration.metrics.ece`, but
            ``n_boot`` defaults to 200: each resample runs its own bandwidth search (about 11 kernel
            smoothings; see ``benchmarks/bootstrap_speed.py``). relplot's own band uses 100.
    """
    check_bootstrap(ci, n_boot, seed)  # before any work
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return smece_from_confidence(top.confidence, top.correct, ci=ci, n_boot=n_boot, seed=seed)
