"""How sure "which calibrator wins" is: a paired bootstrap of every method against the best.

``compare_calibrators`` ranks methods by their mean held-out score over folds, with the fold standard
deviation. The folds share samples with each other only through the fit, so that deviation says little
about whether the winner would still win on another calibration set. Here the held-out predictions of
all folds are pooled (each sample scored by the fit that did not see it), the pooled rows are resampled
(``hf_calibration.metrics.bootstrap``), and on *every* resample each method and the best are scored on
the same rows: the difference ``method - best`` has an interval (the metric's method, see ``bootstrap.INTERVALS``), and the share of resamples in
which the method scores lower says how often it would have won.

That share is counted on the resampled differences shifted so that their median is the pooled difference. A binned
metric's resamples are biased (a resample repeats rows: fewer distinct samples per bin), differently for each
method, and counted as they are, a method with a positive (worse) pooled difference "won" 62 % of resamples: the
table read as a contradiction. Centred, a positive difference never wins more than half of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_calibration._core.checks import check_choice, to_numpy
from hf_calibration._core.inputs import read_multiclass
from hf_calibration._core.rowpass import top_label
from hf_calibration.metrics.adaptive import _adaece_compute, _adaece_statistic
from hf_calibration.metrics.bootstrap import (
    INTERVALS,
    IntervalRule,
    MetricInterval,
    check_bootstrap,
    frame,
    reframed,
    weighted_means,
)
from hf_calibration.metrics.ece import _binned_statistic, _ece_compute
from hf_calibration.metrics.scores import _row_scores
from hf_calibration.metrics.smooth import _smce_statistic, smce_from_confidence

__all__ = ["PairedBootstrap", "paired_bootstrap"]

METRICS = ("ece", "adaece", "smce", "nll", "brier")  # the selection metrics of compare_calibrators


def _sigmoid_scorer(metric: str, logits: np.ndarray, labels: np.ndarray, n_bins: int):
    """``_scorer`` of a sigmoid head's pooled held-out (N, L) logits: the macro average over labels, on resamples of
    the samples (every label of a sample together)."""
    import warnings

    from hf_calibration.metrics.multilabel import _binned_statistic as binned
    from hf_calibration.metrics.multilabel import (
        _score_statistic,
        _smooth_or_adaptive_statistic,
        _values,
        prepare_sigmoid,
    )

    inputs = prepare_sigmoid(
        logits.reshape(logits.shape[0], -1),
        labels.reshape(labels.shape[0], -1),
        task="multilabel",
        from_logits=True,
        preds_name="predictions",
    )
    value = _values(inputs, metric, n_bins)[1]
    rows = np.arange(inputs.probs.shape[0])
    if metric in ("nll", "brier"):
        scores, column = _score_statistic(inputs), 0 if metric == "brier" else 1

        def statistic(counts):
            sums = scores(counts)
            with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return np.nanmean(sums[:, :, column] / sums[:, :, 2], axis=1)

        return value, statistic
    if metric == "ece":
        per_label = [binned(*inputs.label(l), rows[inputs.mask[:, l]], n_bins) for l in range(inputs.num_labels)]
        pick = lambda stat, counts: stat(counts)[:, 0]  # noqa: E731
    else:
        if not inputs.full:
            raise ValueError(
                f"Expected no ignored labels for a paired bootstrap of {metric} (its bins are re-cut per label)."
            )
        per_label = [
            _smooth_or_adaptive_statistic(metric, inputs.probs[:, l], inputs.target[:, l], n_bins)
            for l in range(inputs.num_labels)
        ]
        pick = lambda stat, counts: stat(counts)  # noqa: E731

    def statistic(counts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(np.stack([pick(stat, counts) for stat in per_label], axis=1), axis=1)

    return value, statistic


def _scorer(metric: str, logits: np.ndarray, labels: np.ndarray, n_bins: int, task: str = "multiclass"):
    """``(pooled value, counts -> (B,) resampled values)`` of one method's pooled held-out logits; the counts are
    over the rows as given (every method's rows are the same samples), gathered into this method's frame."""
    if task != "multiclass":
        return _sigmoid_scorer(metric, logits, labels, n_bins)
    inputs = read_multiclass(logits, labels, from_logits=True, ignore_index=None, preds_name="predictions")
    if metric in ("nll", "brier"):
        scores = _row_scores(inputs)[:, 0 if metric == "brier" else 1]
        means = weighted_means(scores)
        return float(scores.mean()), lambda counts: means(counts)[:, 0]
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    if metric == "ece":
        binned = _binned_statistic(conf, correct, n_bins)
        value, statistic = _ece_compute(conf, correct, n_bins), lambda counts: binned(counts)[:, 0]
    elif metric == "adaece":
        value, statistic = _adaece_compute(conf, correct, n_bins), _adaece_statistic(conf, correct, n_bins)
    else:
        value, statistic = smce_from_confidence(conf, correct), _smce_statistic(conf, correct)
    return value, reframed(statistic, frame(conf))


@dataclass(frozen=True)
class PairedBootstrap:
    """Each method against ``best`` on the pooled held-out predictions (fractions).

    ``pooled[m]``: method m's metric on all held-out predictions together, with its own interval.
    ``difference[m]``: ``pooled[m] - pooled[best]`` with the interval of the paired differences, by the metric's
    interval method (basic for the calibration errors, percentile for NLL / Brier; ``bootstrap.INTERVALS``).
    ``wins[m]``: the share of resamples in which m scores strictly lower than ``best``, the resampled differences
    shifted so that their median is the pooled difference (module docstring).
    """

    metric: str
    best: str
    pooled: dict[str, MetricInterval]
    difference: dict[str, MetricInterval]
    wins: dict[str, float]
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "best": self.best,
            "skipped": list(self.skipped),
            "methods": {
                m: {
                    "pooled": self.pooled[m].to_dict(),
                    "difference": self.difference[m].to_dict(),
                    "wins": self.wins[m],
                }
                for m in self.pooled
            },
        }

    def to_markdown(self) -> str:
        any_value = next(iter(self.pooled.values()))
        percent = self.metric not in ("nll", "brier")
        scale, digits, unit = (100.0, 2, " (pp)") if percent else (1.0, 4, "")
        lines = [
            f"Paired bootstrap against the best by {self.metric} ({self.best}): every held-out prediction pooled, "
            f"{any_value.n_boot} resamples of the rows, each method scored on the same rows "
            f"({100 * any_value.level:g} % {'basic (bias-corrected)' if any_value.method == 'basic' else any_value.method} "
            "intervals). Pooled values are not the table's means over folds, which rank the methods: a binned metric of all "
            f'predictions together is lower (more samples per bin). Δ > 0: worse than {self.best}. "beats": the share of '
            "resamples in which the method scores lower, counted on the resampled differences centred on Δ (a binned "
            "metric's resamples are biased).",
            "",
            f"| method | pooled {self.metric}{' (%)' if percent else ''} | Δ vs {self.best}{unit} | beats {self.best} in |",
            "|---|---:|---:|---:|",
        ]
        notes: dict[str, list[str]] = {}
        for method, value in self.pooled.items():
            diff = "—" if method == self.best else self.difference[method].format(scale, digits)
            wins = "—" if method == self.best else f"{100 * self.wins[method]:.1f} % of resamples"
            mark = ""
            if value.note:
                notes.setdefault(value.note, []).append(method)
                mark = f" ({list(notes).index(value.note) + 1})"
            lines.append(f"| {method} | {value.format(scale, digits)}{mark} | {diff} | {wins} |")
        if notes:
            lines += [""] + [f"({i}) {', '.join(names)}: {note}." for i, (note, names) in enumerate(notes.items(), 1)]
        if self.skipped:
            lines += ["", f"(not compared: {', '.join(self.skipped)}, which failed on some fold or were stopped early)"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()


def _centred_share_below_zero(point: float, resampled: np.ndarray) -> float:
    """The share of ``resampled`` differences below 0 once shifted so that their median is ``point``: never above one
    half when ``point >= 0`` (module docstring)."""
    resampled = np.asarray(resampled, dtype=np.float64)
    return float(np.mean(resampled - np.median(resampled) + float(point) < 0))


def paired_bootstrap(
    table: Any,
    metric: str = "ece",
    *,
    labels: Any = None,
    best: str | None = None,
    ci: float = 0.95,
    n_boot: int | None = None,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired bootstrap of every method of a ``compare_calibrators`` table against the best.

    Args:
        table: a ``CalibratorComparison`` made with ``keep_predictions=True`` (its out-of-fold logits and
            labels; ``table.paired_bootstrap(...)`` calls this).
        metric: one of ``ece``, ``adaece``, ``smce``, ``nll``, ``brier``.
        labels: the labels of the predictions (default: the ones the table kept).
        best: the reference method; default ``table.best(metric)`` (lowest mean over folds).
        ci, n_boot, seed: the bootstrap (default 0.95, 1,000 resamples, seed 0); each metric's interval as
            :mod:`hf_calibration.metrics.bootstrap` chose it (basic for ECE / AdaECE / smCE).

    Returns:
        a :class:`PairedBootstrap` (``str()`` is a Markdown table). Methods that failed on a fold, or that racing
        stopped, have no prediction for its rows and are left out (named in ``skipped``).
    """
    check_choice(metric, "metric", METRICS)
    boot = check_bootstrap(ci, n_boot, seed)
    if boot is None:
        raise ValueError("Expected argument `ci` to be a confidence level such as 0.95, but got None.")
    if not getattr(table, "predictions", None):
        raise ValueError(
            "Expected argument `table` to hold out-of-fold predictions: call compare_calibrators(..., keep_predictions=True)."
        )
    labels = getattr(table, "labels", None) if labels is None else to_numpy(labels, "labels")
    if labels is None:
        raise ValueError(
            "Expected argument `labels` (the table keeps none): the labels given to compare_calibrators, -100 rows dropped."
        )
    best = table.best(metric) if best is None else best
    if best not in table.predictions:
        raise ValueError(f"Expected argument `best` to be one of {list(table.predictions)}, but got {best!r}.")
    complete = {m: z for m, z in table.predictions.items() if np.isfinite(z).all()}
    skipped = tuple(m for m in table.predictions if m not in complete)
    if best not in complete:
        raise ValueError(
            f"Expected the best method {best!r} to have a prediction for every row, but it failed on some fold."
        )
    methods = [best] + [m for m in complete if m != best]
    n_bins = table.n_bins
    task = getattr(table, "task", "multiclass")
    scorers = {m: _scorer(metric, complete[m], labels, n_bins, task) for m in methods}
    replicates = dict(zip(methods, boot.replicates([s for _, s in scorers.values()], labels.shape[0])))
    pooled = {m: boot.interval(scorers[m][0], replicates[m], metric) for m in methods}
    # a difference has the metric's interval method, without its range (it may be negative)
    difference_rule = IntervalRule(INTERVALS[metric].method)
    difference = {
        m: boot.interval(scorers[m][0] - scorers[best][0], replicates[m] - replicates[best], difference_rule)
        for m in methods
    }
    wins = {m: _centred_share_below_zero(difference[m], replicates[m] - replicates[best]) for m in methods}
    order = [m for m in table.predictions if m in complete]  # the table's row order
    return PairedBootstrap(
        metric,
        best,
        {m: pooled[m] for m in order},
        {m: difference[m] for m in order},
        {m: wins[m] for m in order},
        skipped,
    )
