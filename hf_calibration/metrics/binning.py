"""Confidence binning shared by every binned metric: bin indices and per-bin sums.

Two schemes:

* **uniform** (Guo et al. 2017): ``n_bins`` equal-width bins on (0, 1], bin ``b`` holds
  ``edges[b] < p <= edges[b + 1]`` with ``edges = linspace(0, 1, n_bins + 1)``; ``p = 0`` goes
  to the first bin and ``p = 1`` to the last (no phantom bin).
* **adaptive** (Nguyen & O'Connor 2015): equal-mass edges. The sorted confidences are split into
  ``n_bins`` runs of as-near-as-possible equal count (sizes differ by at most one, the larger
  first, as ``np.array_split``); the upper edge of bin ``b`` is the largest confidence of run
  ``b``, and bin ``b`` holds ``lo < p <= hi`` as above. Without ties that is exactly the runs;
  a group of equal confidences is never split: it lands whole in the lowest bin that reaches
  it (later bins may then be smaller or empty). Every sample lands in exactly one bin.

A bin is a set of confidences, never of samples: two samples with the same confidence always
share a bin, so no binned metric can depend on the order of the samples or on their labels.

Everything here is vectorised (``searchsorted`` / ``argsort`` + ``np.bincount``); no Python
loop over bins or samples.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from hf_calibration._core.bins import uniform_bin, uniform_bin_index, uniform_edges
from hf_calibration._core.checks import check_int

_uniform_bin_index = uniform_bin_index  # the metrics' name for it

__all__ = ["BinSums", "MAX_BINS", "uniform_bin", "uniform_bin_index", "uniform_edges"]


class BinSums(NamedTuple):
    """Per-bin sample count, sum of confidences and sum of correctness (length ``n_bins``)."""

    count: np.ndarray  # int64
    confidence: np.ndarray  # float64, sum over the bin
    accuracy: np.ndarray  # float64, sum over the bin


MAX_BINS = 10_000  # beyond this a binned metric only allocates (n_bins = 1e12 would raise MemoryError)


def _check_n_bins(n_bins: Any) -> int:
    n_bins = check_int(n_bins, "n_bins", minimum=1)
    if n_bins > MAX_BINS:
        raise ValueError(
            f"Expected argument `n_bins` to be an integer in [1, {MAX_BINS}], but got {n_bins} "
            "(more bins than that leaves nearly every bin empty and only costs memory)."
        )
    return n_bins


def _run_sizes(n: int, n_bins: int) -> np.ndarray:
    """Sizes of the ``n_bins`` runs of an equal-count split of ``n`` sorted samples (``np.array_split``)."""
    sizes = np.full(n_bins, n // n_bins, dtype=np.int64)
    sizes[: n % n_bins] += 1
    return sizes


def _adaptive_bin_index(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-mass bin of each confidence: edges at the order statistics closing the ``np.array_split``
    runs of the sorted confidences, then ``lo < p <= hi`` as for uniform bins.

    Ties are never split by anything but their value: a tie group lands whole in one bin (the
    lowest whose upper edge reaches it), so the binning depends neither on the order of the
    samples nor on their correctness. Ordering ties by correctness instead (as a sort of
    ``(confidence, correct)`` does) puts the wrong samples of a tie group in one bin and the right
    ones in another, and turns a perfectly calibrated tied sample into a large "error".
    """
    n = confidence.shape[0]
    last = (
        np.cumsum(_run_sizes(n, n_bins)[:-1]) - 1
    )  # sorted position closing each run but the final one (>= 0: run 0 is never empty)
    upper = np.sort(confidence)[last]
    # side="left": the number of upper edges strictly below p, i.e. the first bin with p <= hi
    return np.searchsorted(upper, confidence, side="left")


def _bin_sums(index: np.ndarray, confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> BinSums:
    """Per-bin count and sums of confidence and correctness via ``np.bincount``."""
    count = np.bincount(index, minlength=n_bins)
    conf = np.bincount(index, weights=confidence, minlength=n_bins)
    acc = np.bincount(index, weights=correct, minlength=n_bins)
    return BinSums(count, conf, acc)


def _calibration_gaps(sums: BinSums, n: int) -> np.ndarray:
    """Signed, mass-weighted gaps ``|B_b|/N * (conf_b - acc_b) = (sum_conf_b - sum_acc_b) / N``."""
    return (sums.confidence - sums.accuracy) / n


def _bin_means(sums: BinSums) -> tuple[np.ndarray, np.ndarray]:
    """Mean confidence and accuracy per bin; NaN for empty bins."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums.confidence / sums.count, sums.accuracy / sums.count
