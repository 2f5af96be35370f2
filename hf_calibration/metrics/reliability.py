"""Reliability tables and diagrams (Guo et al. 2017, Fig. 1) with a sample-count panel, optionally
per logit-margin group (SMART, Fig. 15) and as a before / after calibration pair."""

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
        """ECE recomputed from the table (NaN for a table of no samples, an empty margin group)."""
        filled = self.count > 0
        return float((self.count[filled] * np.abs(self.gap[filled])).sum() / self.n) if self.n else float("nan")

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
    :func:`hf_calibration.metrics.ece`: ``n_bins`` in [1, 10,000]; ``from_logits=None`` (default)
    detects probabilities (every value in [0, 1], rows summing to 1 within 1e-2)."""
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
        with np.errstate(invalid="ignore", over="ignore"):  # log 0 - log 0: equal top-2 zeros, margin 0
            diff = chunk[:, 1] - chunk[:, 0]
        margin[start : start + step] = np.where(chunk[:, 1] == chunk[:, 0], 0.0, diff)
    return margin


_COUNT_INSET = (0.0, -0.36, 1.0, 0.25)  # a count panel for a given Axes, in its coordinates: just below it


def _draw_reliability(ax: Axes, table: ReliabilityTable, title: str | None, cax: Axes | None) -> None:
    """Accuracy bars, gap bars and the diagonal in ``ax``; the per-bin sample counts in ``cax``."""
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
    ax.set_ylabel("accuracy")
    ax.set_box_aspect(1)
    summary = f"ECE = {100 * table.ece:.2f}%\nN = {table.n}" if table.n else "N = 0"
    ax.text(0.97, 0.03, summary, transform=ax.transAxes, ha="right", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    if cax is None:
        ax.set_xlabel("confidence")
        return
    # the sample count per bin (as relplot and netcal draw it): where the diagram has evidence
    cax.bar(centre, table.count, width=width, color="0.55", edgecolor="black", linewidth=0.5, label="count")
    cax.set_xlim(0, 1)
    cax.set_ylim(0, max(1, int(table.count.max())) * 1.05)
    cax.set_box_aspect(0.25)
    cax.set_ylabel("count", fontsize=8)
    cax.set_xlabel("confidence")
    cax.tick_params(labelsize=7)
    cax.locator_params(axis="y", nbins=2)
    ax.tick_params(labelbottom=False)


def _panel_axes(ax: Axes | Sequence[Axes] | None, rows: int, cols: int, counts: bool) -> tuple[Figure, list, list]:
    """``rows * cols`` reliability Axes in row-major order and their count Axes (None without counts).

    A new figure (no pyplot) puts each count panel in a grid row of its own; given Axes get an
    inset just below them.
    """
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(4.0 * cols, (5.1 if counts else 4.3) * rows), layout="constrained")
        if not counts:
            return fig, list(fig.subplots(rows, cols, squeeze=False).ravel()), [None] * (rows * cols)
        grid = fig.subplots(2 * rows, cols, squeeze=False, gridspec_kw={"height_ratios": [4, 1] * rows})
        return fig, list(grid[0::2].ravel()), list(grid[1::2].ravel())
    axes = list(np.atleast_1d(np.asarray(ax, dtype=object)).ravel())
    if len(axes) != rows * cols:
        raise ValueError(f"Expected argument `ax` to hold {rows * cols} Axes (one per panel), but got {len(axes)}.")
    return axes[0].figure, axes, [a.inset_axes(_COUNT_INSET) if counts else None for a in axes]


def reliability_diagram(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    calibrated: Any = None,
    margin_groups: int | None = None,
    counts: bool = True,
    names: Sequence[str] = ("uncalibrated", "calibrated"),
    ax: Axes | Sequence[Axes] | None = None,
    title: str | None = None,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> Figure:
    """Reliability diagram of the top label: per-bin accuracy bars, the gap to the mean
    confidence, the diagonal, and under it the number of samples in each bin.

    The bins and numbers are those of :func:`reliability_table` (the panel's ECE is the table's).

    With ``calibrated`` (the same samples after a calibrator, ``(N, K)`` logits or probabilities)
    the figure is a before / after pair, titled by ``names``: ``preds`` on the left and
    ``calibrated`` on the right (with margin groups: ``preds`` in the first row, ``calibrated``
    in the second).

    With ``margin_groups=G`` the samples are split into G equal-count (quantile) groups of the
    logit margin ``z_(1) - z_(2)`` of ``preds`` (``log p_(1) - log p_(2)`` for probabilities),
    lowest margin first, and one diagram is drawn per group (SMART, Fig. 15: calibration that
    looks fine overall can hide margin-dependent over- or under-confidence). In a pair both rows
    use the groups of ``preds``, so each column holds the same samples. Equal margins share a
    group (a group can then be empty).

    Args:
        counts: draw the sample-count histogram under each diagram (default True).
        names: the titles of the two halves of a before / after pair.
        ax: Axes to draw into, one per panel: every margin group of ``preds``, then (in a pair)
            every margin group of ``calibrated``; by default a new figure is made with
            ``matplotlib.figure.Figure`` (no pyplot, no display needed). The count histogram is
            an inset just below each given Axes.
        title: figure (or single-axes) title.
        n_bins: equal-width bins, 1 to 10,000.
        from_logits: ``None`` (default) detects probabilities (every value in [0, 1], rows
            summing to 1 within 1e-2) in ``preds`` and ``calibrated`` separately; True/False
            applies to both. Others as :func:`hf_calibration.metrics.ece`.

    Returns:
        the matplotlib ``Figure`` (save it with ``fig.savefig(path)``).
    """
    n_bins = _check_n_bins(n_bins)
    if margin_groups is not None:
        margin_groups = check_int(margin_groups, "margin_groups", minimum=1)
    if not isinstance(counts, bool):
        raise TypeError(f"Expected argument `counts` to be a bool, but got {counts!r}.")
    states = [prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index)]
    if calibrated is not None:
        states.append(prepare(calibrated, target, from_logits=from_logits, ignore_index=ignore_index, preds_name="calibrated"))
        if isinstance(names, str) or len(names) != 2 or not all(isinstance(x, str) for x in names):
            raise ValueError(f"Expected argument `names` to be two strings (before, after), but got {names!r}.")
    tops = [top_label(state) for state in states]
    n = states[0].preds.shape[0]

    if margin_groups is None:
        groups, labels = [np.ones(n, dtype=bool)], [None]
    else:
        if margin_groups > n:
            raise ValueError(
                f"Expected argument `margin_groups` to be at most the number of samples ({n}), but got {margin_groups}."
            )
        margin = _top2_margin(states[0])
        group = _adaptive_bin_index(margin, margin_groups)
        groups = [group == g for g in range(margin_groups)]
        labels = [
            f"margin group {g + 1}/{margin_groups}: "
            + (f"[{margin[member].min():.2f}, {margin[member].max():.2f}]" if member.any() else "empty (tied margins)")
            for g, member in enumerate(groups)
        ]

    # panels in row-major order: every group of `preds`, then every group of `calibrated`
    rows, cols = (len(states), len(groups)) if margin_groups is not None else (1, len(states))
    fig, axes, count_axes = _panel_axes(ax, rows, cols, counts)
    single = len(states) == 1 and margin_groups is None
    panels = [(s, g) for s in range(len(states)) for g in range(len(groups))]
    for axis, cax, (s, g) in zip(axes, count_axes, panels):
        member = groups[g]
        table = _reliability_table_compute(tops[s].confidence[member], tops[s].correct[member], n_bins)
        parts = ([names[s]] if len(states) == 2 else []) + ([labels[g]] if labels[g] else [])
        _draw_reliability(axis, table, title if single else " · ".join(parts), cax)
    if title and not single:
        fig.suptitle(title)
    return fig
