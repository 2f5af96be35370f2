"""The cross-validated comparison that ``compare_calibrators``, ``AutoCalibrator`` and their sigmoid-head twins share:
the candidates' per-fold scores (:class:`MethodScores`), the comparison table and its choice
(:class:`CalibratorComparison`), racing and the rule that keeps a choice from leaving the model worse
(:mod:`hf_calibration.calibrators.selection.auto` says what each does)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hf_calibration._core.checks import check_choice, check_float
from hf_calibration.calibrators._machinery.registry import get_calibrator_class, list_calibrators
from hf_calibration.metrics.report import markdown_table

UNCALIBRATED = "uncalibrated"
# column -> (printed label, percent?) ; lower is better for all but accuracy_change
COLUMNS: dict[str, tuple[str, bool]] = {
    "accuracy_change": ("Δ accuracy (pp)", True),
    "ece": ("ECE (%)", True),
    "adaece": ("AdaECE (%)", True),
    "smce": ("smCE (%)", True),
    "nll": ("NLL", False),
    "brier": ("Brier", False),
    "fit_seconds": ("fit (s)", False),
}
SELECTION_METRICS = ("ece", "adaece", "smce", "nll", "brier")
# the candidates of methods="default": see the module docstring (and benchmarks/RESULTS.md, "Choosing a calibrator")
DEFAULT_METHODS = ("temperature_scaling", "vector_scaling", "ets", "smart", "spline", "histogram_binning", "isotonic")
# a binary or multi-label (sigmoid) head: every sigmoid calibrator (each fit is a fraction of a second)
SIGMOID_DEFAULT_METHODS = (
    "sigmoid_temperature_scaling",
    "platt",
    "beta",
    "sigmoid_isotonic",
    "sigmoid_histogram_binning",
)
# one-sided paired t-test level of a racing stop: chosen on the seven shared files' validation folds, where 0.95 stopped
# the eventual choice early on 2 of 7 files (two folds alike by chance) and 0.99 changed no choice for any metric
RACE_CONFIDENCE = 0.99
RACE_MIN_FOLDS = 2  # no stop before this many folds (a t-test needs two)
# one-sided paired t-test level at which a candidate's held-out NLL gain over the uncalibrated model counts (per-sample
# differences, every out-of-fold prediction pooled): chosen on the small-sample configurations of
# benchmarks/small_sample_selection.py (validation draws only), where it left no configuration worse than uncalibrated
SIGNIFICANCE = 0.95
# ... by at least this share of the uncalibrated model's NLL: a map that leaves all but a few held-out predictions as
# they were (histogram binning on 40 samples) passed the test on those few, then changed many more once refitted on 50
MIN_RELATIVE_GAIN = 1e-3
# fewer misclassified samples than this in the calibration set and no candidate qualifies: the NLL of a sharper model is
# decided by errors the sample does not show (K = 2, N = 20, no error: temperature scaling sharpened the model, each
# held-out NLL fell, and the test NLL went from 0.15 to 1.23)
MIN_ERRORS = 5
# the non-parametric maps of the top-label confidence (binning, isotonic regression, splines) and the flexible parametric
# ones (SMART, PTS: tens of parameters, a non-convex fit; Calibrator.held_out_check) are candidates only on at least this
# many samples. At 100 they passed the t-test and made the test NLL worse (K = 2, logits 3x too flat: spline
# 0.537 -> 0.968, isotonic 0.534 -> 0.872 at N = 150, SMART 0.521 -> 0.524): 6 of 96 synthetic validation
# configurations (K = 2 / 10, N = 100 / 150, logits 3x too confident or too flat) ended worse than uncalibrated with the
# non-parametric maps' threshold at 100 and none for SMART / PTS, 0 with 200 for both, and the mean test-NLL gain
# rose from 0.225 to 0.338
NONPARAMETRIC = frozenset(
    {"histogram_binning", "isotonic", "isotonic_ovr", "spline", "sigmoid_histogram_binning", "sigmoid_isotonic"}
)
MIN_NONPARAMETRIC_SAMPLES = 200


def _smooth(method: str) -> bool:
    """Whether a registered method's map is smooth (``Calibrator.smooth``); the uncalibrated model counts as smooth."""
    if method == UNCALIBRATED:
        return True
    try:
        return bool(get_calibrator_class(method).smooth)
    except (KeyError, ValueError):
        return True


def _flexible(method: str) -> bool:
    """Whether a registered method is a flexible parametric map (``Calibrator.held_out_check``: SMART, PTS)."""
    try:
        return bool(get_calibrator_class(method).held_out_check)
    except (KeyError, ValueError):
        return False


def is_stochastic(method: str) -> bool:
    """Whether a registered method's fit depends on a seed: its constructor takes ``seed``."""
    return "seed" in inspect.signature(get_calibrator_class(method)).parameters


def _method_specs(methods: Any, task: str | None = "multiclass") -> dict[str, dict[str, Any]]:
    """``"default"`` / ``"all"`` / a name / names / ``{name: constructor kwargs}`` -> ``{name: kwargs}`` (names checked
    against the calibrators of ``task``'s head: softmax ones for ``"multiclass"``, sigmoid ones otherwise; None: any)."""
    available = list_calibrators(task)
    default = DEFAULT_METHODS if task == "multiclass" else SIGMOID_DEFAULT_METHODS
    if isinstance(methods, str):
        groups = {"all": available, "default": [m for m in default if m in available]}
        specs = {name: {} for name in groups.get(methods, [methods])}
    elif isinstance(methods, Mapping):
        specs = {}
        for name, kwargs in methods.items():
            if kwargs is not None and not isinstance(kwargs, Mapping):
                raise TypeError(
                    f"Expected argument `methods` to map names to constructor kwargs (dicts), but {name!r} maps to {kwargs!r}."
                )
            specs[name] = dict(kwargs or {})
    elif isinstance(methods, Sequence) and all(isinstance(m, str) for m in methods):
        specs = {name: {} for name in methods}
    else:
        raise TypeError(
            f"Expected argument `methods` to be 'default', 'all', a method name, a list of names or a dict name -> kwargs, but got {methods!r}."
        )
    if not specs:
        raise ValueError("Expected argument `methods` to name at least one calibrator, but got none.")
    for name in specs:
        if name in list_calibrators() and name not in available:
            head = "softmax" if task == "multiclass" else "sigmoid"
            raise ValueError(
                f"Expected argument `methods` to name {head} calibrators for this {task} head ({available}), but "
                f"{name!r} calibrates a {'sigmoid' if head == 'softmax' else 'softmax'} head (see the model's "
                "config.problem_type, or pass task=)."
            )
        if name not in available:
            raise ValueError(
                f"Expected argument `methods` to hold names from {available} (or 'default' / 'all'), but got {name!r}."
            )
    return specs


def method_names(methods: Any) -> list[str]:
    """The candidate names ``methods`` stands for (``"default"``, ``"all"``, names, or a dict), in table order."""
    return list(_method_specs(methods))


def _scores(calibrated: np.ndarray, z: np.ndarray, y: np.ndarray, n_bins: int) -> dict[str, float]:
    from hf_calibration.metrics import adaece, brier, ece, nll, smce

    return {
        "accuracy_change": float((calibrated.argmax(1) == y).mean() - (z.argmax(1) == y).mean()),
        "ece": ece(calibrated, y, n_bins, from_logits=True),
        "adaece": adaece(calibrated, y, n_bins, from_logits=True),
        "smce": smce(calibrated, y, from_logits=True),
        "nll": nll(calibrated, y, from_logits=True),
        "brier": brier(calibrated, y, from_logits=True),
    }


def clearly_worse(values: np.ndarray, reference: np.ndarray, confidence: float = RACE_CONFIDENCE) -> bool:
    """Whether ``values`` (one per fold) are larger than ``reference`` (the same folds) by a one-sided paired t-test
    at ``confidence``; needs two folds. Equal differences on every fold count as clear when positive."""
    from scipy.stats import t

    diff = np.asarray(values, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if diff.size < 2 or not np.isfinite(diff).all() or diff.mean() <= 0:
        return False
    spread = diff.std(ddof=1)
    return spread == 0 or diff.mean() / (spread / math.sqrt(diff.size)) > t.ppf(confidence, diff.size - 1)


def within_one_standard_error(values: np.ndarray, reference: np.ndarray) -> bool:
    """Whether ``values`` (one per fold) exceed ``reference`` (the same folds) on average by at most one standard error
    of the paired differences."""
    diff = np.asarray(values, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    spread = diff.std(ddof=1) / math.sqrt(diff.size) if diff.size > 1 else 0.0
    return bool(diff.mean() <= spread)


@dataclass
class MethodScores:
    """One method's cross-validated scores: one value per fold it fitted on (``fold_ids``), the folds it failed on,
    why racing stopped it (None if it ran every fold), and each sample's held-out NLL (``sample_nll``: NaN on the rows
    of folds it did not run; None for a table built by hand)."""

    method: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    folds: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    errors: list[str] = field(default_factory=list)
    fit_seeds: int = 1
    fold_ids: list[int] = field(default_factory=list)
    stopped: str | None = None
    sample_nll: np.ndarray | None = None

    def mean(self, column: str) -> float:
        values = self.folds[column]
        return float(np.mean(values)) if values else math.nan

    def std(self, column: str) -> float:
        values = self.folds[column]
        return float(np.std(values, ddof=1)) if len(values) > 1 else (0.0 if values else math.nan)

    def on_folds(self, column: str, fold_ids: Sequence[int]) -> np.ndarray:
        """This method's ``column`` on the given folds (which it must have run), for paired comparisons."""
        where = {fold: i for i, fold in enumerate(self.fold_ids)}
        return np.array([self.folds[column][where[f]] for f in fold_ids], dtype=np.float64)

    def add_fold(
        self, fold: int, values: Mapping[str, float], rows: np.ndarray | None = None, nll: np.ndarray | None = None
    ) -> None:
        """Record a fold's scores; ``rows`` (the fold's sample indices) and ``nll`` (their held-out NLL) fill
        ``sample_nll``, allocated for ``num_samples`` rows at the first call."""
        self.fold_ids.append(fold)
        for column in COLUMNS:
            self.folds[column].append(float(values[column]))
        if self.sample_nll is not None and rows is not None:
            self.sample_nll[rows] = nll


class CalibratorComparison:
    """The table ``compare_calibrators`` returns: prints as Markdown, converts to a dict or to flat rows.

    ``str(table)`` is the table (percent with two decimals, as the papers print; the selection metric and NLL
    first); ``table.to_dict()`` is ``{method: {column: {"mean", "std"}, "failed_folds", "errors", "folds_run",
    "stopped", ...}}`` (fractions, JSON-ready); ``table.rows()`` is one flat dict per method
    (``pandas.DataFrame(table.rows())`` works); ``table.best("ece")`` is the method ``AutoCalibrator`` would
    choose; ``table.predictions[method]`` holds each sample's calibrated logits from the fold that held it out
    (when asked for; NaN on folds a method did not run).
    """

    def __init__(
        self,
        scores: dict[str, MethodScores],
        *,
        cv: int,
        seed: int,
        n_bins: int,
        num_samples: int,
        num_classes: int,
        predictions: dict[str, np.ndarray] | None = None,
        labels: np.ndarray | None = None,
        metric: str = "ece",
        task: str = "multiclass",
        num_errors: int | None = None,
    ):
        self.scores = scores
        self.num_errors = (
            num_errors  # misclassified samples of the calibration set (None: unknown, a table built by hand)
        )
        self.cv, self.seed, self.n_bins = cv, seed, n_bins
        self.num_samples, self.num_classes = num_samples, num_classes
        self.task = task
        self.predictions = predictions or {}
        self.labels = labels  # the labels of `predictions` (kept with them)
        self.metric = check_choice(metric, "metric", SELECTION_METRICS)

    def paired_bootstrap(self, metric: str = "ece", **kwargs: Any):
        """How sure the winner is: each method against the best on the pooled held-out predictions, paired
        resamples (needs ``keep_predictions=True``); see :func:`hf_calibration.calibrators.selection.paired.paired_bootstrap`."""
        from hf_calibration.calibrators.selection.paired import paired_bootstrap

        return paired_bootstrap(self, metric, **kwargs)

    @property
    def methods(self) -> list[str]:
        return list(self.scores)

    def __getitem__(self, method: str) -> MethodScores:
        return self.scores[method]

    def nll_gain_is_significant(self, method: str, confidence: float = SIGNIFICANCE) -> bool:
        """Whether ``method``'s held-out NLL is lower than the uncalibrated model's by a one-sided paired t-test at
        ``confidence``: on the per-sample differences of the pooled out-of-fold predictions where the table has them
        (``compare_calibrators`` keeps them), else on the fold means (a table built by hand)."""
        s, reference = self.scores[method], self.scores.get(UNCALIBRATED)
        if reference is None:
            return True
        if s.sample_nll is not None and reference.sample_nll is not None and np.isfinite(s.sample_nll).all():
            ours, theirs = s.sample_nll, reference.sample_nll
        else:
            ours, theirs = s.on_folds("nll", s.fold_ids), reference.on_folds("nll", s.fold_ids)
        return bool(
            clearly_worse(theirs, ours, confidence)
            and theirs.mean() - ours.mean() >= MIN_RELATIVE_GAIN * abs(theirs.mean())
        )

    def exclusions(self, metric: str | None = None, max_accuracy_drop: float = 0.0) -> dict[str, str]:
        """Why each method that cannot be chosen is out: a non-parametric or flexible (SMART, PTS) map on fewer than
        ``MIN_NONPARAMETRIC_SAMPLES`` samples, failed, stopped by racing, a cross-validated NLL not
        significantly lower than the uncalibrated model's (``nll_gain_is_significant``), or an accuracy loss beyond
        ``max_accuracy_drop`` (a fraction)."""
        metric = check_choice(self.metric if metric is None else metric, "metric", SELECTION_METRICS)
        max_accuracy_drop = check_float(max_accuracy_drop, "max_accuracy_drop", minimum=0.0, maximum=1.0)
        reference = self.scores.get(UNCALIBRATED)
        out = {}
        for name, s in self.scores.items():
            if name == UNCALIBRATED:
                continue
            few = self.num_samples is not None and self.num_samples < MIN_NONPARAMETRIC_SAMPLES
            if few and name in NONPARAMETRIC:
                out[name] = (
                    f"a non-parametric map needs at least {MIN_NONPARAMETRIC_SAMPLES} calibration samples, "
                    f"and this set holds {self.num_samples}"
                )
            elif s.errors:
                out[name] = f"failed on {len(s.errors)}/{self.cv} folds"
            elif s.stopped is not None:
                out[name] = f"stopped after {len(s.fold_ids)}/{self.cv} folds: {s.stopped}"
            elif len(s.fold_ids) < self.cv:
                out[name] = f"ran {len(s.fold_ids)}/{self.cv} folds"
            elif few and _flexible(name):
                out[name] = (
                    f"a map of tens of parameters needs at least {MIN_NONPARAMETRIC_SAMPLES} calibration samples to be "
                    f"chosen, and this set holds {self.num_samples}"
                )
            elif not math.isfinite(s.mean(metric)):
                out[name] = f"no finite {metric}"
            elif reference is not None and s.mean("nll") > reference.mean("nll"):
                out[name] = (
                    f"cross-validated NLL {s.mean('nll'):.4f} is worse than the uncalibrated model's {reference.mean('nll'):.4f}"
                )
            elif reference is not None and not self.nll_gain_is_significant(name):
                out[name] = (
                    f"cross-validated NLL {s.mean('nll'):.4f} is not significantly lower than the uncalibrated model's "
                    f"{reference.mean('nll'):.4f} (one-sided paired t-test at {SIGNIFICANCE:g} on {self._test_unit(s)}, "
                    f"and a gain of at least {100 * MIN_RELATIVE_GAIN:g} %)"
                )
            elif s.mean("accuracy_change") < -max_accuracy_drop - 1e-12:
                out[name] = (
                    f"loses {-100 * s.mean('accuracy_change'):.2f} accuracy points (max_accuracy_drop={max_accuracy_drop})"
                )
        return out

    @staticmethod
    def _test_unit(s: MethodScores) -> str:
        return "per-sample held-out NLL" if s.sample_nll is not None else f"{len(s.fold_ids)} fold means"

    def best(self, metric: str | None = None, max_accuracy_drop: float = 0.0, tie_break: str | None = "nll") -> str:
        """The calibrator ``AutoCalibrator`` chooses, or ``"uncalibrated"`` (``decide`` says why).

        The candidates are the qualifying methods (``exclusions``: those that ran every fold without failing, whose
        held-out NLL is significantly lower than the uncalibrated model's whatever the metric, and whose mean
        accuracy change is at least ``-max_accuracy_drop``, a fraction) and the uncalibrated model itself; the one
        with the lowest mean held-out ``metric`` (default: the comparison's ``metric``) leads.

        Within noise, the proper score decides (``tie_break``, default ``"nll"``; None: off): the candidates whose
        mean ``metric`` exceeds the lowest by at most one standard error of their paired fold differences are tied
        with it, and the one with the lowest mean ``tie_break`` among them is chosen (the one-standard-error rule of
        Breiman et al. 1984 / Hastie et al., ESL Sec. 7.10, with NLL in place of simplicity). A binned metric on a
        held-out fold is noisy (ECE's fold-to-fold spread on 1,000 samples is ~0.5-1 point), and on the shared
        logits a top-label map often led ECE within that noise at a far worse NLL (DenseNet-BC CIFAR-100: spline
        2.87 % ECE, NLL 1.010; vector scaling 3.31 %, NLL 0.864). The uncalibrated model, whose NLL is the worst of
        the candidates, thus wins only where it is better on ``metric`` beyond one standard error. On a sigmoid head
        (binary, multi-label) a flat map (``Calibrator.smooth`` is False: binning, isotonic regression) is chosen only
        when it leads every smooth qualifying map beyond that standard error; else the smooth one with the lowest
        ``tie_break`` among the tied is. Ties of the final key: the first listed."""
        return self.decide(metric, max_accuracy_drop, tie_break)[0]

    def decide(
        self, metric: str | None = None, max_accuracy_drop: float = 0.0, tie_break: str | None = "nll"
    ) -> tuple[str, str | None]:
        """``(best(...), why)``: ``why`` says, in a sentence, why the choice is ``"uncalibrated"`` (None otherwise)."""
        metric = check_choice(self.metric if metric is None else metric, "metric", SELECTION_METRICS)
        if tie_break is not None:
            tie_break = check_choice(tie_break, "tie_break", SELECTION_METRICS)
        if self.num_errors is not None and self.num_errors < MIN_ERRORS:
            return UNCALIBRATED, (
                f"the calibration set holds {self.num_errors} misclassified sample(s), fewer than the {MIN_ERRORS} "
                "needed to judge any calibrator (how confident the model may be is decided by its errors, "
                "which this sample does not show)"
            )
        excluded = self.exclusions(metric, max_accuracy_drop)
        candidates = [s for name, s in self.scores.items() if name != UNCALIBRATED and name not in excluded]
        if not candidates:
            reasons = "; ".join(f"{name}: {why}" for name, why in excluded.items())
            return UNCALIBRATED, f"no candidate qualified ({reasons})"
        if UNCALIBRATED in self.scores:
            candidates.append(self.scores[UNCALIBRATED])
        leader = min(candidates, key=lambda s: s.mean(metric))
        tied = [
            s
            for s in candidates
            if within_one_standard_error(s.on_folds(metric, leader.fold_ids), leader.on_folds(metric, leader.fold_ids))
        ]
        chosen = leader if tie_break is None or tie_break == metric else min(tied, key=lambda s: s.mean(tie_break))
        if self.task in ("binary", "multilabel") and not _smooth(chosen.method):
            # a sigmoid head's flat map (binning, isotonic regression) only when it leads every smooth map beyond one
            # standard error: its ties cost ranking and its steps move with the sample (cat vs dog: histogram binning
            # chosen on 2 of 3 seeds, test ECE and NLL above Platt's)
            smooth = [s for s in tied if s.method != UNCALIBRATED and _smooth(s.method)]
            if smooth:
                chosen = min(smooth, key=lambda s: s.mean(tie_break or metric))
        if chosen.method != UNCALIBRATED:
            return chosen.method, None
        qualified = ", ".join(s.method for s in candidates if s.method != UNCALIBRATED)
        return UNCALIBRATED, (
            f"the uncalibrated model's cross-validated {metric} ({self._cell(chosen, metric)}) is lower than that of "
            f"every qualifying candidate ({qualified}) by more than one standard error"
        )

    def to_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if not math.isfinite(x) else x

        out: dict[str, Any] = {}
        for name, s in self.scores.items():
            entry: dict[str, Any] = {c: {"mean": clean(s.mean(c)), "std": clean(s.std(c))} for c in COLUMNS}
            entry.update(
                failed_folds=len(s.errors),
                errors=list(s.errors),
                fit_seeds=s.fit_seeds,
                kwargs=dict(s.kwargs),
                folds_run=len(s.fold_ids),
                stopped=s.stopped,
            )
            out[name] = entry
        return out

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, entry in self.to_dict().items():
            row: dict[str, Any] = {"method": name}
            for c in COLUMNS:
                row[f"{c}_mean"], row[f"{c}_std"] = entry[c]["mean"], entry[c]["std"]
            row["failed_folds"] = entry["failed_folds"]
            row["error"] = entry["errors"][0] if entry["errors"] else None
            row["folds_run"], row["stopped"] = entry["folds_run"], entry["stopped"]
            rows.append(row)
        return rows

    def columns(self) -> list[str]:
        """The table's columns in print order: the selection metric, NLL beside it, then the others."""
        first = [self.metric] + (["nll"] if self.metric != "nll" else [])
        return first + [c for c in COLUMNS if c not in first]

    def _cell(self, s: MethodScores, column: str) -> str:
        mean, std = s.mean(column), s.std(column)
        if not math.isfinite(mean):
            return "failed" if s.errors else "-"
        scale, digits = (100.0, 2) if COLUMNS[column][1] else (1.0, 3 if column == "fit_seconds" else 4)
        return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"

    def _folds_cell(self, s: MethodScores) -> str:
        if s.errors:
            return f"{len(s.errors)}/{self.cv} failed"
        return f"{len(s.fold_ids)}/{self.cv}" + (" stopped" if s.stopped is not None else "")

    def rule(self, metric: str | None = None) -> str:
        """The selection rule, in words (printed under the table)."""
        metric = self.metric if metric is None else metric
        if metric == "nll":
            return "nll"
        return f"{metric}, the lowest NLL within one standard error of the lowest {metric}"

    def to_markdown(self) -> str:
        columns = self.columns()
        header = ["method"] + [COLUMNS[c][0] for c in columns] + ["folds"]
        body = [[name] + [self._cell(s, c) for c in columns] + [self._folds_cell(s)] for name, s in self.scores.items()]
        seeds = sorted({s.fit_seeds for s in self.scores.values() if s.fit_seeds > 1})
        lines = [
            f"{self.cv}-fold cross-validation on the calibration set (N = {self.num_samples}, "
            + (
                f"K = {self.num_classes}, "
                if self.task == "multiclass"
                else f"{self.task} head, L = {self.num_classes} label(s); ECE, AdaECE, smCE, NLL (binary cross-entropy), Brier and "
                "accuracy at 0.5 are macro averages over the labels, "
            )
            + f"seed {self.seed}), scored on the held-out folds ({self.n_bins} bins): mean ± std over the folds each method ran"
            + (f"; seeded methods averaged over {seeds[0]} fit seeds" if seeds else "")
            + ".",
            "",
            *markdown_table(header, body),
        ]
        notes = [(name, e) for name, s in self.scores.items() for e in s.errors]
        notes += [
            (name, f"stopped after {len(s.fold_ids)}/{self.cv} folds: {s.stopped}")
            for name, s in self.scores.items()
            if s.stopped is not None and not s.errors
        ]
        if notes:
            lines += [""] + [f"- {name}: {note}" for name, note in notes]
        chosen, why = self.decide()
        lines += ["", f"best by {self.rule()}: {chosen}" + (f" ({why})" if why else "")]
        lines += [
            f"- not a candidate: {name}: {reason}"
            for name, reason in self.exclusions().items()
            if not self.scores[name].errors and self.scores[name].stopped is None
        ]
        lines += [
            "",
            "Candidates qualify only with a held-out NLL significantly lower than the uncalibrated model's "
            f"(one-sided paired t-test at {SIGNIFICANCE:g} on each sample's out-of-fold NLL, a gain of at least "
            f"{100 * MIN_RELATIVE_GAIN:g} %, at least {MIN_ERRORS} misclassified samples in the set, and {MIN_NONPARAMETRIC_SAMPLES} "
            "samples for a non-parametric map); the columns are "
            "means over the folds, which rank the methods (a binned metric of all held-out predictions pooled is "
            "lower: more samples per bin).",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return f"CalibratorComparison(methods={self.methods}, cv={self.cv}, seed={self.seed}, num_samples={self.num_samples})"


def _race(scores: dict[str, MethodScores], running: list[str], metric: str, done: list[int]) -> dict[str, str]:
    """The running candidates to stop after the folds ``done``: failed ones, those whose NLL is clearly worse than the
    uncalibrated model's, and those clearly worse than the leader on ``metric`` (``clearly_worse``) without a lower
    mean NLL than the leader's."""
    stop = {name: "failed on a fold" for name in running if scores[name].errors}
    if len(done) < RACE_MIN_FOLDS:
        return stop
    reference = scores[UNCALIBRATED].on_folds("nll", done)
    for name in running:
        if name not in stop and clearly_worse(scores[name].on_folds("nll", done), reference):
            stop[name] = f"its NLL is clearly worse than the uncalibrated model's (paired t-test, {len(done)} folds)"
    contenders = [
        name for name in running if name not in stop and scores[name].mean("nll") <= scores[UNCALIBRATED].mean("nll")
    ]
    if not contenders:
        return stop
    leader = min(contenders, key=lambda name: scores[name].mean(metric))
    best = scores[leader].on_folds(metric, done)
    for name in running:
        if (
            name not in stop
            and name != leader
            and scores[name].mean("nll") >= scores[leader].mean("nll")
            and clearly_worse(scores[name].on_folds(metric, done), best)
        ):
            stop[name] = f"clearly worse than {leader} on {metric} (paired t-test, {len(done)} folds)"
    return stop
