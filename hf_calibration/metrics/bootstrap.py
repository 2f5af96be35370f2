"""Percentile bootstrap intervals for every metric, resampling rows as multinomial counts.

A bootstrap resample of N rows is a count vector ``c`` (how often each row was drawn, ``sum c = N``,
multinomial). Every metric here is a function of per-row quantities (the top-label confidence and
correctness, each row's Brier / NLL term, each row's class probabilities for classwise ECE), so its
value on the resample is the same function with row ``i`` weighted by ``c_i``. Each metric module
therefore supplies a compiled *weighted* form that takes a block of count vectors and never
materialises a resampled array: O(N) per resample (O(N·K) for classwise ECE).

The counts are over the rows in *frame order*: the rows sorted by their top-label confidence (a stable
sort, :func:`frame`). A uniform draw of positions is a uniform draw of rows whatever the order, and in
this order every bin of every binned metric (equal-width or equal-mass) is a run of consecutive positions
and smCE's sweep needs no sort: the weighted forms are contiguous, vectorised sums, with no sort and no
gather per resample. Every metric of the same rows uses the same frame, so one seed gives one set of
resamples for all of them (a paired bootstrap across metrics); a statistic whose natural order is another
one (another calibrator's confidences) is :func:`reframed`.

The interval is the percentile bootstrap (Efron & Tibshirani 1993, ch. 13): the ``(1 - ci)/2`` and
``(1 + ci)/2`` quantiles of the ``n_boot`` resampled values (numpy's linear interpolation). The
point value is the metric of the data itself, never a bootstrap mean. What the interval covers is
the population value *of the same estimator* (the binned ECE with these bins, ...): a plug-in
calibration error is biased upwards, by about the noise of each bin, when the model is close to
calibrated, and the interval inherits that bias (docs/methods/metrics.md, "Bootstrap intervals").

Resample ``b`` draws its rows from its own stream, splitmix64 seeded by
``numpy.random.SeedSequence(seed).generate_state(n_boot)[b]``, with Lemire's unbiased bounded
integers: one ``seed`` gives the same intervals whatever the block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numba
import numpy as np

from .._checks import check_float, check_int, check_seed

__all__ = ["MetricInterval", "Bootstrap", "check_bootstrap", "flat_intervals", "frame", "reframed", "weighted_means"]

DEFAULT_N_BOOT = 1000
# smCE / smECE: each resample costs a sweep or a bandwidth search of ~11 kernel smoothings, so their
# default is lower (cost per resample measured in benchmarks/bootstrap_speed.py)
SMOOTH_N_BOOT = 200
_BLOCK_ELEMENTS = 1 << 22  # counts of one block of resamples: 16 MB of int32
_MASK32 = np.uint64(0xFFFFFFFF)


class MetricInterval(float):
    """A metric's value with its percentile bootstrap interval; it *is* the value as a float.

    ``ece(..., ci=0.95)`` returns one: arithmetic, comparisons, ``round``, ``f"{x:.4f}"``, JSON and
    ``float(x)`` see the value, exactly as the default call's float; ``x.low`` / ``x.high`` are the
    interval's ends, ``x.level`` its confidence level and ``x.n_boot`` the number of resamples.
    ``str(x)`` is ``"0.0321 [0.0240, 0.0405]"``; ``x.format(100)`` gives the papers' percent form.
    Not iterable on purpose (pandas would then take it for a list); use ``(x.value, x.low, x.high)``.
    """

    __slots__ = ("low", "high", "level", "n_boot")

    def __new__(cls, value: float, low: float, high: float, level: float, n_boot: int):
        self = super().__new__(cls, value)
        self.low, self.high, self.level, self.n_boot = float(low), float(high), float(level), int(n_boot)
        return self

    @property
    def value(self) -> float:
        return float(self)

    def __reduce__(self):
        return (type(self), (float(self), self.low, self.high, self.level, self.n_boot))

    def format(self, scale: float = 1.0, digits: int = 4, unit: str = "") -> str:
        """``"3.21 % [2.40, 4.05]"`` for ``format(100, 2, " %")``."""
        return f"{scale * float(self):.{digits}f}{unit} [{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]"

    def to_dict(self) -> dict[str, float]:
        return {"value": float(self), "low": self.low, "high": self.high, "level": self.level, "n_boot": self.n_boot}

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return (f"MetricInterval(value={float(self)!r}, low={self.low!r}, high={self.high!r}, "
                f"level={self.level!r}, n_boot={self.n_boot})")


@numba.njit(cache=True, nogil=True)
def _draw_counts(seeds: np.ndarray, n: int, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[b]`` = the counts of ``n`` uniform draws from ``range(n)``, from splitmix64 seeded by ``seeds[b]``.

    Each 64-bit output gives two 32-bit words; a word ``x`` maps to ``(x * n) >> 32`` and is rejected
    when ``(x * n) mod 2^32 < (2^32 - n) mod n`` (Lemire 2019): exactly uniform for ``n < 2^32``.
    """
    nn = np.uint64(n)
    threshold = (np.uint64(1 << 32) - nn) % nn
    for b in range(seeds.shape[0]):
        state = seeds[b]
        row = out[b]
        row[:] = 0
        j = 0
        while j < n:
            state = state + np.uint64(0x9E3779B97F4A7C15)
            z = state
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            m = (z & _MASK32) * nn
            if (m & _MASK32) >= threshold:
                row[np.int64(m >> np.uint64(32))] += 1
                j += 1
            m = (z >> np.uint64(32)) * nn
            if j < n and (m & _MASK32) >= threshold:
                row[np.int64(m >> np.uint64(32))] += 1
                j += 1


# reassociation lets LLVM vectorise the sums over rows (4-30x here); no assumption about NaN or inf
_VECTOR = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_VECTOR)
def segment_sums(counts, starts, columns):  # pragma: no cover - compiled
    """``out[b, s, k] = sum over rows i in [starts[s], starts[s + 1]) of counts[b, i] * columns[k, i]``."""
    chunk = counts.shape[0]
    segments = starts.shape[0] - 1
    m = columns.shape[0]
    out = np.zeros((chunk, segments, m))
    for b in range(chunk):
        for s in range(segments):
            # slices, then range(len): numba then knows the index is >= 0 (no wrap-around test), and LLVM vectorises
            row = counts[b, starts[s] : starts[s + 1]]
            for k in range(m):
                column = columns[k, starts[s] : starts[s + 1]]
                total = 0.0
                for i in range(row.shape[0]):
                    total += row[i] * column[i]
                out[b, s, k] = total
    return out


@numba.njit(cache=True, nogil=True)
def _skipping_sums(counts, columns):  # pragma: no cover - compiled
    """``segment_sums`` over all rows, skipping rows drawn 0 times (0 * inf is NaN): an infinite value (an NLL
    term) counts only when drawn."""
    chunk, n = counts.shape
    m = columns.shape[0]
    out = np.zeros((chunk, m))
    for b in range(chunk):
        for i in range(n):
            c = counts[b, i]
            if c > 0:
                for k in range(m):
                    out[b, k] += c * columns[k, i]
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def advance(weights, j, cum, target):  # pragma: no cover - compiled
    """Walk the running sum of ``weights`` from row ``j`` (sum ``cum`` before it) until it reaches ``target``;
    return ``(j, cum)`` one past the row that reaches it. Whole blocks of 32 that stay below the target are
    skipped with one (vectorised) sum: the equal-mass cuts of a resample without a scan row by row."""
    n = weights.shape[0]
    while cum < target:
        if j + 32 <= n:
            block, ahead = weights[j : j + 32], 0
            for t in range(block.shape[0]):
                ahead += block[t]
            if cum + ahead < target:
                cum += ahead
                j += 32
                continue
        cum += weights[j]
        j += 1
    return j, cum


def frame(confidence: np.ndarray) -> np.ndarray:
    """The frame order of the rows: sorted by top-label confidence, stable (positions of the counts -> rows)."""
    return np.argsort(confidence, kind="stable")


def reframed(statistic: Callable[[np.ndarray], np.ndarray], order: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``statistic`` (counts in its own frame ``order``) fed counts in row order: one gather per block."""
    return lambda counts: statistic(np.take(counts, order, axis=1))


def weighted_means(values: np.ndarray, order: np.ndarray | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The resampled means of per-row ``values`` (N,) or (N, m) (Brier, NLL terms), (B, m); ``order`` is the
    frame (default: the rows as given)."""
    values = np.asarray(values, dtype=np.float64).reshape(values.shape[0], -1)
    columns = np.ascontiguousarray((values if order is None else values[order]).T)
    n = columns.shape[1]
    if np.isfinite(columns).all():
        starts = np.array([0, n])
        return lambda counts: segment_sums(counts, starts, columns)[:, 0, :] / n
    return lambda counts: _skipping_sums(counts, columns) / n


@dataclass(frozen=True)
class Bootstrap:
    """A checked bootstrap request: confidence ``level``, ``n_boot`` resamples, ``seed``."""

    level: float
    n_boot: int
    seed: int

    def _blocks(self, n: int):
        seeds = np.random.SeedSequence(self.seed).generate_state(self.n_boot, np.uint64)
        size = max(1, min(self.n_boot, _BLOCK_ELEMENTS // max(n, 1)))
        for start in range(0, self.n_boot, size):
            block = np.empty((min(size, self.n_boot - start), n), dtype=np.int32)  # fresh: a caller may keep it
            _draw_counts(seeds[start : start + block.shape[0]], n, block)
            yield block

    def replicates(self, statistics: Sequence[Callable[[np.ndarray], np.ndarray]], n: int) -> list[np.ndarray]:
        """Each statistic on every resample of ``n`` rows: ``statistic(counts)`` takes a block of count
        vectors (rows of an int32 (B, n) array) and returns its values, (B,) or (B, m). All statistics
        see the same resamples (paired). Returns one (n_boot,) or (n_boot, m) array per statistic."""
        out: list[list[np.ndarray]] = [[] for _ in statistics]
        for counts in self._blocks(n):
            for values, statistic in zip(out, statistics):
                values.append(np.asarray(statistic(counts), dtype=np.float64))
        return [np.concatenate(values) for values in out]

    def interval(self, value: float, replicates: np.ndarray) -> MetricInterval:
        """The percentile interval of ``replicates`` around the data's own ``value``."""
        alpha = (1.0 - self.level) / 2.0
        if np.isfinite(replicates).all():
            low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
        else:  # an infinite NLL resample: interpolating between two infinities gives NaN, so take the order statistics outwards
            low, high = np.quantile(replicates, alpha, method="lower"), np.quantile(replicates, 1.0 - alpha, method="higher")
        return MetricInterval(value, low, high, self.level, self.n_boot)


def flat_intervals(values: dict[str, Any], suffixes: tuple[str, str] = ("_ci_low", "_ci_high")) -> dict[str, Any]:
    """``{"ece": MetricInterval}`` -> ``{"ece": value, "ece_ci_low": low, "ece_ci_high": high}`` (plain floats,
    for ``evaluate`` results, Trainer logs and JSON); other values pass through."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, MetricInterval):
            out[key], out[key + suffixes[0]], out[key + suffixes[1]] = float(value), value.low, value.high
        else:
            out[key] = value
    return out


def check_bootstrap(ci: Any, n_boot: Any, seed: Any, *, default_n_boot: int = DEFAULT_N_BOOT) -> Bootstrap | None:
    """Validate ``ci`` / ``n_boot`` / ``seed`` (before any work); None when no interval is asked for.

    ``ci`` is the confidence level in (0, 1) (0.95) or None; ``n_boot`` an integer >= 10 or None for the
    metric's default (only with ``ci``); ``seed`` an integer in [0, 2**64).
    """
    given = n_boot is not None
    n_boot = default_n_boot if n_boot is None else check_int(n_boot, "n_boot", minimum=10)
    seed = check_seed(seed)  # [0, 2**64), as every other seed of the package
    if ci is None:
        if given:  # it would be ignored without a word
            raise ValueError("Expected argument `ci` (a confidence level such as 0.95) since `n_boot` is given: `n_boot` is the "
                             "number of resamples of the interval `ci` asks for, and without `ci` there is none.")
        return None
    if isinstance(ci, (int, float, np.floating, np.integer)) and not isinstance(ci, bool) and not 0.0 < float(ci) < 1.0:
        raise ValueError(f"Expected argument `ci` to be a confidence level in (0, 1) such as 0.95, or None, but got {ci!r}.")
    level = check_float(ci, "ci", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    return Bootstrap(level, n_boot, seed)
