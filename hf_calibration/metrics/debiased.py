"""Debiased calibration error (Kumar, Liang & Ma 2019, "Verified Uncertainty Calibration", Sec. 5).

The plug-in binned estimate of the L2 calibration error, ``sum_b w_b (p̄_b - ȳ_b)^2`` with ``w_b = n_b / N``,
is biased upwards: each bin's squared gap carries the variance of its label mean. The debiased estimator
subtracts that variance, estimated without bias, in every bin with ``n_b >= 2``::

    CE_2^2 ≈ sum_b w_b [ (p̄_b - ȳ_b)^2 - ȳ_b (1 - ȳ_b) / (n_b - 1) ],     CE_2 = sqrt(max(CE_2^2, 0))

(bins with fewer than two samples count 0). For the L1 error (the usual ECE) the paper's code corrects
the plug-in with a normal model of each bin's label mean, ``ȳ_b ~ N(ȳ_b, ȳ_b (1 - ȳ_b) / n_b)``::

    CE_1 ≈ 2 · sum_b w_b |p̄_b - ȳ_b|  -  E[ sum_b w_b |Y_b - p̄_b| ]

The reference implementation (the ``uncertainty-calibration`` package, ``calibration.utils``) estimates
that expectation from 1,000 normal draws of the global numpy stream; here it is computed exactly
(``E|Y - c| = s sqrt(2/pi) exp(-d^2 / 2 s^2) + d (1 - 2 Phi(-d / s))``, ``d = ȳ - c``), the limit of those
draws. ``mc_samples=1000, mc_seed=s`` reproduces the reference's draws instead (it equals the reference
run right after ``np.random.seed(s)``).

Binning follows the reference exactly. ``binning="equal_mass"`` (its ``get_equal_bins``, what it uses for
continuous outputs): the sorted values are cut into ``min(n_bins, N)`` runs (``np.array_split``), the bin
boundaries are the midpoints between the last value of a run and the first of the next, plus 1.0, and a
value goes to the first boundary at or above it. ``binning="distinct"`` (its ``get_discrete_bins``): one
bin per distinct value, for the outputs of a binning calibrator, whose calibration error this estimates
without the scaling lower bound. The reference's ``get_calibration_error`` picks ``"distinct"`` itself when
every class column of the probabilities holds fewer than N/4 distinct values; here the caller says which.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX, check_choice, check_int
from hf_calibration.metrics._boundary import metric_call
from hf_calibration.metrics._format import Inputs, probability_chunks, top_label
from hf_calibration.metrics.binning import _check_n_bins, _run_sizes
from hf_calibration.metrics.bootstrap import IntervalRule, advance, frame

__all__ = ["debiased_ece"]

_MODES = ("top-label", "marginal")
_BINNINGS = ("equal_mass", "distinct")
_COLUMN_BLOCK_ELEMENTS = 1 << 22  # marginal mode: class columns are formed this many values at a time
_DISTINCT = IntervalRule(
    "none",
    reason=(
        "binning='distinct' on values that are mostly distinct (N/4 or more distinct values, the reference's own test for "
        "binned outputs): a resample duplicates rows into bins the data do not have, so its estimate says nothing about "
        "this one's spread; no interval is given"
    ),
)


@numba.njit(cache=True, nogil=True)
def _debiased_value(count, sum_p, sum_y, n, power, raw=False):  # pragma: no cover - compiled
    """The debiased estimate (p = 1 or 2) from per-bin count and sums of values and labels; ``n`` = total. ``raw``:
    for p = 2 the estimate of CE^2 itself, before ``sqrt(max(., 0))`` (unbiased, may be negative)."""
    plug = 0.0
    correction = 0.0
    for b in range(count.shape[0]):
        m = count[b]
        if m == 0:
            continue
        w = m / n
        mean_p = sum_p[b] / m
        mean_y = sum_y[b] / m
        if power == 2:
            if m >= 2:
                plug += w * ((mean_p - mean_y) ** 2 - mean_y * (1.0 - mean_y) / (m - 1.0))
        else:
            d = mean_y - mean_p
            plug += w * abs(d)
            s = math.sqrt(mean_y * (1.0 - mean_y) / m)
            if s > 0.0:
                correction += w * (
                    s * math.sqrt(2.0 / math.pi) * math.exp(-d * d / (2.0 * s * s))
                    + d * (1.0 - math.erfc(d / (s * math.sqrt(2.0))))
                )
            else:
                correction += w * abs(d)
    if power == 2:
        return plug if raw else math.sqrt(max(plug, 0.0))
    return 2.0 * plug - correction


@numba.njit(cache=True, nogil=True)
def _boundaries(p, weight, closing, distinct):  # pragma: no cover - compiled
    """Bin boundaries of the sample ``p`` (sorted) with multiplicities ``weight``: midpoints between runs
    (equal mass: the runs end at expanded positions ``closing``) or between distinct values, then 1.0;
    duplicates dropped, as the reference's ``sorted(set(...))``."""
    n = p.shape[0]
    out = np.empty(n + closing.shape[0] + 1)
    k = 0
    if distinct:
        prev = -1.0
        for j in range(n):
            if weight[j] > 0:
                if prev >= 0.0 and p[j] > prev:
                    out[k] = (prev + p[j]) / 2.0
                    k += 1
                prev = p[j]
    else:
        cum = 0
        j = 0
        for u in range(closing.shape[0]):
            j, cum = advance(weight, j, cum, closing[u])
            last = p[j - 1]  # the value at expanded position closing[u] - 1
            nxt = j - 1 if cum > closing[u] else j
            while weight[nxt] == 0:
                nxt += 1
            out[k] = (last + p[nxt]) / 2.0  # ... and the value at position closing[u]
            k += 1
    out[k] = 1.0
    k += 1
    bounds = np.sort(out[:k])
    keep = np.ones(k, dtype=np.bool_)
    for i in range(1, k):
        keep[i] = bounds[i] != bounds[i - 1]
    return bounds[keep]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _binned_sums(p, y, weight, bounds):  # pragma: no cover - compiled
    """Per-bin weighted count and sums; sample j goes to the first boundary >= p[j] (the last bin above 1).
    ``p`` is sorted, so each bin is a run of rows: contiguous, vectorised sums (slices, as bootstrap.segment_sums)."""
    nb = bounds.shape[0]
    count = np.zeros(nb)
    sum_p = np.zeros(nb)
    sum_y = np.zeros(nb)
    ends = np.searchsorted(p, bounds, side="right")
    ends[nb - 1] = p.shape[0]
    start = 0
    for b in range(nb):
        w, values, labels = weight[start : ends[b]], p[start : ends[b]], y[start : ends[b]]
        c = sp = sy = 0.0
        for j in range(w.shape[0]):
            c += w[j]
            sp += w[j] * values[j]
            sy += w[j] * labels[j]
        count[b], sum_p[b], sum_y[b] = c, sp, sy
        start = max(start, ends[b])
    return count, sum_p, sum_y


@numba.njit(cache=True, nogil=True)
def _debiased_replicates(counts, p, y, closing, distinct, power, raw):  # pragma: no cover - compiled
    """The estimate on each resample: boundaries re-cut from the resample, walking the rows sorted once
    (``counts`` in that sorted order)."""
    chunk = counts.shape[0]
    n = p.shape[0]
    out = np.empty(chunk)
    for b in range(chunk):
        weight = counts[b]
        bounds = _boundaries(p, weight, closing, distinct)
        count, sum_p, sum_y = _binned_sums(p, y, weight, bounds)
        out[b] = _debiased_value(count, sum_p, sum_y, n, power, raw)
    return out


class _Sorted:
    """One (value, label) column sorted once, with what the estimator needs."""

    def __init__(self, values: np.ndarray, labels: np.ndarray, n_bins: int, binning: str):
        self.order = frame(values)
        self.p = np.ascontiguousarray(values[self.order], dtype=np.float64)
        self.y = np.ascontiguousarray(labels[self.order], dtype=np.float64)
        n = values.shape[0]
        self.closing = np.cumsum(_run_sizes(n, min(n_bins, n)))[:-1]
        self.distinct = binning == "distinct"

    def sums(self):
        bounds = _boundaries(self.p, np.ones(self.p.shape[0], dtype=np.int64), self.closing, self.distinct)
        return _binned_sums(self.p, self.y, np.ones(self.p.shape[0], dtype=np.int64), bounds)

    def value(self, power: int, mc_samples: int | None, rng: np.random.RandomState | None) -> float:
        count, sum_p, sum_y = self.sums()
        if mc_samples is None:
            return float(_debiased_value(count, sum_p, sum_y, self.p.shape[0], power))
        return _monte_carlo_l1(count, sum_p, sum_y, mc_samples, rng)

    def raw(self, power: int) -> float:
        """The estimate on the scale the interval is formed on: CE^2 before ``sqrt(max(., 0))`` for p = 2."""
        count, sum_p, sum_y = self.sums()
        return float(_debiased_value(count, sum_p, sum_y, self.p.shape[0], power, True))

    def plugin(self, power: int) -> float:
        """The plug-in (not debiased) error of the same bins, ``(sum_b w_b |p̄_b - ȳ_b|^p)^(1/p)``: the value that
        a resample's debiased estimate estimates (the basic interval's pivot, as Kumar et al.'s bootstrap)."""
        count, sum_p, sum_y = self.sums()
        filled = count > 0
        gap = np.abs(sum_p[filled] - sum_y[filled]) / count[filled]
        return float(np.sum(count[filled] / self.p.shape[0] * gap**power) ** (1.0 / power))

    def mostly_distinct(self) -> bool:
        """N/4 or more distinct values: the reference's test (``enough_duplicates``) for outputs that are not binned."""
        return self.distinct and np.count_nonzero(np.diff(self.p)) + 1 >= self.p.shape[0] / 4.0

    def replicates(self, counts: np.ndarray, power: int, raw: bool = False) -> np.ndarray:
        """The estimate on each resample (``raw``: as :meth:`raw`), ``counts`` in this column's own sorted order."""
        return _debiased_replicates(counts, self.p, self.y, self.closing, self.distinct, power, raw)


def _monte_carlo_l1(count, sum_p, sum_y, mc_samples: int, rng: np.random.RandomState) -> float:
    """The reference's L1 correction by ``mc_samples`` normal draws (``normal_debiased_ce``), in its order."""
    if count.min() <= 1:
        raise ValueError(
            "Expected every bin to hold at least 2 samples for the Monte Carlo debiasing (p=1, mc_samples), "
            "as the reference requires; use fewer bins or mc_samples=None (exact)."
        )
    weights = count / count.sum()
    label_means, model_vals = sum_y / count, sum_p / count
    scale = np.sqrt(label_means * (1 - label_means) / count)
    plugin = float(np.dot(weights, np.abs(model_vals - label_means)))
    draws = label_means + scale * rng.standard_normal((mc_samples, count.shape[0]))
    resampled = np.abs(draws - model_vals) @ weights
    return 2 * plugin - float(np.mean(resampled))


def _class_columns(inputs: Inputs):
    """Yield ``(classes, probabilities (N, len(classes)))`` column blocks, each from one streaming pass."""
    n, k = inputs.preds.shape
    width = max(1, min(k, _COLUMN_BLOCK_ELEMENTS // max(n, 1)))
    for start in range(0, k, width):
        classes = np.arange(start, min(k, start + width))
        block = np.empty((n, classes.shape[0]))
        for rows, probs, _ in probability_chunks(inputs):
            block[rows] = probs[:, classes]
        yield classes, block


def debiased_ece(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    p: int = 2,
    mode: str = "top-label",
    binning: str = "equal_mass",
    mc_samples: int | None = None,
    mc_seed: int = 0,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
) -> float:
    """Debiased binned calibration error (Kumar, Liang & Ma 2019), L2 (default) or L1.

    Equals ``uncertainty-calibration``'s ``get_top_calibration_error(probs, labels, p, debias=True)`` for
    ``mode="top-label"`` and ``get_calibration_error(probs, labels, p, debias=True, mode="marginal")`` for
    ``mode="marginal"`` (on continuous outputs; see the module docstring for ``binning`` and for p = 1).

    Args:
        preds: ``(N, K)`` logits or probabilities, torch or numpy.
        target: ``(N,)`` integer labels; ``ignore_index`` rows are dropped.
        n_bins: equal-mass bins (15, the reference's default), at most N are used.
        p: 2 (the L2 error, the estimator the paper proves better) or 1 (the L1 error, the usual ECE).
        mode: ``"top-label"`` (the top-label confidence against correctness) or ``"marginal"`` (each
            class's probability against ``[y == k]``, then ``(mean_k CE_k^p)^(1/p)``: the classwise form).
        binning: ``"equal_mass"`` or ``"distinct"`` (one bin per distinct value, for binned outputs).
        mc_samples, mc_seed: p = 1 only: None (default) for the exact correction, or the number of the
            reference's normal draws, from ``numpy.random.RandomState(mc_seed)``.
        from_logits: ``None`` detects probabilities, as :func:`hf_calibration.metrics.ece`.
        ci, n_boot, seed: a bootstrap interval (the bins re-cut on every resample; exact correction only):
            the basic interval with the plug-in as the functional, as Kumar et al.'s own bootstrap
            (``bootstrap_uncertainty``): ``[e + v - q_hi, e + v - q_lo]``, ``e`` the estimate, ``v`` the plug-in
            error of the same bins and ``q`` the quantiles of the resampled estimates, all on the scale of
            ``CE^p`` (for p = 2 the unbiased estimate of ``CE^2`` before its ``sqrt(max(., 0))``, mean over
            classes in the marginal mode), then taken back to ``CE``; an end below 0 becomes 0. A resample's debiased
            estimate estimates the sample's plug-in value, not its debiased one: the percentile interval sat
            above a calibrated model's value on every draw, this one brackets it (coverage in
            ``benchmarks/bootstrap_coverage.py``). With ``binning="distinct"`` on values that are mostly
            distinct there is no interval (NaN ends and a note): resampling makes bins the data do not have.

    Returns:
        the estimate, a fraction (the L1 form can fall below 0 on a well-calibrated model: it is
        unbiased, not clipped); with ``ci``, a :class:`~hf_calibration.metrics.MetricInterval`.

    Warns:
        UserWarning: for the L2 error (``p=2``) with equal-mass bins when N < 2 · ``n_bins``: some bins then hold
            one sample, which the estimator counts as 0 (as the reference), so it reads low, and 0 at N <= ``n_bins``
            even for a model confidently wrong on every sample. Use ``n_bins <= N // 2``, or ``p=1``.

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.35, 0.65]])  # all four right
        >>> labels = np.array([0, 0, 1, 1])
        >>> # 2 equal-mass bins {0.65, 0.7} and {0.8, 0.9}: gaps 0.325 and 0.15, no label variance to remove
        >>> round(debiased_ece(probs, labels, 2), 4), round(((0.325**2 + 0.15**2) / 2) ** 0.5, 4)
        (0.2531, 0.2531)
        >>> round(debiased_ece(probs, labels, 2, p=1), 4)  # (0.325 + 0.15) / 2
        0.2375
    """
    n_bins = _check_n_bins(n_bins)
    if p not in (1, 2) or isinstance(p, bool):
        raise ValueError(f"Expected argument `p` to be 1 (L1) or 2 (L2), but got {p!r}.")
    check_choice(mode, "mode", _MODES)
    check_choice(binning, "binning", _BINNINGS)
    if mc_samples is not None:
        mc_samples = check_int(mc_samples, "mc_samples", minimum=1)
        if p != 1:
            raise ValueError("Expected argument `mc_samples` to be None for p=2: only the L1 correction is drawn.")
        if ci is not None:
            raise ValueError("Expected argument `mc_samples` to be None with `ci`: resamples use the exact correction.")
    mc_seed = check_int(mc_seed, "mc_seed", minimum=0)
    inputs, n_bins, boot, _ = metric_call("debiased_ece", preds, target, n_bins, locals())
    rng = np.random.RandomState(mc_seed) if mc_samples is not None else None
    n = inputs.preds.shape[0]
    if p == 2 and binning == "equal_mass" and n < 2 * n_bins:
        import warnings

        warnings.warn(
            f"debiased_ece: N = {n} samples in n_bins = {n_bins} equal-mass bins leaves bins of one sample, which the L2 "
            "estimator counts as 0 (one label has no variance to estimate), as the reference does: the estimate reads "
            f"low, and 0 whenever N <= n_bins however miscalibrated the model. Use n_bins <= N // 2 ({n // 2}), or p=1.",
            UserWarning,
            stacklevel=2,
        )

    if mode == "top-label":
        top = top_label(inputs)
        column = _Sorted(top.confidence, top.correct, n_bins, binning)  # its order is the frame (see bootstrap)
        value = column.value(p, mc_samples, rng)
        if boot is None:
            return value
        if column.mostly_distinct():
            return boot.interval(value, np.zeros(0), _DISTINCT)
        replicates = boot.replicates([lambda counts: column.replicates(counts, p, raw=True)], n)[0]
        return boot.interval(
            value, replicates, "debiased_ece", plugin=column.plugin(p) ** p, estimate=column.raw(p), power=p
        )

    per_class, plugins, raws, replicates, distinct = [], [], [], [], False
    position = None
    if boot is not None:  # the resamples are over the frame (rows by top-label confidence); each class gathers from it
        position = np.empty(n, dtype=np.int64)
        position[frame(top_label(inputs).confidence)] = np.arange(n)
    for classes, block in _class_columns(inputs):
        columns = [
            _Sorted(block[:, j], (inputs.target == k).astype(np.float64), n_bins, binning)
            for j, k in enumerate(classes)
        ]
        per_class += [c.value(p, mc_samples, rng) ** p for c in columns]
        if boot is None:
            continue
        plugins += [c.plugin(p) ** p for c in columns]
        raws += [c.raw(p) for c in columns]
        distinct = distinct or any(c.mostly_distinct() for c in columns)
        if not distinct:  # every block sees the same resamples (the same seed)
            statistic = lambda counts: np.stack(  # noqa: E731
                [c.replicates(np.take(counts, position[c.order], axis=1), p, raw=True) for c in columns], axis=1
            )
            replicates.append(boot.replicates([statistic], n)[0])
    value = float(np.mean(per_class) ** (1.0 / p))
    if boot is None:
        return value
    if distinct:
        return boot.interval(value, np.zeros(0), _DISTINCT)
    return boot.interval(
        value,
        np.mean(np.concatenate(replicates, axis=1), axis=1),
        "debiased_ece",
        plugin=float(np.mean(plugins)),
        estimate=float(np.mean(raws)),
        power=p,
    )
