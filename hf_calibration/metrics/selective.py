"""Selective prediction: the risk–coverage curve, AURC and E-AURC (Geifman & El-Yaniv 2017; Geifman, Uziel &
El-Yaniv 2019, "Bias-reduced uncertainty estimation for deep neural classifiers", ICLR).

A selective classifier answers only when its confidence (here the top-label probability, as in the
papers) is at least a threshold ``t``. Coverage ``φ(t)`` is the fraction of samples answered, selective risk
``r(t)`` the error rate among them. Thresholds are the distinct confidence values, so tied samples are
answered together (no order among ties is invented).

**Integration.** AURC is the area under the risk–coverage step function over coverage (0, 1]: a block of
``m`` tied samples that raises the coverage from ``k/n`` to ``(k+m)/n`` contributes ``(m/n) · r`` with ``r``
the selective risk once it is answered, and the risk is held constant on (0, first coverage] (the tail
left of the first operating point has no data of its own). Without ties this is exactly Geifman et al.'s
``mean_k r(k/n)`` over the n coverages k/n of their code.

**E-AURC** = AURC - AURC*, with AURC* the AURC of the ideal ranking for the same predictions (all correct
samples ranked above all errors), computed with the same integration, so E-AURC >= 0 and is 0 for a
perfect ranking. The paper writes AURC* ≈ r̂ + (1 - r̂)·ln(1 - r̂) (r̂ the overall error), the n → ∞ limit;
``closed_form=True`` uses that instead (it can make E-AURC slightly negative at small n).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX
from hf_calibration.metrics._format import prepare, top_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class RiskCoverage(NamedTuple):
    """The risk–coverage curve at each distinct confidence threshold, thresholds descending."""

    coverage: np.ndarray  # (M,) fraction answered, increasing to 1
    risk: np.ndarray  # (M,) error rate among the answered
    threshold: np.ndarray  # (M,) confidence threshold t (answer when confidence >= t)


def _confidence_and_errors(preds, target, from_logits, ignore_index) -> tuple[np.ndarray, np.ndarray]:
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return top.confidence, 1.0 - top.correct


def _curve(confidence: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(answered count, error count, block size, threshold) at the end of each block of tied confidences."""
    order = np.argsort(-confidence, kind="mergesort")
    conf, err = confidence[order], errors[order]
    last = np.r_[np.flatnonzero(np.diff(conf)), len(conf) - 1]
    answered = last + 1
    wrong = np.cumsum(err)[last]
    return answered, wrong, np.diff(np.r_[0, answered]), conf[last]


def _aurc_from_curve(answered: np.ndarray, wrong: np.ndarray, block: np.ndarray) -> float:
    return float(np.sum(block * (wrong / answered)) / answered[-1])


def _optimal_aurc(n: int, n_errors: int) -> float:
    """AURC of the ranking with every correct sample first: risk max(0, k - (n - e)) / k at coverage k / n."""
    k = np.arange(n - n_errors + 1, n + 1, dtype=np.float64)
    return float(np.sum((k - (n - n_errors)) / k) / n)


def risk_coverage_curve(
    preds: Any, target: Any, *, from_logits: bool | None = None, ignore_index: int | None = IGNORE_INDEX
) -> RiskCoverage:
    """Coverage, selective risk and threshold at each distinct top-label confidence (thresholds descending).

    Args as :func:`hf_calibration.metrics.ece`: ``(N, K)`` logits or probabilities (``from_logits=None`` detects
    them), ``(N,)`` labels with ``ignore_index`` rows dropped.
    """
    confidence, errors = _confidence_and_errors(preds, target, from_logits, ignore_index)
    answered, wrong, _, threshold = _curve(confidence, errors)
    return RiskCoverage(answered / len(confidence), wrong / answered, threshold)


def aurc(preds: Any, target: Any, *, from_logits: bool | None = None, ignore_index: int | None = IGNORE_INDEX) -> float:
    """Area under the risk–coverage curve, in [0, 1], lower is better (integration in the module docstring).

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
        >>> round(aurc(probs, np.array([0, 1, 0, 0])), 4)  # risks 0, 1/2, 1/3, 1/4 at coverages 1/4 ... 1
        0.2708
    """
    confidence, errors = _confidence_and_errors(preds, target, from_logits, ignore_index)
    answered, wrong, block, _ = _curve(confidence, errors)
    return _aurc_from_curve(answered, wrong, block)


def eaurc(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    closed_form: bool = False,
) -> float:
    """Excess AURC: ``AURC - AURC*`` (Geifman et al. 2019), the part of AURC due to the ranking, not the error rate.

    ``closed_form=False`` (default) takes the exact AURC* of the ideal ranking at this N; ``True`` the paper's
    ``r̂ + (1 - r̂)·ln(1 - r̂)``.

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
        >>> round(eaurc(probs, np.array([0, 1, 0, 0])), 4)  # 0.2708 - (1/4)·(1/4)
        0.2083
    """
    if not isinstance(closed_form, bool):
        raise TypeError(f"Expected argument `closed_form` to be a bool, but got {closed_form!r}.")
    confidence, errors = _confidence_and_errors(preds, target, from_logits, ignore_index)
    answered, wrong, block, _ = _curve(confidence, errors)
    value = _aurc_from_curve(answered, wrong, block)
    n, n_errors = len(errors), int(errors.sum())
    if closed_form:
        r = n_errors / n
        return value - (r + (1 - r) * np.log1p(-r) if r < 1 else 1.0)
    return value - _optimal_aurc(n, n_errors)


def risk_coverage_plot(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    label: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Plot selective risk against coverage (matplotlib), with AURC / E-AURC in the legend and the optimal curve dashed.

    Draws on ``ax`` when given (to overlay several models), else on a new ``matplotlib.figure.Figure``
    (no pyplot). Returns the figure: ``fig.savefig("risk_coverage.png")``.
    """
    from matplotlib.figure import Figure

    confidence, errors = _confidence_and_errors(preds, target, from_logits, ignore_index)
    answered, wrong, block, _ = _curve(confidence, errors)
    n, n_errors = len(errors), int(errors.sum())
    value = _aurc_from_curve(answered, wrong, block)
    if ax is None:
        fig = Figure(figsize=(4.5, 3.6), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    coverage, risk = answered / n, wrong / answered
    text = f"AURC {100 * value:.2f} %, E-AURC {100 * (value - _optimal_aurc(n, n_errors)):.2f} %"
    ax.step(np.r_[0, coverage], np.r_[risk[0], risk], where="pre", label=f"{label}: {text}" if label else text)
    k = np.arange(1, n + 1)
    ax.plot(
        k / n,
        np.maximum(0, k - (n - n_errors)) / k,
        "k--",
        lw=0.8,
        label="optimal ranking" if not ax.get_legend() else None,
    )
    ax.set(xlabel="coverage", ylabel="selective risk (error rate)", xlim=(0, 1), ylim=(0, None), title="Risk–coverage")
    ax.legend(fontsize="small")
    return fig
