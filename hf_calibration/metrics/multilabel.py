"""Calibration metrics of sigmoid heads: binary (one probability per sample) and multi-label (one per label).

A sigmoid head's score for label ``l`` is the probability ``p_il = sigmoid(z_il)`` that label ``l`` is present. Each
label is a binary problem, and its metrics are those of torchmetrics' ``BinaryCalibrationError``: the "confidence" is
``p`` itself and the "accuracy" the label ``y`` (Naeini et al. 2015; Kumar et al. 2019), with the bins of
:func:`hf_calibration.metrics.ece` (``lo < p <= hi``, ``p = 0`` in the first bin, ``p = 1`` in the last)::

    ECE   = sum_b |B_b|/N |mean_b(y) - mean_b(p)|          (norm "l1")
    RMSCE = sqrt(sum_b |B_b|/N (mean_b(y) - mean_b(p))^2)  (norm "l2")
    MCE   = max_{b: |B_b| > 0} |mean_b(y) - mean_b(p)|     (norm "max")

AdaECE uses equal-mass bins of ``p`` (:mod:`hf_calibration.metrics.adaptive`), Brier is ``mean (p - y)^2``
(scikit-learn's ``brier_score_loss``: for a binary problem, half the two-class multiclass Brier score) and NLL the
binary cross-entropy ``-mean [y log p + (1 - y) log(1 - p)]``, computed from logits as ``softplus`` so that any finite
logit gives a finite loss. Accuracy thresholds ``p`` at 0.5 (``z > 0``).

Multi-label metrics are per label, then averaged: ``average="macro"`` (default) is the mean over labels of each
label's metric; ``"micro"`` pools every (sample, label) pair into one binary problem; ``"none"`` returns the per-label
values. Binary is the one-label case. Inputs: ``(N,)``, ``(N, 1)`` or, for a binary head with two softmax logits,
``(N, 2)`` scores (then ``p = softmax(z)_1``, the log-odds ``z_1 - z_0``) with ``(N,)`` 0/1 labels; multi-label
``(N, L)`` scores with ``(N, L)`` 0/1 labels. Labels equal to ``ignore_index`` (-100) are left out element by element.
``from_logits=None`` detects probabilities as torchmetrics does for these tasks: every value in [0, 1] is a
probability (two-column binary scores: rows summing to 1, the multi-class rule).

Intervals (``ci=``): the samples (images) are resampled, every label of a sample together, so the macro and pooled
values and each label's get one paired set of resamples; the same :class:`~hf_calibration.metrics.bootstrap.Bootstrap`
as every other metric (its interval method included).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX, check_choice
from hf_calibration._core.inputs import Inputs, read_inputs
from hf_calibration.metrics._binned import _adaece_statistic
from hf_calibration.metrics._format import AVERAGES, check_average_for, markdown_table  # noqa: F401 - also their names here
from hf_calibration.metrics.binning import _bin_sums, _check_n_bins, _uniform_bin_index
from hf_calibration.metrics.bootstrap import (
    Bootstrap,
    MetricInterval,
    check_bootstrap,
    point_statistic,
    reframed,
    segment_sums,
)
from hf_calibration.metrics.table import get_metric, list_metrics

__all__ = [
    "AVERAGES",
    "SigmoidCalibrationReport",
    "SigmoidInputs",
    "prepare_sigmoid",
    "sigmoid_calibration_report",
    "sigmoid_inputs",
    "sigmoid_metric",
    "sigmoid_report_of",
]

NORMS = ("l1", "l2", "max")


class SigmoidInputs(NamedTuple):
    """Validated sigmoid-head inputs, ``(N, L)`` (binary: ``L = 1``); ignored elements masked out."""

    probs: np.ndarray  # (N, L) float64, p = P(label present)
    log_p: np.ndarray  # (N, L) float64, log p
    log_q: np.ndarray  # (N, L) float64, log(1 - p)
    target: np.ndarray  # (N, L) float64 in {0, 1} (0 where masked)
    mask: np.ndarray  # (N, L) bool, kept elements
    task: str
    from_logits: bool

    @property
    def num_labels(self) -> int:
        return self.probs.shape[1]

    @property
    def full(self) -> bool:
        """Whether every element is kept (no ignored label)."""
        return bool(self.mask.all())

    def label(self, l: int) -> tuple[np.ndarray, np.ndarray]:
        """``(p, y)`` of label ``l``'s kept samples."""
        keep = self.mask[:, l]
        return self.probs[keep, l], self.target[keep, l]

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """``(p, y)`` of every kept (sample, label) pair."""
        return self.probs[self.mask], self.target[self.mask]


# ----------------------------------------------------------------------------------------------- inputs


def prepare_sigmoid(
    preds: Any,
    target: Any,
    *,
    task: str,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    preds_name: str = "preds",
    target_name: str = "target",
) -> SigmoidInputs:
    """Check and convert binary / multi-label inputs (module docstring) to :class:`SigmoidInputs`, in float64."""
    return sigmoid_inputs(
        read_inputs(
            preds,
            target,
            task=task,
            from_logits=from_logits,
            ignore_index=ignore_index,
            preds_name=preds_name,
            target_name=target_name,
        )
    )


def sigmoid_inputs(inputs: Inputs) -> SigmoidInputs:
    """The float64 per-label probabilities and log-probabilities of sigmoid-head :class:`~hf_calibration._core.inputs.Inputs`
    (two softmax scores: the positive class, column 1)."""
    z = inputs.preds.astype(np.float64, copy=False)
    if inputs.two_softmax:
        z = (z[:, 1] - z[:, 0])[:, None] if inputs.from_logits else z[:, 1:2]
    else:
        z = z.reshape(z.shape[0], -1)
    if inputs.from_logits:
        log_p, log_q = -np.logaddexp(0.0, -z), -np.logaddexp(0.0, z)  # log sigmoid(z), log sigmoid(-z): finite
        probs = np.exp(log_p)
    else:
        probs = np.clip(z, 0.0, 1.0)
        with np.errstate(divide="ignore"):
            log_p, log_q = np.log(probs), np.log1p(-probs)
    return SigmoidInputs(probs, log_p, log_q, inputs.target, inputs.mask, inputs.task, bool(inputs.from_logits))


# ----------------------------------------------------------------------------------------------- point values


def _binned(p: np.ndarray, y: np.ndarray, n_bins: int, norm: str) -> float:
    """Binary ECE (l1), RMSCE (l2) or MCE (max) of probabilities ``p`` against 0/1 labels ``y``."""
    sums = _bin_sums(_uniform_bin_index(p, n_bins), p, y, n_bins)
    return _binned_from_sums(sums.count, sums.confidence, sums.accuracy, norm)


def _binned_from_sums(count, conf_sum, hit_sum, norm: str):
    """The binned error from per-bin count / sum of p / sum of y (last axis: bins); any leading axes (resamples)."""
    count = np.asarray(count, dtype=np.float64)
    total = count.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if norm == "l1":
            return np.abs(conf_sum - hit_sum).sum(axis=-1) / total
        gap = np.where(count > 0, (conf_sum - hit_sum) / np.where(count > 0, count, 1.0), 0.0)
        if norm == "l2":
            return np.sqrt((count * gap * gap).sum(axis=-1) / total)
        return np.abs(gap).max(axis=-1)


def _label_terms(inputs: SigmoidInputs, l: int | None):
    """``(p, y, log p, log(1 - p))`` of label ``l``'s kept samples (None: every kept pair, pooled)."""
    if l is not None:
        keep = inputs.mask[:, l]
        return inputs.probs[keep, l], inputs.target[keep, l], inputs.log_p[keep, l], inputs.log_q[keep, l]
    keep = inputs.mask
    return inputs.probs[keep], inputs.target[keep], inputs.log_p[keep], inputs.log_q[keep]


def _values(inputs: SigmoidInputs, name: str, n_bins: int) -> tuple[np.ndarray, float, float]:
    """``(per-label values (L,), macro, micro)`` of metric ``name``; a label with no kept sample is NaN."""
    row = get_metric(name)
    per_label = np.full(inputs.num_labels, np.nan)
    for l in range(inputs.num_labels):
        p, y, lp, lq = _label_terms(inputs, l)
        if p.size:
            per_label[l] = row.per_label(p, y, n_bins, lp, lq)
    empty = np.flatnonzero(np.isnan(per_label) & ~inputs.mask.any(axis=0))
    if empty.size and inputs.num_labels > 1:
        warnings.warn(
            f"Label(s) {', '.join(map(str, empty[:10]))} have no kept entry (every one is ignore_index): the macro "
            f"average is over the other {inputs.num_labels - empty.size} label(s), and the per-label value is NaN.",
            UserWarning,
            stacklevel=4,
        )
    macro = float(np.nanmean(per_label))
    if inputs.num_labels == 1:
        micro = per_label[0]
    else:
        p, y, lp, lq = _label_terms(inputs, None)
        micro = row.per_label(p, y, n_bins, lp, lq)
    return per_label, macro, float(micro)


# ----------------------------------------------------------------------------------------------- resamples
# Rows (samples) are resampled: a block of count vectors ``counts`` (B, N) in row order weights every element of row i
# by counts[:, i]. The binned metrics of a label (or of the pool) are per-bin sums over its kept elements, contiguous
# runs once the elements are sorted by p, so a resample's sums are ``segment_sums`` of the gathered counts: exact for
# any ignored elements (each resample's total is what it is), O(B * elements).

_GATHER_ELEMENTS = 1 << 22  # gathered counts per piece (16 MB of int32)


def _binned_statistic(p: np.ndarray, y: np.ndarray, rows: np.ndarray, n_bins: int):
    """``counts (B, N) -> (B, 5)``: ECE, MCE, RMSCE, O-ECE, U-ECE of the elements ``(p, y)`` of rows ``rows`` on each
    resample, and their accuracy at threshold 0.5 (column 5)."""
    order = np.argsort(p, kind="stable")
    p, y, rows = p[order], y[order], rows[order]
    index = _uniform_bin_index(p, n_bins)
    starts = np.searchsorted(index, np.arange(n_bins + 1), side="left")
    hits = ((p > 0.5) == (y > 0.5)).astype(np.float64)
    columns = np.ascontiguousarray(np.stack([np.ones_like(p), p, y, hits]))

    def statistic(counts: np.ndarray) -> np.ndarray:
        out = []
        step = max(1, _GATHER_ELEMENTS // max(1, rows.size))
        for start in range(0, counts.shape[0], step):
            gathered = np.ascontiguousarray(np.take(counts[start : start + step], rows, axis=1))
            sums = segment_sums(gathered, starts, columns)  # (b, bins, [count, p, y, hit])
            count, conf, hit = sums[..., 0], sums[..., 1], sums[..., 2]
            total = count.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                gap = (conf - hit) / total[:, None]
                out.append(
                    np.stack(
                        [
                            np.abs(gap).sum(axis=1),
                            _binned_from_sums(count, conf, hit, "max"),
                            _binned_from_sums(count, conf, hit, "l2"),
                            np.clip(gap, 0, None).sum(axis=1),
                            np.clip(-gap, 0, None).sum(axis=1),
                            sums[..., 3].sum(axis=1) / total,
                        ],
                        axis=1,
                    )
                )
        return np.concatenate(out)

    return statistic


_BINNED_COLUMNS = {"ece": 0, "mce": 1, "rmsce": 2, "o_ece": 3, "u_ece": 4, "accuracy": 5}


def _score_statistic(inputs: SigmoidInputs):
    """``counts (B, N) -> (B, L, 3)``: per label, the resampled sums of the Brier terms, the NLL terms and the count."""
    mask = inputs.mask.astype(np.float64)
    brier = np.where(inputs.mask, (inputs.probs - inputs.target) ** 2, 0.0)
    nll = np.where(inputs.mask, -np.where(inputs.target > 0.5, inputs.log_p, inputs.log_q), 0.0)
    columns = np.concatenate([brier, nll, mask], axis=1)  # (N, 3L)
    finite = np.isfinite(columns).all()

    def statistic(counts: np.ndarray) -> np.ndarray:
        c = counts.astype(np.float64)
        if finite:
            sums = c @ columns
        else:  # an infinite NLL term (a probability of exactly 0 or 1 on the wrong side) counts only when drawn
            with np.errstate(invalid="ignore"):
                sums = np.where(c[:, :, None] > 0, c[:, :, None] * columns[None], 0.0).sum(axis=1)
        return sums.reshape(c.shape[0], 3, -1).transpose(0, 2, 1)

    return statistic


def _smooth_or_adaptive_statistic(name: str, p: np.ndarray, y: np.ndarray, n_bins: int):
    """AdaECE / smCE / smECE on resamples of a full column (every element kept, so a resample has N of them)."""
    from hf_calibration.metrics import smooth
    from hf_calibration.metrics.bootstrap import frame

    factory = {
        "adaece": lambda: _adaece_statistic(p, y, n_bins),
        "smce": lambda: smooth._smce_statistic(p, y),
        "smece": lambda: smooth._smece_statistic(p, y),
    }[name]
    return reframed(factory(), frame(p))


def _intervals(
    inputs: SigmoidInputs, names: Sequence[str], n_bins: int, boot: Bootstrap, smooth_boot: Bootstrap | None = None
) -> dict[str, tuple[list, MetricInterval, MetricInterval]]:
    """For each metric of ``names``: (per-label intervals, macro interval, micro interval), paired resamples. AdaECE /
    smCE / smECE get intervals only when no element is ignored (a resample of rows then has N elements per label);
    otherwise they are left out of the result."""
    n, num_labels = inputs.probs.shape
    rows_all = np.arange(n)
    binned = [name for name in names if name in _BINNED_COLUMNS]
    scores = [name for name in names if name in ("brier", "nll")]
    rest = [name for name in names if name in ("adaece", "smce", "smece") and inputs.full]
    registered = [name for name in names if name not in (*_BINNED_COLUMNS, "brier", "nll", "adaece", "smce", "smece")]
    statistics = []
    if binned:
        for l in range(num_labels):
            keep = inputs.mask[:, l]
            statistics.append(_binned_statistic(inputs.probs[keep, l], inputs.target[keep, l], rows_all[keep], n_bins))
        if num_labels > 1:
            rows = np.broadcast_to(rows_all[:, None], inputs.mask.shape)[inputs.mask]
            statistics.append(_binned_statistic(*inputs.pooled(), rows, n_bins))
    if scores:
        statistics.append(_score_statistic(inputs))
    replicates = boot.replicates(statistics, n) if statistics else []
    out: dict[str, tuple[list, MetricInterval, MetricInterval]] = {}
    values = {name: _values(inputs, name, n_bins) for name in names}

    def assemble(name: str, per_label_reps: np.ndarray, micro_reps: np.ndarray, b: Bootstrap) -> None:
        per_label, macro, micro = values[name]
        with np.errstate(invalid="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a label absent from a resample: NaN, left out
                macro_reps = np.nanmean(per_label_reps, axis=1)
        rule = get_metric(name).interval
        label_intervals = [
            float("nan") if np.isnan(v) else b.interval(float(v), per_label_reps[:, l], rule)
            for l, v in enumerate(per_label)
        ]  # NaN: a label with no kept sample
        out[name] = (label_intervals, b.interval(macro, macro_reps, rule), b.interval(micro, micro_reps, rule))

    if binned:
        per = np.stack([r for r in replicates[:num_labels]], axis=1)  # (B, L, 6)
        pooled = replicates[num_labels] if num_labels > 1 else replicates[0]
        for name in binned:
            column = _BINNED_COLUMNS[name]
            assemble(name, per[:, :, column], pooled[:, column], boot)
    if scores:
        sums = replicates[-1]  # (B, L, 3)
        for i, name in enumerate(("brier", "nll")):
            if name in scores:
                with np.errstate(invalid="ignore", divide="ignore"):
                    per_label = sums[:, :, i] / sums[:, :, 2]
                    micro = sums[:, :, i].sum(axis=1) / sums[:, :, 2].sum(axis=1)
                assemble(name, per_label, micro, boot)
    if rest:
        b = smooth_boot or boot
        for name in rest:
            stats = [
                _smooth_or_adaptive_statistic(name, inputs.probs[:, l], inputs.target[:, l], n_bins)
                for l in range(num_labels)
            ]
            if num_labels > 1:
                pooled_p, pooled_y = inputs.probs.reshape(-1), inputs.target.reshape(-1)
                frame_pooled = np.argsort(pooled_p, kind="stable")
                inner = {"adaece": lambda: _adaece_statistic(pooled_p, pooled_y, n_bins)}.get(name)
                from hf_calibration.metrics import smooth

                inner = (
                    inner()
                    if inner
                    else (
                        smooth._smce_statistic(pooled_p, pooled_y)
                        if name == "smce"
                        else smooth._smece_statistic(pooled_p, pooled_y)
                    )
                )
                element_row = np.repeat(np.arange(n), num_labels)[frame_pooled]
                stats.append(lambda counts, inner=inner, rows=element_row: inner(np.take(counts, rows, axis=1)))
            reps = b.replicates(stats, n)
            per = np.stack(reps[:num_labels], axis=1)
            assemble(name, per, reps[num_labels] if num_labels > 1 else reps[0], b)
    for name in registered:  # a metric registered in the table: its point form on each resample's elements
        row = get_metric(name)
        b = smooth_boot if smooth_boot is not None and row.n_boot == smooth_boot.n_boot else boot
        stats = []
        for l in [*range(num_labels), None] if num_labels > 1 else range(num_labels):
            keep = inputs.mask if l is None else inputs.mask[:, l]
            rows = (np.broadcast_to(rows_all[:, None], inputs.mask.shape) if l is None else rows_all)[keep]
            p, y, lp, lq = _label_terms(inputs, l)
            point = point_statistic(lambda *c, row=row: row.per_label(*c[:2], n_bins, *c[2:]), (p, y, lp, lq))
            stats.append(lambda counts, point=point, rows=rows: point(np.take(counts, rows, axis=1)))
        reps = b.replicates(stats, n)
        assemble(name, np.stack(reps[:num_labels], axis=1), reps[-1], b)
    return out


# ----------------------------------------------------------------------------------------------- public entry


def _check_average(average: Any) -> str:
    return check_choice(average, "average", AVERAGES)


def sigmoid_metric(
    name: str, inputs: Inputs, n_bins: int = 15, *, average: str = "macro", boot: Bootstrap | None = None
):
    """Metric ``name`` (``"ece"``, ``"rmsce"``, ``"mce"``, ``"adaece"``, ``"brier"``, ``"nll"``, ...) of a binary or
    multi-label head's :class:`~hf_calibration._core.inputs.Inputs` (read once by the public function): a float
    (binary, or ``average="macro"`` / ``"micro"``), a ``(L,)`` array (``"none"``), or with a bootstrap a
    :class:`~hf_calibration.metrics.MetricInterval` (a list of them for ``"none"``)."""
    task = inputs.task
    sig = sigmoid_inputs(inputs)
    if boot is None:
        per_label, macro, micro = _values(sig, name, n_bins)
        if task == "binary":
            return float(per_label[0])
        return {"macro": macro, "micro": micro, "none": per_label}[average]
    if name in ("adaece",) and not sig.full:
        raise ValueError(
            "Expected no ignored labels for an AdaECE interval (its bins are re-cut on each resample of the "
            "samples, which needs every sample to carry every label); drop ci=, or the ignored labels."
        )
    labels, macro, micro = _intervals(sig, [name], n_bins, boot)[name]
    if task == "binary":
        return labels[0]
    return {"macro": macro, "micro": micro, "none": labels}[average]


# ----------------------------------------------------------------------------------------------- report


def _label(name: str) -> tuple[str, bool]:
    """``(display name, printed in percent)`` of a sigmoid head's metric, from the metric table."""
    row = get_metric(name)
    return row.display("multilabel"), row.percent


def _cell(name: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and not isinstance(value, MetricInterval) and math.isnan(value)):
        return "-"
    scale, digits = (100.0, 2) if _label(name)[1] else (1.0, 4)
    if isinstance(value, MetricInterval):
        return value.format(scale, digits)
    return f"{scale * float(value):.{digits}f}"


@dataclass(frozen=True)
class SigmoidCalibrationReport:
    """Every metric of a binary or multi-label head, macro-averaged over labels and pooled (micro), with each label's.

    ``report.macro["ece"]``, ``report.micro["ece"]``, ``report.per_label["ece"]`` (an ``(L,)`` array, or a list of
    :class:`~hf_calibration.metrics.MetricInterval` with ``ci``); ``report["ece"]`` is the macro value (binary: the
    value). ``str(report)`` prints the macro and pooled columns side by side and says which is which;
    ``report.per_label_table()`` prints a row per label. Percentages with two decimals, Brier and NLL as plain numbers.
    """

    task: str
    n: int
    num_labels: int
    macro: dict[str, Any]
    micro: dict[str, Any]
    per_label: dict[str, Any]
    n_bins: int = 15
    from_logits: bool | None = None
    label_names: tuple[str, ...] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __getitem__(self, key: str) -> Any:
        return self.macro[key]

    def keys(self):
        return self.macro.keys()

    def intervals(self, average: str = "macro") -> dict[str, MetricInterval]:
        """The metrics that carry a bootstrap interval (``ci=``), by name: the macro values (default), the pooled ones
        (``average="micro"``), or each label's (``"none"``: a list per metric), as ``CalibrationReport.intervals()``."""
        values = {"macro": self.macro, "micro": self.micro, "none": self.per_label}[
            check_average_for(self.task, average)
        ]
        if average == "none":
            return {k: v for k, v in values.items() if isinstance(v, list) and v and isinstance(v[0], MetricInterval)}
        return {k: v for k, v in values.items() if isinstance(v, MetricInterval)}

    def to_dict(self) -> dict[str, Any]:
        def plain(v):
            if isinstance(v, np.ndarray):
                return v.tolist()
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v.to_dict() if isinstance(v, MetricInterval) else v

        return {
            "task": self.task,
            "n": self.n,
            "num_labels": self.num_labels,
            "n_bins": self.n_bins,
            "macro": {k: plain(v) for k, v in self.macro.items()},
            "micro": {k: plain(v) for k, v in self.micro.items()},
            "per_label": {k: plain(v) for k, v in self.per_label.items()},
        }

    def _names(self, i: int) -> str:
        return self.label_names[i] if self.label_names else str(i)

    def __str__(self) -> str:
        intervals = any(isinstance(v, MetricInterval) for v in self.macro.values())
        header = "value" if self.task == "binary" else "macro (mean over labels)"
        rows = [
            (_label(k)[0] + (" (%)" if _label(k)[1] else ""), _cell(k, self.macro[k]), _cell(k, self.micro[k]))
            for k in self.macro
        ]
        if self.task == "binary":
            rows = [(a, b) for a, b, _ in rows]
            cols = ["metric", header]
        else:
            cols = ["metric", header, "pooled (micro)"]
        widths = [max(len(str(r[i])) for r in [cols] + rows) for i in range(len(cols))]
        lines = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))),
            "-" * (sum(widths) + 2 * (len(cols) - 1)),
        ]
        lines += [
            "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows
        ]
        what = (
            "binary head: one sigmoid probability per sample"
            if self.task == "binary"
            else f"multi-label head, {self.num_labels} labels: macro = mean of the per-label values, pooled (micro) = "
            "every (sample, label) pair as one binary problem"
        )
        inputs = {True: ", from logits", False: ", from probabilities"}.get(self.from_logits, "")
        level = next((v for v in self.macro.values() if isinstance(v, MetricInterval)), None)
        extra = (
            f"; [{100 * level.level:g} % bootstrap interval over the samples, {level.n_boot} resamples]"
            if intervals
            else ""
        )
        lines.append(f"(N = {self.n}, {what}; {self.n_bins} bins{inputs}{extra})")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def per_label_table(self, columns: Sequence[str] = ("ece", "nll", "brier")) -> str:
        """A Markdown table, one row per label, then the macro and pooled rows."""
        header = ["label"] + [_label(c)[0] + (" (%)" if _label(c)[1] else "") for c in columns]
        body = [[self._names(i)] + [_cell(c, self.per_label[c][i]) for c in columns] for i in range(self.num_labels)]
        body.append(["macro (mean)"] + [_cell(c, self.macro[c]) for c in columns])
        body.append(["pooled (micro)"] + [_cell(c, self.micro[c]) for c in columns])
        return "\n".join(markdown_table(header, body))


def sigmoid_calibration_report(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    task: str,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    label_names: Sequence[str] | None = None,
) -> SigmoidCalibrationReport:
    """:class:`SigmoidCalibrationReport` of a binary or multi-label head (see
    :func:`hf_calibration.metrics.calibration_report`, which calls this for ``task="binary"`` / ``"multilabel"``)."""
    n_bins = _check_n_bins(n_bins)
    check_bootstrap(ci, n_boot, seed)
    return sigmoid_report_of(
        read_inputs(preds, target, task=task, from_logits=from_logits, ignore_index=ignore_index),
        n_bins,
        ci=ci,
        n_boot=n_boot,
        seed=seed,
        label_names=label_names,
    )


def sigmoid_report_of(
    inputs: Inputs,
    n_bins: int = 15,
    *,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    label_names: Sequence[str] | None = None,
) -> SigmoidCalibrationReport:
    """:func:`sigmoid_calibration_report` of inputs read once (``n_bins`` checked)."""
    from hf_calibration.metrics.bootstrap import SMOOTH_N_BOOT

    boot = check_bootstrap(ci, n_boot, seed)
    smooth_boot = check_bootstrap(ci, n_boot, seed, default_n_boot=SMOOTH_N_BOOT)
    task = inputs.task
    inputs = sigmoid_inputs(inputs)
    if label_names is not None:
        label_names = tuple(str(x) for x in label_names)
        if len(label_names) != inputs.num_labels:
            raise ValueError(
                f"Expected argument `label_names` to name the {inputs.num_labels} labels, but got {len(label_names)} names."
            )
    names = list_metrics(head=task, report=True)
    macro, micro, per_label = {}, {}, {}
    for name in names:
        per_label[name], macro[name], micro[name] = _values(inputs, name, n_bins)
    notes: list[str] = []
    if boot is not None:
        found = _intervals(inputs, names, n_bins, boot, smooth_boot)
        for name, (labels, mac, mic) in found.items():
            per_label[name], macro[name], micro[name] = labels, mac, mic
        missing = [name for name in names if name not in found]
        if missing:
            notes.append(
                f"{', '.join(missing)}: no interval (some labels are ignored for some samples, so a resample's bins "
                "cannot be re-cut per label)"
            )
    return SigmoidCalibrationReport(
        task,
        int(inputs.probs.shape[0]),
        inputs.num_labels,
        macro,
        micro,
        per_label,
        n_bins,
        inputs.from_logits,
        label_names,
        tuple(notes),
    )
