"""All calibration metrics of a set of predictions at once, printed as the papers print them."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX, check_choice
from hf_calibration.metrics._format import markdown_table, read_inputs, top_label
from hf_calibration.metrics._probability_pass import probability_rows
from hf_calibration.metrics.adaptive import _adaece_compute, _adaece_statistic
from hf_calibration.metrics.binning import _check_n_bins
from hf_calibration.metrics.bootstrap import (
    SMOOTH_N_BOOT,
    Bootstrap,
    MetricInterval,
    check_bootstrap,
    frame,
    frame_position,
    point_statistic,
    weighted_means,
)
from hf_calibration.metrics.ece import (
    BINNED_COLUMNS,
    _binned_statistic,
    _classwise_ece_compute,
    _ece_compute,
    _ece_split_compute,
    _mce_compute,
)
from hf_calibration.metrics.table import get_metric, list_metrics

logger = logging.getLogger(__name__)


def _label(name: str) -> tuple[str, bool]:
    """``(printed label, shown in percent)`` of a report key, from the metric table."""
    if name == "n":
        return "N", False
    row = get_metric(name)
    return row.label, row.percent


DEFAULT_COLUMNS = ("accuracy", "ece", "adaece", "smce", "o_ece", "u_ece")
_NOT_METRICS = ("n_bins", "from_logits", "extra")


def _format_value(name: str, value: Any, unit: bool = False, notes: dict[str, int] | None = None) -> str:
    """``"3.21"``; with an interval ``"3.21 [2.40, 4.05]"`` (``unit``: ``"3.21 % [2.40, 4.05]"``), and ``" (1)"``
    when the interval has a note (``notes``: note -> its footnote number, filled here)."""
    if value is None:
        return "-"
    if name == "n":
        return str(int(value))
    scale, digits = (100.0, 2) if _label(name)[1] else (1.0, 4)
    if isinstance(value, MetricInterval):
        text = value.format(scale, digits, " %" if unit and _label(name)[1] else "")
        if value.note and notes is not None:
            text += f" ({notes.setdefault(value.note, len(notes) + 1)})"
        return text
    return f"{scale * value:.{digits}f}"


def _footnotes(notes: dict[str, int], named: dict[str, list[str]]) -> list[str]:
    """``"(1) MCE: <note>"`` lines, each note once with the metrics it applies to."""
    return [f"({number}) {', '.join(named[note])}: {note}." for note, number in notes.items()]


def _interval_legend(intervals: dict[str, MetricInterval]) -> str:
    """How the intervals were made: ``"(95 % bootstrap intervals, 1000 resamples (200: smCE, smECE); basic
    (bias-corrected): ECE, ...; percentile: Accuracy, ...; none: MCE)"``."""
    counts = sorted({v.n_boot for v in intervals.values()}, reverse=True)
    level = next(iter(intervals.values())).level
    resamples = f"{counts[0]} resamples"
    for count in counts[1:]:
        resamples += f" ({count}: {', '.join(_label(k)[0] for k, v in intervals.items() if v.n_boot == count)})"
    methods: dict[str, list[str]] = {}
    for key, value in intervals.items():
        methods.setdefault(value.method, []).append(_label(key)[0])
    words = {"basic": "basic (bias-corrected)", "basic_plugin": "basic, plug-in pivot"}
    how = "; ".join(f"{words.get(m, m)}: {', '.join(names)}" for m, names in methods.items())
    return f"({100 * level:g} % bootstrap intervals, {resamples}; {how})"


def _header(name: str, unit: bool = True) -> str:
    label, percent = _label(name)
    return f"{label} (%)" if percent and unit else label


@dataclass(frozen=True)
class CalibrationReport(Mapping):
    """Every metric of :mod:`hf_calibration.metrics` for one set of predictions, as fractions.

    Read-only mapping (``report["ece"]``, ``dict(report)``, ``report.to_dict()``) and attributes
    (``report.ece``). ``str(report)`` is the papers' table: percentages with two decimals
    (Brier and NLL as plain numbers). ``smce`` / ``smece`` are None only when the smooth
    metrics are unavailable. ``n_bins`` and ``from_logits`` (whether the inputs were taken for
    logits, as given or detected) describe the computation and are not among the keys. A metric registered in the
    table (:func:`hf_calibration.metrics.table.register_metric`) follows the package's own, in ``extra``; it reads
    as the others (``report["name"]``, ``report.name``).
    """

    n: int
    accuracy: float
    ece: float
    adaece: float
    mce: float
    classwise_ece: float
    o_ece: float
    u_ece: float
    smce: float | None
    smece: float | None
    brier: float
    nll: float
    n_bins: int = 15
    from_logits: bool | None = None  # what the inputs were taken for (detected or given); not a metric
    extra: Mapping[str, Any] = field(default_factory=dict)  # the metrics registered in the table after these

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self) if f.name not in _NOT_METRICS] + list(self.extra)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __getattr__(self, name: str) -> Any:  # a metric registered in the table: ``report.<name>``
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._keys()}

    def intervals(self) -> dict[str, MetricInterval]:
        """The metrics that carry a bootstrap interval (``calibration_report(..., ci=...)``), by name."""
        return {key: value for key, value in self.to_dict().items() if isinstance(value, MetricInterval)}

    def __str__(self) -> str:
        intervals = self.intervals()
        notes: dict[str, int] = {}
        # with intervals the percent sign goes with the value: "3.21 % [2.40, 4.05]"
        rows = [
            (_header(key, not intervals), _format_value(key, getattr(self, key), unit=True, notes=notes))
            for key in self._keys()
        ]
        width = max(len(label) for label, _ in rows)
        cell = max([10] + [len(value) for _, value in rows])
        lines = [f"{'metric':<{width}}  {'value':>{cell}}", "-" * (width + cell + 2)]
        lines += [f"{label:<{width}}  {value:>{cell}}" for label, value in rows]
        inputs = {True: ", from logits", False: ", from probabilities"}.get(self.from_logits, "")
        lines.append(f"({self.n_bins} bins{inputs})")
        if intervals:
            lines.append(_interval_legend(intervals))
        named: dict[str, list[str]] = {}
        for key, value in intervals.items():
            if value.note:
                named.setdefault(value.note, []).append(_label(key)[0])
        return "\n".join(lines + _footnotes(notes, named))


def _smooth_metrics(confidence: np.ndarray, correct: np.ndarray) -> tuple[float | None, float | None]:
    try:  # the smooth module is optional at import time
        from hf_calibration.metrics import smooth
    except ImportError as err:  # pragma: no cover - only while smooth.py is missing or broken
        logger.warning("smCE / smECE unavailable: %s", err)
        return None, None
    return smooth.smce_from_confidence(confidence, correct), smooth.smece_from_confidence(confidence, correct)


def top_label_intervals(
    values: dict[str, Any],
    conf: np.ndarray,
    correct: np.ndarray,
    scores: np.ndarray | None,
    n_bins: int,
    boot: Bootstrap,
    smooth_boot: Bootstrap,
) -> dict[str, Any]:
    """The bootstrap interval of every top-label metric of ``values`` (those not None; classwise ECE aside), all
    from the same resamples of the rows: the package's compiled weighted forms where the metric has one, its table
    row's point form otherwise (``point_statistic``); a metric whose row asks for fewer resamples (smCE, smECE: 200)
    gets the first ``smooth_boot.n_boot`` of them. ``scores``: each row's Brier and NLL terms (None: neither)."""
    from hf_calibration.metrics import smooth

    names = [key for key, value in values.items() if value is not None and key not in ("n", "classwise_ece")]
    order = frame(conf)
    own = {
        "adaece": lambda: _adaece_statistic(conf, correct, n_bins),
        "brier": lambda: weighted_means(scores, order),
        "nll": lambda: weighted_means(scores, order),
        "smce": lambda: smooth._smce_statistic(conf, correct),
        "smece": lambda: smooth._smece_statistic(conf, correct),
    }
    statistics, limits, reads = [], [], {}  # reads: name -> (statistic index, column or None)
    if any(name in BINNED_COLUMNS for name in names):
        statistics.append(_binned_statistic(conf, correct, n_bins))
        limits.append(None)
        reads.update({name: (0, column) for column, name in enumerate(BINNED_COLUMNS) if name in names})
    for name in names:
        if name in reads:
            continue
        column = {"brier": 0, "nll": 1}.get(name)  # one statistic gives both
        partner = {"brier": "nll", "nll": "brier"}.get(name)
        if partner in reads:
            reads[name] = (reads[partner][0], column)
            continue
        row = get_metric(name)
        point = (lambda p, a, row=row: row.top_label(p, a, n_bins)) if row.point is not None else None
        statistics.append(own[name]() if name in own else point_statistic(point, (conf, correct), order))
        limits.append(smooth_boot.n_boot if row.n_boot == SMOOTH_N_BOOT else None)
        reads[name] = (len(statistics) - 1, column)
    replicates = boot.replicates(statistics, conf.shape[0], limits)
    out = {}
    for name, (index, column) in reads.items():
        b = boot if limits[index] is None else smooth_boot
        reps = replicates[index] if column is None else replicates[index][:, column]
        out[name] = b.interval(values[name], reps, name)
    return out


def _report(n: int, values: dict[str, Any], n_bins: int, from_logits: bool | None) -> CalibrationReport:
    """A :class:`CalibrationReport`: the package's metrics as its fields, those registered later as ``extra``."""
    built_in = {f.name for f in fields(CalibrationReport)}
    extra = {key: values.pop(key) for key in list(values) if key not in built_in}
    return CalibrationReport(n=n, **values, n_bins=n_bins, from_logits=from_logits, extra=extra)


def registered_rows(head: str = "multiclass") -> list:
    """The table's rows registered after the package's own that ``head``'s report shows (computed by their point)."""
    built_in = {f.name for f in fields(CalibrationReport)}
    return [get_metric(name) for name in list_metrics(head=head, report=True) if name not in built_in]


def calibration_report(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    task: str | None = None,
    label_names: Sequence[str] | None = None,
) -> CalibrationReport:
    """Accuracy, ECE, AdaECE, MCE, classwise ECE, O-/U-ECE, smCE, smECE, Brier and NLL in one call.

    The top-label confidences are computed once and shared by every binned and smooth metric;
    one streaming softmax pass gives classwise ECE, Brier and NLL. Each value equals the
    corresponding function (``ece``, ``adaece``, ...) on the same input. Arguments as
    :func:`hf_calibration.metrics.ece`: ``from_logits=None`` (default) detects probabilities
    (every value in [0, 1], rows summing to 1 within 1e-2), True/False win.

    With ``ci`` (a level such as 0.95) every metric becomes a
    :class:`~hf_calibration.metrics.MetricInterval` (still its float value) with a bootstrap interval, all
    from the same resamples of the rows: ``n_boot`` of them (default 1,000; smCE, smECE and classwise ECE
    200 unless ``n_boot`` is given: they cost more per resample), drawn from ``seed``. Each metric's interval
    is the one :mod:`hf_calibration.metrics.bootstrap` chose for it by measured coverage: basic
    (bias-corrected) for the calibration errors, percentile for accuracy, Brier and NLL, none for MCE.
    ``str(report)`` then prints ``3.21 % [2.40, 4.05]``, and a numbered note under the table wherever an
    interval should be read with care (the estimate outside it, an interval reaching 0, no interval).

    A binary or multi-label head (``task="binary"`` / ``"multilabel"``, or read from the shapes: ``(N, L)`` 0/1
    targets, one score column) gets a :class:`~hf_calibration.metrics.multilabel.SigmoidCalibrationReport` instead:
    the same metrics per label (each label's probability against its 0/1 label, as torchmetrics'
    ``BinaryCalibrationError``), macro-averaged and pooled (micro), RMSCE beside them, NLL as the binary
    cross-entropy; ``label_names`` names the labels in its per-label table.

    Example:
        >>> import numpy as np
        >>> logits = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5]])
        >>> report = calibration_report(logits, np.array([0, 1, 1]))
        >>> round(report["accuracy"], 4), report.n
        (0.6667, 3)
    """
    n_bins = _check_n_bins(n_bins)
    boot = check_bootstrap(ci, n_boot, seed)
    smooth_boot = check_bootstrap(ci, n_boot, seed, default_n_boot=SMOOTH_N_BOOT)
    inputs = read_inputs(preds, target, task=task, from_logits=from_logits, ignore_index=ignore_index)
    if inputs.task != "multiclass":
        from hf_calibration.metrics.multilabel import sigmoid_report_of

        return sigmoid_report_of(inputs, n_bins, ci=ci, n_boot=n_boot, seed=seed, label_names=label_names)
    if label_names is not None:
        raise ValueError(
            "Expected argument `label_names` only for a multi-label or binary head (task='multilabel' / 'binary')."
        )
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    n = inputs.preds.shape[0]

    # one pass over the probabilities: classwise sums, Brier / NLL terms and, with ci, classwise ECE's resamples
    rows = probability_rows(
        inputs, n_bins, boot=smooth_boot, position=None if boot is None else frame_position(conf), checked=True
    )

    split = _ece_split_compute(conf, correct, n_bins)
    smce_value, smece_value = _smooth_metrics(conf, correct)
    values = dict(
        accuracy=float(correct.mean()),
        ece=_ece_compute(conf, correct, n_bins),
        adaece=_adaece_compute(conf, correct, n_bins),
        mce=_mce_compute(conf, correct, n_bins),
        classwise_ece=_classwise_ece_compute(rows.cells, n),
        o_ece=split.over,
        u_ece=split.under,
        smce=smce_value,
        smece=smece_value,
        brier=rows.brier,
        nll=rows.nll,
    )
    values.update({row.name: row.top_label(conf, correct, n_bins) for row in registered_rows()})
    if boot is not None:
        values.update(top_label_intervals(values, conf, correct, rows.scores, n_bins, boot, smooth_boot))
        values["classwise_ece"] = smooth_boot.interval(values["classwise_ece"], rows.replicates, "classwise_ece")
    return _report(n, values, n_bins, inputs.from_logits)


def format_reports(
    reports: Mapping[str, CalibrationReport], columns: Sequence[str] | None = None, *, average: str = "macro"
) -> str:
    """Several methods side by side, one row each (the shape of the papers' tables).

    Args:
        reports: method name → its :class:`CalibrationReport` (rows in this order), or the
            :class:`~hf_calibration.metrics.multilabel.SigmoidCalibrationReport` of a binary / multi-label head.
        columns: report keys to show; default accuracy, ECE, AdaECE, smCE, O-ECE, U-ECE.
        average: for multi-label reports, ``"macro"`` (the mean over labels, default) or ``"micro"`` (pooled); the
            table's last line says which.

    Returns:
        a Markdown table, percentages with two decimals (``3.21 [2.40, 4.05]`` for reports made with ``ci``; an
        interval with a note gets a footnote number, and the notes follow the table).
    """
    if not isinstance(reports, Mapping) or not reports:
        raise ValueError(
            f"Expected argument `reports` to be a non-empty mapping of name → CalibrationReport, but got {reports!r}."
        )
    columns = tuple(DEFAULT_COLUMNS if columns is None else columns)
    from hf_calibration.metrics.multilabel import SigmoidCalibrationReport

    heads = {r.task if isinstance(r, SigmoidCalibrationReport) else "multiclass" for r in reports.values()}
    known = ["n"] + [name for name in list_metrics(report=True) if all(get_metric(name).in_report(h) for h in heads)]
    unknown = [c for c in columns if c not in known]
    if unknown or not columns:
        raise ValueError(f"Expected argument `columns` to hold names from {known}, but got {list(columns)}.")

    check_choice(average, "average", ("macro", "micro"))
    multilabel = any(isinstance(r, SigmoidCalibrationReport) and r.task == "multilabel" for r in reports.values())

    def value(report, column):
        if isinstance(report, SigmoidCalibrationReport):
            return (report.micro if average == "micro" else report.macro)[column]
        return report[column]

    header = ["method"] + [_header(c) for c in columns]
    notes: dict[str, int] = {}
    body = [
        [str(name)] + [_format_value(c, value(report, c), notes=notes) for c in columns]
        for name, report in reports.items()
    ]
    named: dict[str, list[str]] = {}
    for name, report in reports.items():
        for c in columns:
            cell = value(report, c)
            if (
                isinstance(cell, MetricInterval)
                and cell.note
                and f"{name} {_label(c)[0]}" not in named.get(cell.note, [])
            ):
                named.setdefault(cell.note, []).append(f"{name} {_label(c)[0]}")
    lines = markdown_table(header, body)
    if multilabel:
        lines += [
            "",
            "Multi-label: "
            + (
                "macro, the mean of the per-label values."
                if average == "macro"
                else "pooled (micro), every (sample, label) pair as one binary problem."
            ),
        ]
    return "\n".join(lines + ([""] + _footnotes(notes, named) if notes else []))
