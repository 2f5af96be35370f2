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

Which interval (``INTERVALS``, chosen per metric by the coverage measured in
``benchmarks/bootstrap_coverage.py``, on synthetic models whose true calibration error is known):

* **basic** (pivotal) bootstrap, ``[2 v - q_hi, 2 v - q_lo]`` with ``q`` the ``(1 -+ ci)/2`` quantiles of the
  resampled values (Davison & Hinkley 1997, eq. 5.6; the interval of Kumar, Liang & Ma 2019's
  ``uncertainty-calibration``), for every calibration error. A plug-in calibration error is biased upwards by
  the noise of each bin; its resamples are biased upwards once more, and the percentile interval, centred on
  them, sits above the truth (it covered 0 % of the time on a calibrated model, 72 % on a crossing map at
  N = 1,000). The basic interval subtracts the resamples' bias instead. It holds the estimate exactly when the
  percentile interval does; where it does not (the resamples' bias is larger than their spread, as near 0),
  the interval says so in its ``note``. Its ends are clipped to the metric's range (>= 0).
* **basic with the plug-in as the functional** for ``debiased_ece`` (Kumar et al.'s ``bootstrap_uncertainty``
  with ``functional`` the plug-in, ``estimator`` the debiased estimate): ``[e + v_plug - q_hi, e + v_plug - q_lo]``,
  ``q`` the quantiles of the resampled *debiased* estimates. On a resample the value being estimated is the
  sample's plug-in, not its debiased estimate.
* **percentile** (Efron & Tibshirani 1993, ch. 13), ``[q_lo, q_hi]``, for accuracy, Brier and NLL: means, which
  have no bias to correct (the two intervals agree to first order); the percentile one stays within the
  metric's range, and with an infinite NLL resample takes the order statistics outwards.
* **none** for MCE: a maximum over bins, whose bootstrap is inconsistent when several bins are near the
  maximum (Andrews 2000), which the data cannot rule out. The value comes back with ``low = high = nan``
  and a ``note`` saying why.

What an interval covers is the population value of the same estimator (the binned ECE with these bins, ...).
At a true value of 0 (a calibrated model) no bootstrap interval of a plug-in error is consistent: every
interval that reaches 0 says so in its ``note``, and the measured coverage there is in the benchmark.

Resample ``b`` draws its rows from its own stream, splitmix64 seeded by
``numpy.random.SeedSequence(seed).generate_state(n_boot)[b]``, with Lemire's unbiased bounded
integers: one ``seed`` gives the same intervals whatever the block size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from hf_calibration._core.checks import check_float, check_int, check_seed
from hf_calibration.metrics.table import IntervalRule, get_metric, list_metrics

__all__ = [
    "MetricInterval",
    "Bootstrap",
    "INTERVALS",
    "IntervalRule",
    "check_bootstrap",
    "flat_intervals",
    "frame",
    "frame_position",
    "reframed",
    "weighted_means",
]

DEFAULT_N_BOOT = 1000
# smCE / smECE: each resample costs a sweep or a bandwidth search of ~11 kernel smoothings, so their
# default is lower (cost per resample measured in benchmarks/bootstrap_speed.py)
SMOOTH_N_BOOT = 200
_BLOCK_ELEMENTS = 1 << 22  # counts of one block of resamples: 16 MB of int32
_THREADS = 4  # blocks evaluated at once (each holds its counts: 16 MB)
_MASK32 = np.uint64(0xFFFFFFFF)


class MetricInterval(float):
    """A metric's value with its bootstrap interval; it *is* the value as a float.

    ``ece(..., ci=0.95)`` returns one: arithmetic, comparisons, ``round``, ``f"{x:.4f}"``, JSON and
    ``float(x)`` see the value, exactly as the default call's float; ``x.low`` / ``x.high`` are the
    interval's ends, ``x.level`` its confidence level, ``x.n_boot`` the number of resamples and ``x.method``
    the interval (``"basic"``, ``"percentile"``, or ``"none"``: ``low`` and ``high`` are then NaN). ``x.note``
    is empty, or says why the interval should be read with care (the estimate lies outside it, it reaches
    0, or there is none); ``x.flag`` names the case (``"above"``, ``"below"``, ``"zero"``, ``"null"``,
    ``"none"``) and ``x.short_note`` says it in a few words.
    ``str(x)`` is ``"0.0321 [0.0240, 0.0405]"`` (and the note, when there is one); ``x.format(100)`` gives the
    papers' percent form. Not iterable on purpose (pandas would then take it for a list); use
    ``(x.value, x.low, x.high)``.
    """

    __slots__ = ("low", "high", "level", "n_boot", "method", "flag", "note")

    def __new__(
        cls,
        value: float,
        low: float,
        high: float,
        level: float,
        n_boot: int,
        method: str = "percentile",
        flag: str = "",
        note: str = "",
    ):
        self = super().__new__(cls, value)
        self.low, self.high, self.level, self.n_boot = float(low), float(high), float(level), int(n_boot)
        self.method, self.flag, self.note = str(method), str(flag), str(note)
        return self

    @property
    def value(self) -> float:
        return float(self)

    @property
    def has_interval(self) -> bool:
        """False when no interval can be trusted (``low`` / ``high`` NaN; ``note`` says why)."""
        return not (np.isnan(self.low) or np.isnan(self.high))

    def __reduce__(self):
        return (
            type(self),
            (float(self), self.low, self.high, self.level, self.n_boot, self.method, self.flag, self.note),
        )

    @property
    def short_note(self) -> str:
        """The note in a few words (``"interval reaches 0"``), for a table cell or a figure; empty without a note."""
        return FLAGS[self.flag][0] if self.flag in FLAGS and self.has_interval else ""

    def format(self, scale: float = 1.0, digits: int = 4, unit: str = "", short_note: bool = False) -> str:
        """``"3.21 % [2.40, 4.05]"`` for ``format(100, 2, " %")``; ``"14.05 % [no interval]"`` without one.
        ``short_note=True`` appends the note in a few words: ``"0.41 % [0.00, 0.58] (interval reaches 0)"``."""
        head = f"{scale * float(self):.{digits}f}{unit}"
        body = (
            f"[{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]" if self.has_interval else "[no interval]"
        )
        return f"{head} {body}" + (f" ({self.short_note})" if short_note and self.short_note else "")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: ``low`` / ``high`` are None without an interval."""
        ends = (self.low, self.high) if self.has_interval else (None, None)
        return {
            "value": float(self),
            "low": ends[0],
            "high": ends[1],
            "level": self.level,
            "n_boot": self.n_boot,
            "method": self.method,
            "note": self.note,
        }

    def __str__(self) -> str:
        return self.format() + (f" ({self.note})" if self.note else "")

    def __repr__(self) -> str:
        return (
            f"MetricInterval(value={float(self)!r}, low={self.low!r}, high={self.high!r}, "
            f"level={self.level!r}, n_boot={self.n_boot}, method={self.method!r}"
            + (f", note={self.note!r}" if self.note else "")
            + ")"
        )


class _Intervals(Mapping):
    """Each metric's interval rule, read from the metric table (:mod:`hf_calibration.metrics.table`)."""

    def __getitem__(self, name: str) -> IntervalRule:
        if name not in list_metrics():
            raise KeyError(name)
        return get_metric(name).interval

    def __iter__(self):
        return iter(list_metrics())

    def __len__(self) -> int:
        return len(list_metrics())


# per metric, by the coverage measured in benchmarks/bootstrap_coverage.py (see the module docstring)
INTERVALS: Mapping[str, IntervalRule] = _Intervals()
_PERCENTILE = IntervalRule("percentile")
# flag -> (short text for a table cell, the note)
FLAGS = {
    "above": (
        "estimate above its interval",
        "the estimate lies above its bias-corrected interval: its resamples are biased upwards by more than their "
        "spread (bin noise), as close to 0",
    ),
    "below": ("estimate below its interval", "the estimate lies below its interval"),
    "zero": (
        "interval reaches 0",
        "the interval reaches 0: the data are consistent with a true value of 0, where no bootstrap interval is "
        "reliable; read its upper end as rough",
    ),
    "null": (
        "no interval",
        "no interval: the bias-corrected interval lies below 0, the estimate is within noise of 0, where no "
        "bootstrap interval is reliable",
    ),
    "none": ("no interval", ""),
}


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


def frame_position(confidence: np.ndarray) -> np.ndarray:
    """Each row's position in the frame (the inverse of :func:`frame`): row ``i``'s counts are ``counts[:, position[i]]``."""
    order = frame(confidence)
    position = np.empty_like(order)
    position[order] = np.arange(order.shape[0])
    return position


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

    def _sizes(self, n: int, block_elements: int | None = None) -> list[tuple[int, int]]:
        """``(first resample, number of resamples)`` of each block of at most ``block_elements`` counts."""
        size = max(1, min(self.n_boot, (block_elements or _BLOCK_ELEMENTS) // max(n, 1)))
        return [(start, min(size, self.n_boot - start)) for start in range(0, self.n_boot, size)]

    def _seeds(self) -> np.ndarray:
        """One stream seed per resample (so a resample is the same whatever block it is drawn in)."""
        return np.random.SeedSequence(self.seed).generate_state(self.n_boot, np.uint64)

    def _draw(self, n: int, start: int, size: int, seeds: np.ndarray | None = None) -> np.ndarray:
        """Resamples ``start .. start + size`` as a fresh (size, n) int32 block of counts (a caller may keep it)."""
        seeds = (self._seeds() if seeds is None else seeds)[start : start + size]
        block = np.empty((size, n), dtype=np.int32)
        _draw_counts(seeds, n, block)
        return block

    def _blocks(self, n: int, block_elements: int | None = None):
        """The resamples' count vectors over ``n`` rows, (B, n) int32 blocks of at most ``block_elements`` counts."""
        seeds = self._seeds()  # once: generating every resample's seed again for each block was O(n_boot^2)
        for start, size in self._sizes(n, block_elements):
            yield self._draw(n, start, size, seeds)

    def replicates(
        self,
        statistics: Sequence[Callable[[np.ndarray], np.ndarray]],
        n: int,
        limits: Sequence[int | None] | None = None,
    ) -> list[np.ndarray]:
        """Each statistic on every resample of ``n`` rows: ``statistic(counts)`` takes a block of count
        vectors (rows of an int32 (B, n) array) and returns its values, (B,) or (B, m). All statistics
        see the same resamples (paired). Returns one (n_boot,) or (n_boot, m) array per statistic.
        ``limits[i]`` (None: all): statistic ``i`` sees only the first ``limits[i]`` resamples, the same ones
        ``Bootstrap(level, limits[i], seed)`` draws (how smCE's 200 share a report's 1,000).

        Blocks are drawn and evaluated in threads (the compiled kernels release the GIL), up to one per CPU core
        and at most ``_THREADS``; a statistic must not keep state between calls. The result does not depend on the
        number of threads: each resample has its own stream and the blocks are put back in order.
        """

        limits = [
            self.n_boot if limit is None else min(limit, self.n_boot) for limit in (limits or [None] * len(statistics))
        ]

        seeds = self._seeds()

        def block(job: tuple[int, int]) -> list[np.ndarray | None]:
            counts = self._draw(n, *job, seeds)
            return [
                np.asarray(statistic(counts[: limit - job[0]]), dtype=np.float64) if limit > job[0] else None
                for statistic, limit in zip(statistics, limits)
            ]

        jobs = self._sizes(n)
        threads = min(len(jobs), _THREADS, os.cpu_count() or 1)
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:
                results = list(pool.map(block, jobs))
        else:
            results = [block(job) for job in jobs]
        return [np.concatenate([r[i] for r in results if r[i] is not None]) for i in range(len(statistics))]

    def interval(
        self,
        value: float,
        replicates: np.ndarray,
        metric: str | IntervalRule | None = None,
        *,
        plugin: float | None = None,
        estimate: float | None = None,
        power: int = 1,
    ) -> MetricInterval:
        """``value`` with the interval of ``metric`` (a key of ``INTERVALS`` or a rule; None: percentile) from its
        ``replicates``. ``plugin``: the sample's plug-in value, for ``"basic_plugin"`` (``debiased_ece``).
        ``power``: the replicates, ``plugin`` and ``estimate`` (default ``value``) are on the scale ``x^power``,
        where the interval is formed; its ends are taken back by ``max(x, 0)^(1/power)``."""
        rule = INTERVALS[metric] if isinstance(metric, str) else (metric or _PERCENTILE)
        if rule.method == "none":
            return MetricInterval(value, np.nan, np.nan, self.level, self.n_boot, "none", "none", rule.reason)
        alpha = (1.0 - self.level) / 2.0
        if np.isfinite(replicates).all():
            q_low, q_high = np.quantile(replicates, [alpha, 1.0 - alpha])
        else:  # an infinite NLL resample: interpolating between two infinities gives NaN, so take the order statistics outwards
            q_low, q_high = (
                np.quantile(replicates, alpha, method="lower"),
                np.quantile(replicates, 1.0 - alpha, method="higher"),
            )
        if rule.method == "percentile":
            low, high = q_low, q_high
        elif rule.method in ("basic", "basic_plugin"):
            own = value if estimate is None else estimate
            centre = own + (own if rule.method == "basic" else plugin)
            low, high = centre - q_high, centre - q_low
        else:
            raise ValueError(
                f"Expected an interval method of {sorted({r.method for r in INTERVALS.values()})}, but got {rule.method!r}."
            )
        if power != 1:
            low, high = (max(x, 0.0) ** (1.0 / power) for x in (low, high))
        flag = ""
        if rule.floor is not None and rule.method != "percentile" and low <= rule.floor:
            if high < rule.floor:  # even the upper end below 0: bias larger than estimate and spread together
                return MetricInterval(
                    value, np.nan, np.nan, self.level, self.n_boot, rule.method, "null", FLAGS["null"][1]
                )
            flag = "zero"
        low = low if rule.floor is None else max(low, rule.floor)
        high = high if rule.floor is None else max(high, rule.floor)
        if rule.ceiling is not None:
            low, high = min(low, rule.ceiling), min(high, rule.ceiling)
        if value > high:
            flag = "above"
        elif value < low:
            flag = "below"
        return MetricInterval(
            value, low, high, self.level, self.n_boot, rule.method, flag, FLAGS[flag][1] if flag else ""
        )


def flat_intervals(values: dict[str, Any], suffixes: tuple[str, str] = ("_ci_low", "_ci_high")) -> dict[str, Any]:
    """``{"ece": MetricInterval}`` -> ``{"ece": value, "ece_ci_low": low, "ece_ci_high": high}`` (plain floats,
    for ``evaluate`` results, Trainer logs and JSON; NaN where a metric has no interval, as MCE); other values
    pass through."""
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
            raise ValueError(
                "Expected argument `ci` (a confidence level such as 0.95) since `n_boot` is given: `n_boot` is the "
                "number of resamples of the interval `ci` asks for, and without `ci` there is none."
            )
        return None
    if isinstance(ci, (int, float, np.floating, np.integer)) and not isinstance(ci, bool) and not 0.0 < float(ci) < 1.0:
        raise ValueError(
            f"Expected argument `ci` to be a confidence level in (0, 1) such as 0.95, or None, but got {ci!r}."
        )
    level = check_float(ci, "ci", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    return Bootstrap(level, n_boot, seed)


def point_statistic(
    point: Callable[..., float], columns: Sequence[np.ndarray], order: np.ndarray | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """The resampled values of any ``point(*columns)`` (a metric registered in the table with only its point form):
    each resample's rows repeated by their counts, (B,). ``order`` is the frame of the counts (default: the rows as
    given). O(N) per resample, in Python: the package's own metrics have compiled weighted forms instead."""
    columns = [np.asarray(c) if order is None else np.asarray(c)[order] for c in columns]
    return lambda counts: np.array([point(*(np.repeat(c, weights) for c in columns)) for weights in counts])
