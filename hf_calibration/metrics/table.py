"""The metric table: every calibration metric declared once.

A row (:class:`Metric`) gives a metric's name, its public function, the head types it supports, whether it is binned
(takes ``n_bins``), its bootstrap interval (:class:`IntervalRule`), the state a streaming accumulator keeps for it and
its display name. ``calibration_report`` and its binary / multi-label form, the bootstrap intervals, both accumulators,
the shift report and the ``evaluate`` metric script read this table, so a new metric is its function plus one
:func:`register_metric` call (and its tests)::

    register_metric(Metric("gap", my_gap, "Gap", point=lambda p, a, n_bins: float(abs((a - p).mean()))))

``point`` is the metric's value from top-label confidences ``p`` and correctness ``a`` (and ``n_bins``); a binary or
multi-label head's per-label value is the same function of each label's probability and 0/1 label (Guo et al. 2017,
eq. 3 applied per label, as torchmetrics' ``BinaryCalibrationError``). A metric with a ``point`` form needs no other
code to appear in the report, its intervals (a generic bootstrap of ``point``) and the accumulators (from the kept
``(p, a)`` pairs). The package's own fused passes (one softmax pass for the binned errors, one probability pass for
classwise ECE, Brier and NLL) stay where they are; the table says which metrics they serve.

This module sits at the bottom of ``hf_calibration.metrics``: functions are named by ``"module:attribute"`` and
imported when first used, so every metric module can read the table without an import cycle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HEADS",
    "STATES",
    "IntervalRule",
    "Metric",
    "get_metric",
    "list_metrics",
    "register_metric",
    "unregister_metric",
]

HEADS = ("multiclass", "binary", "multilabel")
# what a streaming accumulator keeps for a metric: the 3·B top-label bin sums; every (confidence, correct) pair; the
# streamed probability rows (classwise sums, Brier / NLL sums); nothing (not streamed)
STATES = ("bins", "pairs", "probabilities", "none")
_METHODS = ("basic", "basic_plugin", "percentile", "none")
_SMOOTH_N_BOOT = 200  # bootstrap.SMOOTH_N_BOOT: resamples that cost a sweep or a bandwidth search each


@dataclass(frozen=True)
class IntervalRule:
    """How a metric's interval is formed: ``method`` (``"basic"``, ``"basic_plugin"``, ``"percentile"`` or
    ``"none"``), the metric's range ``[floor, ceiling]`` the ends are clipped to, and, for ``"none"``, ``reason``."""

    method: str
    floor: float | None = None
    ceiling: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.method not in _METHODS:
            raise ValueError(f"Expected argument `method` to be one of {list(_METHODS)}, but got {self.method!r}.")


ERROR = IntervalRule("basic", 0.0, 1.0)  # a calibration error: the basic (bias-corrected) bootstrap, in [0, 1]
_MCE_REASON = (
    "MCE is a maximum over bins: its bootstrap is inconsistent when several bins are near the maximum "
    "(Andrews 2000), which the data cannot rule out, so no interval is given"
)


def _resolve(ref: Callable | str | None) -> Callable | None:
    if ref is None or callable(ref):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Metric:
    """One row of the metric table.

    Args:
        name: the key in reports, results and ``evaluate`` outputs (``"ece"``).
        function: the public function ``(preds, target, ...)``, or ``"module:attribute"``; None for a metric with no
            function of its own (accuracy).
        label: the display name in printed tables (``"ECE"``).
        percent: printed in percent (a calibration error) rather than as a plain number (Brier, NLL).
        heads: the head types the function supports (``HEADS``).
        binned: the metric takes ``n_bins``.
        interval: its bootstrap interval (chosen by the coverage measured in ``benchmarks/bootstrap_coverage.py``).
        state: what a streaming accumulator keeps for it (``STATES``).
        point: ``(p, a, n_bins) -> float`` from top-label confidences and correctness, or None where the metric needs
            more than those (Brier, NLL, classwise ECE).
        sigmoid_point: ``(p, y, n_bins, log_p, log_q) -> float`` of one label of a sigmoid head, where it is not
            ``point`` of ``(p, y)`` (accuracy at 0.5, Brier, binary cross-entropy).
        report_heads: the heads whose ``calibration_report`` shows it (default ``heads``; ``()``: none).
        sigmoid_label: the display name in a sigmoid head's report, where it differs.
        n_boot: the default number of resamples of its interval.
    """

    name: str
    function: Callable[..., Any] | str | None
    label: str
    percent: bool = True
    heads: tuple[str, ...] = HEADS
    binned: bool = True
    interval: IntervalRule = ERROR
    state: str = "pairs"
    point: Callable[..., float] | str | None = None
    sigmoid_point: Callable[..., float] | str | None = None
    report_heads: tuple[str, ...] | None = None
    sigmoid_label: str | None = None
    n_boot: int = 1000

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Expected argument `name` to be an identifier such as 'ece', but got {self.name!r}.")
        unknown = [h for h in self.heads if h not in HEADS]
        if not self.heads or unknown:
            raise ValueError(f"Expected argument `heads` to hold names from {list(HEADS)}, but got {self.heads!r}.")
        if self.state not in STATES:
            raise ValueError(f"Expected argument `state` to be one of {list(STATES)}, but got {self.state!r}.")
        if self.state == "pairs" and self.point is None:
            raise ValueError(
                f"Expected argument `point` for metric {self.name!r}: state='pairs' computes it from them."
            )
        if not isinstance(self.interval, IntervalRule):
            raise TypeError(f"Expected argument `interval` to be an IntervalRule, but got {self.interval!r}.")

    @property
    def fn(self) -> Callable[..., Any] | None:
        """The public function."""
        return _resolve(self.function)

    def top_label(self, p: Any, a: Any, n_bins: int) -> float:
        """The value from top-label confidences ``p`` and correctness ``a``."""
        return float(_resolve(self.point)(p, a, n_bins))

    def per_label(self, p: Any, y: Any, n_bins: int, log_p: Any, log_q: Any) -> float:
        """The value of one label of a sigmoid head (probabilities ``p``, 0/1 labels ``y``)."""
        if self.sigmoid_point is not None:
            return float(_resolve(self.sigmoid_point)(p, y, n_bins, log_p, log_q))
        return self.top_label(p, y, n_bins)

    def in_report(self, head: str) -> bool:
        return head in (self.heads if self.report_heads is None else self.report_heads)

    def display(self, head: str = "multiclass") -> str:
        return self.sigmoid_label if head != "multiclass" and self.sigmoid_label else self.label


_M = "hf_calibration.metrics."
_P = _M + "_points:"  # the point forms
_B = _M + "_binned:"
_MULTICLASS = dict(heads=("multiclass",), report_heads=HEADS)  # one multi-class function; every head's report
_SMOOTH = dict(_MULTICLASS, binned=False, n_boot=_SMOOTH_N_BOOT)  # a resample costs a sweep or a bandwidth search
_SCORE = dict(percent=False, binned=False, state="probabilities")
# fmt: off
_ROWS = [  # in the order reports print them
    Metric("accuracy", None, "Accuracy", binned=False, interval=IntervalRule("percentile", 0.0, 1.0), state="bins",
           point=_P + "accuracy", sigmoid_point=_P + "accuracy_at_half", sigmoid_label="Accuracy (p > 0.5)"),
    Metric("ece", _M + "ece:ece", "ECE", state="bins", point=_B + "_ece_compute", sigmoid_point=_P + "binary_ece"),
    Metric("adaece", _M + "adaptive:adaece", "AdaECE", point=_B + "_adaece_compute"),
    Metric("mce", _M + "ece:mce", "MCE", interval=IntervalRule("none", reason=_MCE_REASON), state="bins",
           point=_B + "_mce_compute", sigmoid_point=_P + "binary_mce"),
    Metric("rmsce", _M + "ece:rmsce", "RMSCE", state="none", point=_P + "rmsce", report_heads=("binary", "multilabel")),
    Metric("classwise_ece", _M + "ece:classwise_ece", "Classwise ECE", heads=("multiclass",), state="probabilities",
           n_boot=_SMOOTH_N_BOOT),  # a resample costs O(N·K)
    Metric("o_ece", None, "O-ECE", state="bins", point=_P + "o_ece", **_MULTICLASS),  # both from ece_split
    Metric("u_ece", None, "U-ECE", state="bins", point=_P + "u_ece", **_MULTICLASS),
    Metric("smce", _M + "smooth:smce", "smCE", point=_P + "smce", **_SMOOTH),
    Metric("smece", _M + "smooth:smece", "smECE", point=_P + "smece", **_SMOOTH),
    Metric("brier", _M + "scores:brier", "Brier", interval=IntervalRule("percentile", 0.0, 2.0),
           sigmoid_point=_P + "binary_brier", **_SCORE),
    Metric("nll", _M + "scores:nll", "NLL", interval=IntervalRule("percentile", 0.0), sigmoid_point=_P + "binary_nll",
           sigmoid_label="NLL (BCE)", **_SCORE),
    Metric("debiased_ece", _M + "debiased:debiased_ece", "Debiased ECE", heads=("multiclass",),
           interval=IntervalRule("basic_plugin", 0.0, 1.0), state="none", report_heads=()),
]
# fmt: on
_BUILTIN = frozenset(row.name for row in _ROWS)
_TABLE: dict[str, Metric] = {row.name: row for row in _ROWS}


def register_metric(metric: Metric, *, replace_existing: bool = False) -> Metric:
    """Add ``metric`` to the table (after the package's own rows); ``replace_existing=True`` replaces a row of the
    same name that a user registered (the package's own rows cannot be replaced)."""
    if not isinstance(metric, Metric):
        raise TypeError(f"Expected argument `metric` to be a Metric, but got {type(metric).__name__}.")
    if metric.name in _BUILTIN or (metric.name in _TABLE and not replace_existing):
        raise ValueError(f"Expected argument `metric` to have a new name, but {metric.name!r} is already registered.")
    if metric.state not in ("pairs", "none"):
        raise ValueError(
            f"Expected argument `metric` to have state 'pairs' (computed from the kept (confidence, correct) pairs) "
            f"or 'none', but got {metric.state!r}: the other states are the package's fused passes."
        )
    if metric.point is None and (metric.in_report("multiclass") or metric.state != "none"):
        raise ValueError(
            f"Expected argument `metric` to have a `point` form, which the report and the accumulators compute it "
            f"from, or report_heads=() and state='none', but {metric.name!r} has none."
        )
    _TABLE[metric.name] = metric
    return metric


def unregister_metric(name: str) -> None:
    """Remove a metric added with :func:`register_metric`."""
    if name in _BUILTIN or name not in _TABLE:
        raise ValueError(f"Expected argument `name` to be a registered user metric, but got {name!r}.")
    del _TABLE[name]


def get_metric(name: str) -> Metric:
    """The row of metric ``name``."""
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"Expected argument `name` to be one of {list(_TABLE)}, but got {name!r}.") from None


def list_metrics(*, head: str | None = None, report: bool = False, state: str | None = None) -> tuple[str, ...]:
    """Names of the table's metrics in report order: those supporting ``head``, shown by its report (``report``),
    or kept as ``state`` by an accumulator."""
    rows = _TABLE.values()
    if head is not None:
        rows = [r for r in rows if (r.in_report(head) if report else head in r.heads)]
    elif report:
        rows = [r for r in rows if any(r.in_report(h) for h in HEADS)]
    if state is not None:
        rows = [r for r in rows if r.state == state]
    return tuple(r.name for r in rows)
