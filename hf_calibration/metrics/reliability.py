"""Reliability tables and diagrams (Guo et al. 2017, Fig. 1), optionally per logit-margin group
(SMART, Fig. 15)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .._checks import IGNORE_INDEX, check_int
from ._format import Inputs, prepare, top_label
from .binning import _adaptive_bin_index, _bin_means, _bin_sums, _check_n_bins, _uniform_bin_index, uniform_edges

if TYPE_CHECKING:  # matplotlib is imported lazily: only the diagram needs it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_MARGIN_CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class ReliabilityTable:
    """Per-bin statistics of the top label over ``n_bins`` equal-width bins on (0, 1].

    Arrays of length ``n_bins``: bin edges ``lower < p <= upper``, sample ``count``, mean
    ``confidence`` and ``accuracy`` (NaN in empty bins), and ``gap = confidence - accuracy``
    (positive: over-confident). ``ece`` recomputes the ECE from the table.
    """

    lower: np.ndarray
    upper: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    gap: np.ndarray

    @property
    def n(self) -> int:
        return int(self.count.sum())

    @property
    def ece(self) -> float:
        filled = self.count > 0
        return float((self.count[filled] * np.abs(self.gap[filled])).sum() / self.n)

    def to_dict(self) -> dict[str, list]:
        return {name: getattr(self, name).tolist() for name in ("lower", "upper", "count", "confidence", "accuracy", "gap")}

    def to_string(self, *, percent: bool = True) -> str:
        """The table as aligned text: one row per bin, empty bins shown with a dash."""
        scale, unit = (100.0, " %") if percent else (1.0, "")
        header = f"{'bin':>15}  {'count':>8}  {'conf' + unit:>8}  {'acc' + unit:>8}  {'gap' + unit:>8}"
        lines = [header, "-" * len(header)]
        for lo, hi, c, conf, acc, gap in zip(self.lower, self.upper, self.count, self.confidence, self.accuracy, self.gap):
            cells = ["-", "-", "-"] if c == 0 else [f"{v * scale:.2f}" for v in (conf, acc, gap)]
            lines.append(f"({lo:.3f}, {hi:.3f}]  {int(c):>8d}  " + "  ".join(f"{x:>8}" for x in cells))
        lines.append(f"N = {self.n}, ECE = {self.ece * scale:.2f}{unit}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_string()


def _reliability_table_compute(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> ReliabilityTable:
    edges = uniform_edges(n_bins)
    sums = _bin_sums(_uniform_bin_index(confidence, n_bins), confidence, correct, n_bins)
    conf, acc = _bin_means(sums)
    return ReliabilityTable(edges[:-1], edges[1:], sums.count, conf, acc, conf - acc)


def reliability_table(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> ReliabilityTable:
    """Per-bin count, mean confidence, accuracy and gap of the top label (the numbers behind a
    reliability diagram; the same bins as :func:`hf_calibration.metrics.ece`). Arguments as
    :func:`hf_calibration.metrics.ece`: ``from_logits=None`` (default) detects probabilities
    (every value in [0, 1], rows summing to 1 within 1e-2)."""
    n_bins = _check_n_bins(n_bins)
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return _reliability_table_compute(top.confidence, top.correct, n_bins)


def _top2_margin(inputs: Inputs) -> np.ndarray:
    """Top-1 minus top-2 logit, ``z_(1) - z_(2)``; from probabilities ``log p_(1) - log p_(2)``
    (the same number: softmax preserves logit differences)."""
    preds, _, from_logits, _ = inputs
    n, k = preds.shape
    margin = np.empty(n, dtype=np.float64)
    step = max(1, _MARGIN_CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        chunk = np.partition(preds[start : start + step], k - 2, axis=1)[:, -2:].astype(np.float64)
        if not from_logits:
            with np.errstate(divide="ignore"):
                chunk = np.log(chunk)
        margin[start : start + step] = chunk[:, 1] - chunk[:, 0]
    return margin


def _draw_reliability(ax: Axes, table: ReliabilityTable, title: str | None) -> None:
    width = table.upper - table.lower
    centre = (table.lower + table.upper) / 2
    filled = table.count > 0
    acc = np.where(filled, table.accuracy, 0.0)
    conf = np.where(filled, table.confidence, 0.0)
    ax.bar(centre, acc, width=width, color="#1f77b4", edgecolor="black", linewidth=0.5, label="accuracy")
    ax.bar(
        centre, conf - acc, bottom=acc, width=width, color="#d62728", alpha=0.35, edgecolor="#d62728",
        hatch="//", linewidth=0.5, label="gap",
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_aspect("equal")
    ax.text(0.97, 0.03, f"ECE = {100 * table.ece:.2f}%\nN = {table.n}", transform=ax.transAxes, ha="right", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)


def reliability_diagram(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    margin_groups: int | None = None,
    ax: Axes | Sequence[Axes] | None = None,
    title: str | None = None,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> Figure:
    """Reliability diagram of the top label: per-bin accuracy bars, the gap to the mean
    confidence, and the diagonal.

    With ``margin_groups=G`` the samples are split into G equal-count (quantile) groups of the
    logit margin ``z_(1) - z_(2)``, lowest margin first, and one diagram is drawn per group
    (SMART, Fig. 15: calibration that looks fine overall can hide margin-dependent over- or
    under-confidence).

    Args:
        ax: an Axes to draw into (or a sequence of G Axes with ``margin_groups``); by default a
            new figure is made with ``matplotlib.figure.Figure`` (no pyplot, no display needed).
        title: figure (or single-axes) title.
        Others as :func:`hf_calibration.metrics.ece` (``from_logits=None`` detects probabilities).

    Returns:
        the matplotlib ``Figure`` (save it with ``fig.savefig(path)``).
    """
    from matplotlib.figure import Figure

    n_bins = _check_n_bins(n_bins)
    if margin_groups is not None:
        margin_groups = check_int(margin_groups, "margin_groups", minimum=1)
    inputs = prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index)
    top = top_label(inputs)
    preds = inputs.preds

    if margin_groups is None:
        if ax is None:
            fig = Figure(figsize=(4.5, 4.5), layout="constrained")
            ax = fig.subplots()
        _draw_reliability(ax, _reliability_table_compute(top.confidence, top.correct, n_bins), title)
        return ax.figure

    if margin_groups > preds.shape[0]:
        raise ValueError(
            f"Expected argument `margin_groups` to be at most the number of samples ({preds.shape[0]}), "
            f"but got {margin_groups}."
        )
    margin = _top2_margin(inputs)
    group = _adaptive_bin_index(margin, margin_groups)
    if ax is None:
        fig = Figure(figsize=(4.0 * margin_groups, 4.3), layout="constrained")
        axes = np.atleast_1d(fig.subplots(1, margin_groups))
    else:
        axes = np.atleast_1d(np.asarray(ax, dtype=object)).ravel()
        if axes.shape[0] != margin_groups:
            raise ValueError(
                f"Expected argument `ax` to hold margin_groups={margin_groups} Axes, but got {axes.shape[0]}."
            )
        fig = axes[0].figure
    for g, axis in enumerate(axes):
        member = group == g
        table = _reliability_table_compute(top.confidence[member], top.correct[member], n_bins)
        lo, hi = margin[member].min(), margin[member].max()
        _draw_reliability(axis, table, f"margin group {g + 1}/{margin_groups}: [{lo:.2f}, {hi:.2f}]")
    if title:
        fig.suptitle(title)
    return fig
