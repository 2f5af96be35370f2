"""Reliability tables and diagrams (Guo et al. 2017, Fig. 1) with a sample-count panel, optionally
per logit-margin group (SMART, Fig. 15) and as a before / after calibration pair.

Each bin's accuracy carries a Wilson score interval (Wilson 1927: the binomial interval that stays
inside [0, 1] and keeps its coverage for small counts, where the normal one does not), and the panel's
ECE its bootstrap interval (:func:`hf_calibration.metrics.ece`'s, bias-corrected; :mod:`hf_calibration.metrics.bootstrap`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from scipy.special import ndtri

from hf_calibration._core.checks import IGNORE_INDEX, check_choice, check_int
from hf_calibration.metrics._format import Inputs, read_inputs, top_label
from hf_calibration.metrics.binning import (
    _adaptive_bin_index,
    _bin_means,
    _bin_sums,
    _check_n_bins,
    _uniform_bin_index,
    uniform_edges,
)
from hf_calibration.metrics.bootstrap import check_bootstrap
from hf_calibration.metrics.ece import _ece_compute, _top_label_interval

if TYPE_CHECKING:  # matplotlib is imported lazily: only the diagram needs it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_MARGIN_CHUNK_ELEMENTS = 1 << 20


def wilson_interval(count: np.ndarray, accuracy: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a binomial proportion ``accuracy`` out of ``count`` trials, at ``level``:
    ``(p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``; NaN where ``count`` is 0.

    The ends always bracket the estimate exactly, ``low <= accuracy <= high``: mathematically the
    interval of an all-wrong bin starts at 0 and that of an all-right bin ends at 1, but the formula's
    rounding lands a few ulps past them (2.8e-17, 0.9999999999999999), which is an interval that
    excludes its own estimate and a negative error bar in the diagram."""
    z = ndtri(0.5 + level / 2.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.asarray(count, dtype=np.float64)
        p = np.asarray(accuracy, dtype=np.float64)
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        low = np.where(p <= 0.0, 0.0, np.minimum(centre - half, p))
        high = np.where(p >= 1.0, 1.0, np.maximum(centre + half, p))
    return np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)


@dataclass(frozen=True)
class ReliabilityTable:
    """Per-bin statistics of the top label over ``n_bins`` equal-width bins on (0, 1].

    Arrays of length ``n_bins``: bin edges ``lower < p <= upper``, sample ``count``, mean
    ``confidence`` and ``accuracy`` (NaN in empty bins), and ``gap = confidence - accuracy``
    (positive: over-confident). ``ece`` recomputes the ECE from the table. With ``ci``,
    ``accuracy_low`` / ``accuracy_high`` hold each bin's Wilson interval at level ``ci`` (else None).
    """

    lower: np.ndarray
    upper: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    gap: np.ndarray
    accuracy_low: np.ndarray | None = None
    accuracy_high: np.ndarray | None = None
    ci: float | None = None

    @property
    def n(self) -> int:
        return int(self.count.sum())

    @property
    def ece(self) -> float:
        """ECE recomputed from the table (NaN for a table of no samples, an empty margin group)."""
        filled = self.count > 0
        return float((self.count[filled] * np.abs(self.gap[filled])).sum() / self.n) if self.n else float("nan")

    def _columns(self) -> tuple[str, ...]:
        extra = ("accuracy_low", "accuracy_high") if self.ci is not None else ()
        return ("lower", "upper", "count", "confidence", "accuracy", "gap") + extra

    def to_dict(self) -> dict[str, list]:
        return {name: getattr(self, name).tolist() for name in self._columns()}

    def to_string(self, *, percent: bool = True) -> str:
        """The table as aligned text: one row per bin, empty bins shown with a dash."""
        scale, unit = (100.0, " %") if percent else (1.0, "")
        names = ["conf", "acc", "gap"] + (["acc low", "acc high"] if self.ci is not None else [])
        header = f"{'bin':>15}  {'count':>8}  " + "  ".join(f"{name + unit:>10}" for name in names)
        lines = [header, "-" * len(header)]
        for b, (lo, hi, c) in enumerate(zip(self.lower, self.upper, self.count)):
            values = [getattr(self, name)[b] for name in self._columns()[3:]]
            cells = ["-"] * len(values) if c == 0 else [f"{v * scale:.2f}" for v in values]
            lines.append(f"({lo:.3f}, {hi:.3f}]  {int(c):>8d}  " + "  ".join(f"{x:>10}" for x in cells))
        lines.append(
            f"N = {self.n}, ECE = {self.ece * scale:.2f}{unit}"
            + (f" (acc low / high: {100 * self.ci:g} % Wilson interval)" if self.ci is not None else "")
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_string()


def _reliability_table_compute(
    confidence: np.ndarray, correct: np.ndarray, n_bins: int, ci: float | None = None
) -> ReliabilityTable:
    edges = uniform_edges(n_bins)
    sums = _bin_sums(_uniform_bin_index(confidence, n_bins), confidence, correct, n_bins)
    conf, acc = _bin_means(sums)
    low, high = wilson_interval(sums.count, acc, ci) if ci is not None else (None, None)
    return ReliabilityTable(edges[:-1], edges[1:], sums.count, conf, acc, conf - acc, low, high, ci)


def reliability_table(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    task: str | None = None,
    label: int | str = "pooled",
) -> ReliabilityTable:
    """Per-bin count, mean confidence, accuracy and gap of the top label (the numbers behind a
    reliability diagram; the same bins as :func:`hf_calibration.metrics.ece`). Arguments as
    :func:`hf_calibration.metrics.ece`: ``n_bins`` in [1, 10,000]; ``from_logits=None`` (default)
    detects probabilities (every value in [0, 1], rows summing to 1 within 1e-2). ``ci`` (a level such
    as 0.95) adds each bin's Wilson interval of the accuracy.

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1]] * 10)  # ten samples at confidence 0.9, three of them wrong
        >>> table = reliability_table(probs, np.array([0] * 7 + [1] * 3), 10, ci=0.95)
        >>> b = 8  # the bin (0.8, 0.9]: 7 right out of 10, and its 95 % Wilson interval
        >>> [round(float(x[b]), 4) for x in (table.accuracy, table.accuracy_low, table.accuracy_high)]
        [0.7, 0.3968, 0.8922]

    A binary or multi-label head (``task``, or read from the shapes): the bins of each label's probability ``p``
    against its 0/1 label (torchmetrics' ``BinaryCalibrationError``'s bins); ``label`` picks one label's table (an
    index) or ``"pooled"`` (default: every (sample, label) pair; a binary head's only label).
    """
    n_bins = _check_n_bins(n_bins)
    level = _check_level(ci)
    inputs = _read(preds, target, task, from_logits, ignore_index)
    if not isinstance(inputs, Inputs):  # a sigmoid head's per-label inputs
        p, y = _sigmoid_pairs(inputs, _check_label(label, inputs.num_labels))
        return _reliability_table_compute(p, y, n_bins, level)
    top = top_label(inputs)
    return _reliability_table_compute(top.confidence, top.correct, n_bins, level)


def _read(preds: Any, target: Any, task: str | None, from_logits, ignore_index, preds_name: str = "preds"):
    """The inputs of a call, read once: :class:`~hf_calibration.metrics.multilabel.SigmoidInputs` for a binary /
    multi-label head, :class:`~hf_calibration._core.inputs.Inputs` for a multi-class one."""
    from hf_calibration.metrics.multilabel import sigmoid_inputs

    inputs = read_inputs(
        preds, target, task=task, from_logits=from_logits, ignore_index=ignore_index, preds_name=preds_name
    )
    return inputs if inputs.task == "multiclass" else sigmoid_inputs(inputs)


def _check_label(label: Any, num_labels: int) -> int | str:
    if label == "pooled":
        return label
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not 0 <= int(label) < num_labels:
        raise ValueError(
            f"Expected argument `label` to be 'pooled' or a label index in [0, {num_labels}), but got {label!r}."
        )
    return int(label)


def _sigmoid_pairs(inputs, label: int | str) -> tuple[np.ndarray, np.ndarray]:
    """``(p, y)`` of one label's kept samples, or of every kept pair (``"pooled"``)."""
    return inputs.pooled() if label == "pooled" else inputs.label(label)


def _check_level(ci: Any) -> float | None:
    boot = check_bootstrap(ci, None, 0)
    return None if boot is None else boot.level


def _top2_margin(inputs: Inputs) -> np.ndarray:
    """Top-1 minus top-2 logit, ``z_(1) - z_(2)``; from probabilities ``log p_(1) - log p_(2)``
    (the same number: softmax preserves logit differences)."""
    preds, from_logits = inputs.preds, inputs.from_logits
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
_ACCURACY = "#1f77b4"
# opaque gap patches, so that what the eye sees is the legend's colour (an alpha patch over the blue bar
# turns purple): over-confidence sits above the accuracy bar, under-confidence over its top part
_GAP_STYLE = {
    "over": {"facecolor": "#f4a3a3", "edgecolor": "#d62728", "hatch": "//"},
    "under": {"facecolor": "#fdd0a2", "edgecolor": "#e6550d", "hatch": "\\\\"},
}
_GAP_LABELS = {"over": "gap: over-confident (conf > acc)", "under": "gap: under-confident (acc > conf)"}
_THIN_ALPHA = 0.3  # bins with fewer than `min_count` samples: drawn faded, their counts written out
_CHAR_WIDTH = 0.62  # average glyph width in em, to wrap titles to the width they may use


def _wrap(text: str, width_inches: float, fontsize: float) -> str:
    """Wrap each line of ``text`` to fit ``width_inches`` at ``fontsize`` points (long paths break too)."""
    chars = max(12, int(width_inches * 72 / (fontsize * _CHAR_WIDTH)))
    return "\n".join(
        textwrap.fill(line, chars, break_long_words=True, break_on_hyphens=False) or line for line in text.split("\n")
    )


def _draw_reliability(
    ax: Axes,
    table: ReliabilityTable,
    title: str | None,
    cax: Axes | None,
    *,
    ece_text: str,
    min_count: int,
    count_scale: str,
) -> set[str]:
    """Accuracy bars, gap bars, the per-bin intervals and the diagonal in ``ax``; the per-bin sample counts in
    ``cax``. The summary (ECE, N) goes above the plot, under the title, never over the bars.
    Returns the legend entries this panel uses."""
    width = table.upper - table.lower
    centre = (table.lower + table.upper) / 2
    filled = table.count > 0
    thin = filled & (table.count < min_count)
    acc = np.where(filled, table.accuracy, 0.0)
    conf = np.where(filled, table.confidence, 0.0)
    used = {"accuracy"}
    bars = ax.bar(centre, acc, width=width, color=_ACCURACY, edgecolor="black", linewidth=0.5, label="accuracy")
    gaps = ax.bar(centre, conf - acc, bottom=acc, width=width, linewidth=0.5, label="gap", zorder=2)
    for b, (bar, gap) in enumerate(zip(bars.patches, gaps.patches)):
        kind = "over" if conf[b] > acc[b] else "under"
        gap.set(**_GAP_STYLE[kind])
        if conf[b] != acc[b]:
            used.add(kind)
        if thin[b]:
            bar.set_alpha(_THIN_ALPHA)
            gap.set_alpha(_THIN_ALPHA)
            used.add("thin")
    if table.accuracy_low is not None and filled.any():
        low, high = table.accuracy_low[filled], table.accuracy_high[filled]
        ax.errorbar(
            centre[filled],
            acc[filled],
            yerr=[acc[filled] - low, high - acc[filled]],
            fmt="none",
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
            zorder=3,
            label="interval",
        )
        used.add("interval")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_box_aspect(1)
    summary = f"{ece_text} · N = {table.n}" if table.n else "N = 0"
    ax.text(0.5, 1.02, summary, transform=ax.transAxes, ha="center", va="bottom", fontsize=9)
    if title:
        # centred over the plot, which the y label pushes right: wrap to 3/4 of the column's width
        ax.set_title(_wrap(title, 0.75 * ax.figure.get_figwidth() / max(1, _columns(ax)), 10), fontsize=10, pad=18)
    if cax is None:
        ax.set_xlabel("confidence")
        return used
    # the sample count per bin (as relplot and netcal draw it): where the diagram has evidence
    cax.bar(centre, table.count, width=width, color="0.55", edgecolor="black", linewidth=0.5, label="count")
    top = max(1, int(table.count.max()))
    cax.set_xlim(0, 1)
    if count_scale == "log":
        cax.set_yscale("log")
        cax.set_ylim(0.5, top * 3.0)  # a bin of one sample is a visible bar
    else:
        cax.set_ylim(0, top * 1.05)
        cax.locator_params(axis="y", nbins=2)
    for b in np.flatnonzero(thin):  # too few to read: say how many
        cax.annotate(
            str(int(table.count[b])),
            (centre[b], table.count[b]),
            xytext=(0, 1),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=6,
            color="#d62728",
            clip_on=False,
        )
    cax.set_box_aspect(0.25)
    cax.set_ylabel("count", fontsize=8)
    cax.set_xlabel("confidence")
    cax.tick_params(labelsize=7)
    ax.tick_params(labelbottom=False)
    return used


def _columns(ax: Axes) -> int:
    spec = ax.get_subplotspec()
    return spec.get_gridspec().ncols if spec is not None else 1


def _legend_handles(used: set[str], level: float | None, min_count: int, counts: bool) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_ACCURACY, edgecolor="black", linewidth=0.5, label="accuracy")]
    handles += [
        Patch(linewidth=0.5, label=_GAP_LABELS[kind], **_GAP_STYLE[kind]) for kind in ("over", "under") if kind in used
    ]
    if "interval" in used:
        handles.append(
            Line2D(
                [],
                [],
                color="black",
                marker="_",
                markersize=8,
                linewidth=0.8,
                label=f"{100 * level:g} % interval of the accuracy (Wilson)",
            )
        )
    if "thin" in used:
        handles.append(
            Patch(
                facecolor=_ACCURACY,
                edgecolor="black",
                alpha=_THIN_ALPHA,
                linewidth=0.5,
                label=f"fewer than {min_count} samples" + (" (count in red)" if counts else ""),
            )
        )
    return handles


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


class _Style(NamedTuple):
    """How :func:`reliability_diagram` draws every panel (its checked arguments)."""

    n_bins: int
    boot: Any  # a Bootstrap, or None: no intervals
    min_count: int
    count_scale: str
    counts: bool


def _draw_panel(ax: Axes, cax: Axes | None, p: np.ndarray, y: np.ndarray, title: str, style: _Style) -> set[str]:
    """One panel of (confidence or probability, correct or label) pairs: its table, its ECE text, its drawing."""
    n_bins, boot = style.n_bins, style.boot
    table = _reliability_table_compute(p, y, n_bins, None if boot is None else boot.level)
    ece_text = _ece_text(p, y, n_bins, boot) if table.n else ""
    return _draw_reliability(
        ax, table, title, cax, ece_text=ece_text, min_count=style.min_count, count_scale=style.count_scale
    )


def _finish_panels(fig, axes, ax, used: set[str], suptitle, rows: int, cols: int, style: _Style) -> Figure:
    """The figure's title over several panels and its legend (below a figure of its own, in the first panel of a
    caller's ``ax``)."""
    if suptitle:
        fig.suptitle(_wrap(suptitle, 0.95 * fig.get_figwidth(), 12))
    level = None if style.boot is None else style.boot.level
    handles = _legend_handles(used, level, style.min_count, style.counts)
    if ax is None:
        ncols = 1 if cols == 1 else 2
        fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=8, frameon=False)
        # room for the legend rows and for wrapped titles, so that constrained layout never squeezes them out
        titles = [a.get_title() for a in axes] + ([fig.get_suptitle()] if suptitle else [])
        extra_lines = max(t.count("\n") for t in titles)
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, height + 0.2 * -(-len(handles) // ncols) + (0.25 * extra_lines + 0.1) * rows)
    else:
        axes[0].legend(handles=handles, loc="upper left", fontsize=7)
    return fig


def _ece_text(confidence: np.ndarray, correct: np.ndarray, n_bins: int, boot) -> str:
    value = _ece_compute(confidence, correct, n_bins)
    if boot is None:
        return f"ECE = {100 * value:.2f} %"
    interval = _top_label_interval(boot, confidence, correct, n_bins, 0, value)
    return f"ECE = {interval.format(100, 2, ' %', short_note=True)}"


def reliability_diagram(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    calibrated: Any = None,
    margin_groups: int | None = None,
    counts: bool = True,
    count_scale: str = "linear",
    min_count: int = 10,
    ci: float | None = 0.95,
    n_boot: int | None = None,
    seed: int = 0,
    names: Sequence[str] = ("uncalibrated", "calibrated"),
    ax: Axes | Sequence[Axes] | None = None,
    title: str | None = None,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    task: str | None = None,
    labels: Sequence[int | str] | None = None,
    label_names: Sequence[str] | None = None,
) -> Figure:
    """Reliability diagram of the top label: per-bin accuracy bars with their interval, the gap to
    the mean confidence, the diagonal, and under it the number of samples in each bin.

    The bins and numbers are those of :func:`reliability_table` (the panel's ECE is the table's). The
    gap is drawn in one colour above the accuracy bar where the bin is over-confident and in another
    over the bar's top where it is under-confident, as the legend shows. Bins holding fewer than
    ``min_count`` samples are drawn faded and their counts written in the count panel (too few to
    read: a bin of 2 samples has an accuracy interval ~0.8 wide). The summary line (ECE with its
    bootstrap interval, N) sits above the plot, never over the bars.

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
        count_scale: ``"linear"`` (default) or ``"log"`` (bins of 1-3 samples stay visible).
        min_count: bins with fewer samples are faded and their counts written (default 10; 0 or 1 for none).
        ci: level of the per-bin Wilson intervals and of the ECE's bootstrap interval (:func:`ece`'s)
            (default 0.95); None draws neither.
        n_boot, seed: the ECE's bootstrap (default 1,000 resamples, seed 0), as :func:`hf_calibration.metrics.ece`.
        names: the titles of the two halves of a before / after pair.
        ax: Axes to draw into, one per panel: every margin group of ``preds``, then (in a pair)
            every margin group of ``calibrated``; by default a new figure is made with
            ``matplotlib.figure.Figure`` (no pyplot, no display needed), its legend under the panels.
            The count histogram is an inset just below each given Axes.
        title: figure (or single-axes) title; wrapped to the figure's width.
        n_bins: equal-width bins, 1 to 10,000.
        from_logits: ``None`` (default) detects probabilities (every value in [0, 1], rows
            summing to 1 within 1e-2) in ``preds`` and ``calibrated`` separately; True/False
            applies to both. Others as :func:`hf_calibration.metrics.ece`.
        task: ``"binary"`` / ``"multilabel"`` for a sigmoid head (None: read from the shapes, as
            :func:`hf_calibration.metrics.ece`): each panel bins a label's probability against its 0/1 label
            (x: predicted probability, y: observed frequency).
        labels: the sigmoid head's panels, in order: label indices and ``"pooled"`` (every (sample, label) pair);
            default ``"pooled"`` then every label when there are at most 8, ``"pooled"`` alone otherwise. A pair
            (``calibrated``) puts ``preds`` in the first row and ``calibrated`` in the second.
        label_names: names of the labels, for the panel titles.

    Returns:
        the matplotlib ``Figure`` (save it with ``fig.savefig(path)``).
    """
    n_bins = _check_n_bins(n_bins)
    if margin_groups is not None:
        margin_groups = check_int(margin_groups, "margin_groups", minimum=1)
    if not isinstance(counts, bool):
        raise TypeError(f"Expected argument `counts` to be a bool, but got {counts!r}.")
    check_choice(count_scale, "count_scale", ("linear", "log"))
    min_count = check_int(min_count, "min_count", minimum=0)
    boot = check_bootstrap(ci, n_boot, seed)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"Expected argument `title` to be a string or None, but got {type(title).__name__}.")
    style = _Style(n_bins, boot, min_count, count_scale, counts)
    first = _read(preds, target, task, from_logits, ignore_index)
    if not isinstance(first, Inputs):
        sigmoid = first
        if margin_groups is not None:
            raise ValueError(
                "Expected argument `margin_groups` to be None for a binary / multi-label head: a logit margin "
                "(top-1 minus top-2) belongs to a softmax head."
            )
        states = [sigmoid]
        if calibrated is not None:
            states.append(_read(calibrated, target, sigmoid.task, from_logits, ignore_index, "calibrated"))
            if isinstance(names, str) or len(names) != 2 or not all(isinstance(x, str) for x in names):
                raise ValueError(f"Expected argument `names` to be two strings (before, after), but got {names!r}.")
        return _sigmoid_diagram(states, labels, label_names, style, names=names, ax=ax, title=title)
    if labels is not None or label_names is not None:
        raise ValueError(
            "Expected arguments `labels` / `label_names` only for a binary or multi-label head "
            "(task='binary' / 'multilabel')."
        )
    states = [first]
    if calibrated is not None:
        shapes = [tuple(x.shape) if hasattr(x, "shape") else np.shape(x) for x in (preds, calibrated)]
        if shapes[1] != shapes[0]:  # before its labels are checked against its K, which would blame `target`
            raise ValueError(
                f"Expected argument `calibrated` to have the shape of `preds` {shapes[0]} (the same samples, the "
                f"same classes), but got {shapes[1]}."
            )
        states.append(_read(calibrated, target, "multiclass", from_logits, ignore_index, "calibrated"))
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
    used: set[str] = set()
    for axis, cax, (s, g) in zip(axes, count_axes, panels):
        member = groups[g]
        confidence, correct = tops[s].confidence[member], tops[s].correct[member]
        parts = ([names[s]] if len(states) == 2 else []) + ([labels[g]] if labels[g] else [])
        panel_title = title if single else " · ".join(parts)
        used |= _draw_panel(axis, cax, confidence, correct, panel_title, style)
    return _finish_panels(fig, axes, ax, used, title if not single else None, rows, cols, style)


def _sigmoid_panels(labels: Any, num_labels: int, task: str) -> list[int | str]:
    if task == "binary":
        return ["pooled"]
    if labels is None:
        return ["pooled"] + (list(range(num_labels)) if num_labels <= 8 else [])
    if isinstance(labels, (str, int, np.integer)):
        labels = [labels]
    panels = [_check_label(label, num_labels) for label in labels]
    if not panels:
        raise ValueError(
            "Expected argument `labels` to name at least one panel ('pooled' or a label index), but got none."
        )
    return panels


def _sigmoid_diagram(states, labels, label_names, style: _Style, *, names, ax, title) -> Figure:
    """The reliability diagram of a sigmoid head: one panel per label of ``labels`` (or pooled), one row per state."""
    first = states[0]
    panels = _sigmoid_panels(labels, first.num_labels, first.task)
    if label_names is not None and len(label_names) != first.num_labels:
        raise ValueError(
            f"Expected argument `label_names` to name the {first.num_labels} labels, but got {len(label_names)}."
        )

    def panel_name(label):
        if first.task == "binary":
            return ""
        if label == "pooled":
            return f"pooled (micro): all {first.num_labels} labels"
        return f"label {label}" + (f" ({label_names[label]})" if label_names is not None else "")

    rows, cols = len(states), len(panels)
    fig, axes, count_axes = _panel_axes(ax, rows, cols, style.counts)
    single = rows == 1 and cols == 1
    used: set[str] = set()
    for i, (axis, cax) in enumerate(zip(axes, count_axes)):
        state, label = states[i // cols], panels[i % cols]
        p, y = _sigmoid_pairs(state, label)
        parts = ([names[i // cols]] if rows == 2 else []) + ([panel_name(label)] if panel_name(label) else [])
        panel_title = title if single else " · ".join(parts)
        used |= _draw_panel(axis, cax, p, y, panel_title, style)
        axis.set_ylabel("observed frequency")
        (cax if cax is not None else axis).set_xlabel("predicted probability")
    return _finish_panels(fig, axes, ax, used, title if not single else None, rows, cols, style)
