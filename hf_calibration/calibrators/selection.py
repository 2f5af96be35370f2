"""Choosing a calibrator: cross-validate the candidates on the calibration set, then refit the best.

``compare_calibrators`` splits the calibration set (only that set: the test set stays untouched) into ``cv``
stratified folds (``_cv.stratified_folds``, one split that every candidate shares), fits each candidate on
``cv - 1`` folds and scores it on the held-out fold: change in accuracy, ECE, AdaECE (15 bins), smCE, NLL, Brier,
and the fit time. The logits are checked and shifted to their row maxima once; the folds are visited in turn,
every remaining candidate fitted on each. Methods whose fit depends on a seed (their constructor takes ``seed``)
are fitted ``fit_seeds`` times per fold (default once) and their scores averaged within the fold. A method that
fails on a fold (too few samples, a numerical failure) is reported in the table with its error, never raised.
The table reports mean and sample standard deviation over the folds each method ran.

Racing (``race=True``, the default; Maron & Moore 1994, "The racing algorithm"; Birattari et al. 2002, F-race,
whose paired t-test variant this is): from the second fold on, a candidate stops when a one-sided paired t-test
over the folds so far (99 %) finds its NLL worse than the uncalibrated model's (it could never be chosen), or finds
it worse than the leader on the selection metric while its mean NLL is no better than the leader's (a lower NLL
could still win the tie-break of ``CalibratorComparison.best``), or once it has failed on a fold. The table keeps
its rows from the folds it ran and says why it stopped. On the seven shared files racing chose what a full run
chooses, for each of the five metrics (at 95 % it stopped the eventual choice on 2 of 7 files).

The default candidates (``DEFAULT_METHODS``) leave out the registered methods that cost the most: matrix and
Dirichlet scaling (each fit runs its own 5-fold cross-validation of lambda: 1.4-1.8 s a fold at K = 100 on this
project's idle 2-core machine, 4-8 s a fold on a busy one), PTS (an MLP, 1-2 s a fold), CTS (a per-class grid search, 1.5 s a fold at K = 100, the
worst NLL of the temperature family there; never chosen) and one-vs-rest isotonic regression (never chosen, and it
can change the predicted class). Cross-validating every method on the seven shared benchmark files (5,000
validation logits each, metric ECE, the rule of ``CalibratorComparison.best``), the full set chose matrix scaling
or PTS on 4 files; the default set's choice there was within 0.006 of its cross-validated NLL and 0.13 points of
its cross-validated ECE (``benchmarks/RESULTS.md``, "Choosing a calibrator: AutoCalibrator before and after").
``methods="all"`` (or their names) includes them.

``AutoCalibrator`` picks a method by ``CalibratorComparison.best`` (see there), refits it on the whole calibration set
and then behaves as that calibrator: it saves as that method (``load_calibrator`` gives the method's own class back)
with the cross-validation table in its config (``fit["selection"]``) and model card.

The rule that keeps a choice from leaving the model worse than it was (shared with
``CalibrationTrainer(calibrate_on_eval=...)``, which applies it to its one calibrator):

* what the sample supports: the calibration set must hold at least ``MIN_ERRORS`` misclassified samples, else no
  candidate qualifies (how confident the model may be is decided by errors, and a sample without them cannot tell);
* a candidate qualifies only if its held-out NLL is *significantly* lower than the uncalibrated model's: by a one-sided
  paired t-test at ``SIGNIFICANCE`` on the per-sample differences of the pooled out-of-fold predictions (each sample
  scored by the fit that did not see it), and by at least ``MIN_RELATIVE_GAIN`` of the uncalibrated NLL. A mean lower
  by chance is not enough: on small configurations (K = 2 or 10, N = 20 to 200) the rule "mean held-out NLL no worse"
  chose calibrators that made the test NLL worse on about a third of them (spline at K = 2, N = 50: 0.648 -> 2.430),
  because at that size the cross-validated NLL is mostly noise (``benchmarks/RESULTS.md``, "Small calibration sets");
* the uncalibrated model competes on the selection metric like a candidate: where its held-out ECE (say) is lower
  than every qualifying candidate's beyond one standard error, the model is left as it is.

When the choice is ``"uncalibrated"``, ``AutoCalibrator`` warns (``UncalibratedWarning``) and the table's text says
why. No rule computed from the sample can see that the sample itself is unrepresentative: the benchmark's residual
cases are listed there.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .. import _progress
from .._checks import check_choice, check_float, check_int, resolve_from_logits
from ..metrics._format import validate
from ._base import NotFittedError, UncalibratedWarning, _labels_of
from ._cv import stratified_folds
from ._held_out import held_out_checked
from ._registry import create_calibrator, get_calibrator_class, list_calibrators
from ._threads import torch_single_threaded

logger = logging.getLogger(__name__)

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
SIGMOID_DEFAULT_METHODS = ("sigmoid_temperature_scaling", "platt", "beta", "sigmoid_isotonic", "sigmoid_histogram_binning")
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
# the non-parametric maps of the top-label confidence (binning, isotonic regression, splines) are candidates only on at
# least this many samples: below it histogram binning's 50 samples a bin leave fewer than two bins, and isotonic
# regression, chosen on 50 samples at K = 10, made the test NLL worse (2.163 -> 2.184) while passing the t-test
NONPARAMETRIC = frozenset({"histogram_binning", "isotonic", "isotonic_ovr", "spline", "sigmoid_histogram_binning", "sigmoid_isotonic"})
MIN_NONPARAMETRIC_SAMPLES = 100


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
                raise TypeError(f"Expected argument `methods` to map names to constructor kwargs (dicts), but {name!r} maps to {kwargs!r}.")
            specs[name] = dict(kwargs or {})
    elif isinstance(methods, Sequence) and all(isinstance(m, str) for m in methods):
        specs = {name: {} for name in methods}
    else:
        raise TypeError(f"Expected argument `methods` to be 'default', 'all', a method name, a list of names or a dict name -> kwargs, but got {methods!r}.")
    if not specs:
        raise ValueError("Expected argument `methods` to name at least one calibrator, but got none.")
    for name in specs:
        if name in list_calibrators() and name not in available:
            head = "softmax" if task == "multiclass" else "sigmoid"
            raise ValueError(f"Expected argument `methods` to name {head} calibrators for this {task} head ({available}), but "
                             f"{name!r} calibrates a {'sigmoid' if head == 'softmax' else 'softmax'} head (see the model's "
                             "config.problem_type, or pass task=).")
        if name not in available:
            raise ValueError(f"Expected argument `methods` to hold names from {available} (or 'default' / 'all'), but got {name!r}.")
    return specs


def method_names(methods: Any) -> list[str]:
    """The candidate names ``methods`` stands for (``"default"``, ``"all"``, names, or a dict), in table order."""
    return list(_method_specs(methods))


def sample_nll(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's negative log-likelihood of its label under ``softmax(logits)`` (float64, shape (N,))."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=1, keepdims=True)
    log_partition = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
    return log_partition - z[np.arange(z.shape[0]), labels]


def _scores(calibrated: np.ndarray, z: np.ndarray, y: np.ndarray, n_bins: int) -> dict[str, float]:
    from ..metrics import adaece, brier, ece, nll, smce

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

    def add_fold(self, fold: int, values: Mapping[str, float], rows: np.ndarray | None = None, nll: np.ndarray | None = None) -> None:
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

    def __init__(self, scores: dict[str, MethodScores], *, cv: int, seed: int, n_bins: int, num_samples: int,
                 num_classes: int, predictions: dict[str, np.ndarray] | None = None, labels: np.ndarray | None = None,
                 metric: str = "ece", task: str = "multiclass", num_errors: int | None = None):
        self.scores = scores
        self.num_errors = num_errors  # misclassified samples of the calibration set (None: unknown, a table built by hand)
        self.cv, self.seed, self.n_bins = cv, seed, n_bins
        self.num_samples, self.num_classes = num_samples, num_classes
        self.task = task
        self.predictions = predictions or {}
        self.labels = labels  # the labels of `predictions` (kept with them)
        self.metric = check_choice(metric, "metric", SELECTION_METRICS)

    def paired_bootstrap(self, metric: str = "ece", **kwargs: Any):
        """How sure the winner is: each method against the best on the pooled held-out predictions, paired
        resamples (needs ``keep_predictions=True``); see :func:`hf_calibration.calibrators.paired.paired_bootstrap`."""
        from .paired import paired_bootstrap

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
        return bool(clearly_worse(theirs, ours, confidence) and theirs.mean() - ours.mean() >= MIN_RELATIVE_GAIN * abs(theirs.mean()))

    def exclusions(self, metric: str | None = None, max_accuracy_drop: float = 0.0) -> dict[str, str]:
        """Why each method that cannot be chosen is out: a non-parametric map on fewer than
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
            if name in NONPARAMETRIC and self.num_samples is not None and self.num_samples < MIN_NONPARAMETRIC_SAMPLES:
                out[name] = (f"a non-parametric map needs at least {MIN_NONPARAMETRIC_SAMPLES} calibration samples, "
                             f"and this set holds {self.num_samples}")
            elif s.errors:
                out[name] = f"failed on {len(s.errors)}/{self.cv} folds"
            elif s.stopped is not None:
                out[name] = f"stopped after {len(s.fold_ids)}/{self.cv} folds: {s.stopped}"
            elif len(s.fold_ids) < self.cv:
                out[name] = f"ran {len(s.fold_ids)}/{self.cv} folds"
            elif not math.isfinite(s.mean(metric)):
                out[name] = f"no finite {metric}"
            elif reference is not None and s.mean("nll") > reference.mean("nll"):
                out[name] = f"cross-validated NLL {s.mean('nll'):.4f} is worse than the uncalibrated model's {reference.mean('nll'):.4f}"
            elif reference is not None and not self.nll_gain_is_significant(name):
                out[name] = (f"cross-validated NLL {s.mean('nll'):.4f} is not significantly lower than the uncalibrated model's "
                             f"{reference.mean('nll'):.4f} (one-sided paired t-test at {SIGNIFICANCE:g} on {self._test_unit(s)}, "
                             f"and a gain of at least {100 * MIN_RELATIVE_GAIN:g} %)")
            elif s.mean("accuracy_change") < -max_accuracy_drop - 1e-12:
                out[name] = f"loses {-100 * s.mean('accuracy_change'):.2f} accuracy points (max_accuracy_drop={max_accuracy_drop})"
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
        the candidates, thus wins only where it is better on ``metric`` beyond one standard error. Ties of the final
        key: the first listed."""
        return self.decide(metric, max_accuracy_drop, tie_break)[0]

    def decide(self, metric: str | None = None, max_accuracy_drop: float = 0.0, tie_break: str | None = "nll") -> tuple[str, str | None]:
        """``(best(...), why)``: ``why`` says, in a sentence, why the choice is ``"uncalibrated"`` (None otherwise)."""
        metric = check_choice(self.metric if metric is None else metric, "metric", SELECTION_METRICS)
        if tie_break is not None:
            tie_break = check_choice(tie_break, "tie_break", SELECTION_METRICS)
        if self.num_errors is not None and self.num_errors < MIN_ERRORS:
            return UNCALIBRATED, (f"the calibration set holds {self.num_errors} misclassified sample(s), fewer than the {MIN_ERRORS} "
                                  "needed to judge any calibrator (how confident the model may be is decided by its errors, "
                                  "which this sample does not show)")
        excluded = self.exclusions(metric, max_accuracy_drop)
        candidates = [s for name, s in self.scores.items() if name != UNCALIBRATED and name not in excluded]
        if not candidates:
            reasons = "; ".join(f"{name}: {why}" for name, why in excluded.items())
            return UNCALIBRATED, f"no candidate qualified ({reasons})"
        if UNCALIBRATED in self.scores:
            candidates.append(self.scores[UNCALIBRATED])
        leader = min(candidates, key=lambda s: s.mean(metric))
        if tie_break is None or tie_break == metric:
            chosen = leader
        else:
            tied = [s for s in candidates if within_one_standard_error(s.on_folds(metric, leader.fold_ids), leader.on_folds(metric, leader.fold_ids))]
            chosen = min(tied, key=lambda s: s.mean(tie_break))
        if chosen.method != UNCALIBRATED:
            return chosen.method, None
        qualified = ", ".join(s.method for s in candidates if s.method != UNCALIBRATED)
        return UNCALIBRATED, (f"the uncalibrated model's cross-validated {metric} ({self._cell(chosen, metric)}) is lower than that of "
                              f"every qualifying candidate ({qualified}) by more than one standard error")

    def to_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if not math.isfinite(x) else x

        out: dict[str, Any] = {}
        for name, s in self.scores.items():
            entry: dict[str, Any] = {c: {"mean": clean(s.mean(c)), "std": clean(s.std(c))} for c in COLUMNS}
            entry.update(failed_folds=len(s.errors), errors=list(s.errors), fit_seeds=s.fit_seeds, kwargs=dict(s.kwargs),
                         folds_run=len(s.fold_ids), stopped=s.stopped)
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
        widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

        rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
        seeds = sorted({s.fit_seeds for s in self.scores.values() if s.fit_seeds > 1})
        lines = [
            f"{self.cv}-fold cross-validation on the calibration set (N = {self.num_samples}, "
            + (f"K = {self.num_classes}, " if self.task == "multiclass" else
               f"{self.task} head, L = {self.num_classes} label(s); ECE, AdaECE, smCE, NLL (binary cross-entropy), Brier and "
               "accuracy at 0.5 are macro averages over the labels, ")
            + 
            f"seed {self.seed}), scored on the held-out folds ({self.n_bins} bins): mean ± std over the folds each method ran"
            + (f"; seeded methods averaged over {seeds[0]} fit seeds" if seeds else "") + ".",
            "",
            line(header),
            rule,
        ] + [line(row) for row in body]
        notes = [(name, e) for name, s in self.scores.items() for e in s.errors]
        notes += [(name, f"stopped after {len(s.fold_ids)}/{self.cv} folds: {s.stopped}") for name, s in self.scores.items()
                  if s.stopped is not None and not s.errors]
        if notes:
            lines += [""] + [f"- {name}: {note}" for name, note in notes]
        chosen, why = self.decide()
        lines += ["", f"best by {self.rule()}: {chosen}" + (f" ({why})" if why else "")]
        lines += [f"- not a candidate: {name}: {reason}" for name, reason in self.exclusions().items()
                  if not self.scores[name].errors and self.scores[name].stopped is None]
        lines += ["", "Candidates qualify only with a held-out NLL significantly lower than the uncalibrated model's "
                  f"(one-sided paired t-test at {SIGNIFICANCE:g} on each sample's out-of-fold NLL, a gain of at least "
                  f"{100 * MIN_RELATIVE_GAIN:g} %, at least {MIN_ERRORS} misclassified samples in the set, and {MIN_NONPARAMETRIC_SAMPLES} "
                  "samples for a non-parametric map); the columns are "
                  "means over the folds, which rank the methods (a binned metric of all held-out predictions pooled is "
                  "lower: more samples per bin)."]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return f"CalibratorComparison(methods={self.methods}, cv={self.cv}, seed={self.seed}, num_samples={self.num_samples})"


def _as_logits(logits: Any, labels: Any, from_logits: bool | None) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 logits (probabilities become log-probabilities) and int64 labels, ignored rows dropped."""
    logits, labels = _labels_of(logits, labels)
    z, y = validate(logits, labels, preds_name="logits", target_name="labels")
    z = np.asarray(z, dtype=np.float64)
    if not resolve_from_logits(z, from_logits, "logits"):
        z = np.log(np.maximum(z, np.finfo(np.float64).tiny))  # log-probabilities: the same softmax
    bad = ~np.isfinite(z).all(axis=1)
    if bad.any():
        raise ValueError(f"Expected `logits` to be finite, but row {int(np.flatnonzero(bad)[0])} contains NaN or inf.")
    return np.ascontiguousarray(z), y


def _fit_and_score(name: str, kwargs: dict, seeds: list, z: np.ndarray, zc: np.ndarray, y: np.ndarray, train: np.ndarray,
                   val: np.ndarray, n_bins: int) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """Fit ``name`` on ``train`` once per fit seed (``[None]``: unseeded) and score it on ``val``: the scores averaged
    over the seeds, the first seed's calibrated held-out logits, and each held-out sample's NLL (averaged over the
    seeds). ``z`` is checked and ``zc`` is ``z`` with its row maxima at 0 (what ``Calibrator._fit_inputs`` would make
    of it), so the fit skips ``Calibrator.fit``'s checks and its fit-set report."""
    runs, first, nlls = [], None, []
    for fit_seed in seeds:
        calibrator = create_calibrator(name, **kwargs, **({} if fit_seed is None else {"seed": fit_seed}))
        objective, options = calibrator._resolve_objective(None, {})
        start = time.perf_counter()
        calibrator._fit_checked(zc[train], y[train], objective, options, False, report=False)
        elapsed = time.perf_counter() - start
        with torch.no_grad(), torch_single_threaded():
            calibrated = calibrator(torch.from_numpy(z[val]), from_logits=True).numpy()
        runs.append({**_scores(calibrated, z[val], y[val], n_bins), "fit_seconds": elapsed})
        nlls.append(sample_nll(calibrated, y[val]))
        first = calibrated if first is None else first
    return {column: float(np.mean([run[column] for run in runs])) for column in COLUMNS}, first, np.mean(nlls, axis=0)


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
    contenders = [name for name in running if name not in stop and scores[name].mean("nll") <= scores[UNCALIBRATED].mean("nll")]
    if not contenders:
        return stop
    leader = min(contenders, key=lambda name: scores[name].mean(metric))
    best = scores[leader].on_folds(metric, done)
    for name in running:
        if (name not in stop and name != leader and scores[name].mean("nll") >= scores[leader].mean("nll")
                and clearly_worse(scores[name].on_folds(metric, done), best)):
            stop[name] = f"clearly worse than {leader} on {metric} (paired t-test, {len(done)} folds)"
    return stop


def sigmoid_task_of(logits: Any, labels: Any, task: str | None) -> str | None:
    """``"binary"`` / ``"multilabel"`` when the calibration data (or ``task``) is a sigmoid head's, None for a softmax one:
    an explicit ``task`` wins; ``(N, L)`` labels with ``L > 1`` are multi-label; one logit column is binary (two softmax
    logits are a softmax head unless ``task="binary"``)."""
    from ..tasks import check_task

    if task is not None:
        return None if check_task(task) == "multiclass" else task
    shape_y = tuple(np.shape(labels)) if labels is not None else ()
    shape_z = tuple(getattr(logits, "shape", np.shape(logits)))
    if len(shape_y) == 2 and shape_y[1] > 1:
        return "multilabel"
    if len(shape_z) == 1 or (len(shape_z) == 2 and shape_z[1] == 1):
        return "binary"
    return None


def identity_calibrator(logits: Any, labels: Any, from_logits: bool | None, reason: str, *, who: str, task: str | None = None):
    """A temperature scaling fixed at T = 1 (the identity map) with the fit record of ``logits`` (a sigmoid head's
    ``task``: ``SigmoidTemperatureScaling`` at T = 1); an ``UncalibratedWarning`` says that ``who``
    (``"AutoCalibrator"``, ...) leaves the model as it is, and why."""
    from .temperature import TemperatureScaling

    if task is not None:
        from .sigmoid_selection import sigmoid_identity

        identity = sigmoid_identity(logits, labels, from_logits, task, reason)
        warnings.warn(f"{who} leaves every prediction uncalibrated (as the model gave them): {reason}.",
                      UncalibratedWarning, stacklevel=3)
        return identity
    identity = TemperatureScaling()
    z, y, is_logits = identity._fit_inputs(logits, labels, from_logits)
    identity.fit_info_ = {"task": "multiclass", "objective": "identity", "objective_options": {}, "input": "logits" if is_logits else "probabilities",
                          "num_samples": int(z.shape[0]), "num_classes": int(z.shape[1]), "temperature": 1.0}
    identity.fit_info_.update(identity._fit_set_report(z, y)[0])
    identity.fit_info_["uncalibrated"] = {"classes": "all", "reason": reason}
    warnings.warn(f"{who} leaves every prediction uncalibrated (as the model gave them): {reason}.",
                  UncalibratedWarning, stacklevel=3)
    return identity


def compare_calibrators(
    logits: Any,
    labels: Any = None,
    methods: str | Sequence[str] | Mapping[str, Mapping[str, Any]] = "default",
    cv: int = 5,
    seed: int = 0,
    *,
    metric: str = "ece",
    race: bool = True,
    fit_seeds: int = 1,
    n_bins: int = 15,
    from_logits: bool | None = None,
    keep_predictions: bool = False,
    progress_bar: bool = True,
    task: str | None = None,
) -> CalibratorComparison:
    """Cross-validate calibrators on the calibration set only (see the module docstring).

    Args:
        logits: (N, K) calibration-set logits (or probabilities), or a transformers ``PredictionOutput``.
        labels: (N,) integer labels; -100 rows are dropped.
        methods: ``"default"`` (``DEFAULT_METHODS``), ``"all"`` (every registered calibrator,
            ``list_calibrators()``), one name, a list of names, or a dict ``{name: constructor kwargs}``.
        cv: number of stratified folds (>= 2).
        seed: seed of the fold split (and the first fit seed).
        metric: the selection metric: what racing compares, the table's first column and ``table.best()``'s default.
        race: stop candidates that cannot win (module docstring); False runs every candidate on every fold.
        fit_seeds: fits per fold, seeds ``seed, seed + 1, ...``, for methods whose constructor takes ``seed``
            (unless the kwargs fix it); their fold scores are the means over these fits.
        n_bins: bins of ECE and AdaECE.
        from_logits: None detects probabilities (rows in [0, 1] summing to 1), which are turned into
            log-probabilities; True/False forces.
        keep_predictions: keep every method's out-of-fold calibrated logits (first fit seed) in
            ``table.predictions`` (N x K float64 each; rows of folds it failed on or did not run are NaN).
        progress_bar: a tqdm bar over methods x folds.
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``; None reads it from the shapes
            (:func:`hf_calibration.tasks.resolve_task`). A binary or multi-label head compares the sigmoid calibrators
            (``"default"``: ``SIGMOID_DEFAULT_METHODS``, every one of them), scored by the macro averages over labels
            (:mod:`hf_calibration.calibrators.sigmoid_selection`).

    Returns:
        a ``CalibratorComparison``; its first row, ``"uncalibrated"``, is the model itself.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (1000,), generator=g)
        >>> logits = 3 * torch.randn(1000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> table = compare_calibrators(logits, labels, ["temperature_scaling", "isotonic"], progress_bar=False)
        >>> table.methods
        ['uncalibrated', 'temperature_scaling', 'isotonic']
        >>> table["temperature_scaling"].mean("ece") < table["uncalibrated"].mean("ece")
        True
    """
    logits, labels = _labels_of(logits, labels)
    sigmoid = sigmoid_task_of(logits, labels, task)
    if sigmoid is not None:
        from .sigmoid_selection import compare_sigmoid_calibrators

        return compare_sigmoid_calibrators(logits, labels, methods, cv, seed, metric=metric, race=race, fit_seeds=fit_seeds,
                                           n_bins=n_bins, from_logits=from_logits, keep_predictions=keep_predictions,
                                           progress_bar=progress_bar, task=sigmoid)
    specs = _method_specs(methods)
    cv = check_int(cv, "cv", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    metric = check_choice(metric, "metric", SELECTION_METRICS)
    fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
    n_bins = check_int(n_bins, "n_bins", minimum=1)
    for name, flag in (("race", race), ("keep_predictions", keep_predictions), ("progress_bar", progress_bar)):
        if not isinstance(flag, bool):
            raise TypeError(f"Expected argument `{name}` to be a bool, but got {flag!r}.")
    z, y = _as_logits(logits, labels, from_logits)
    folds = stratified_folds(y, cv=cv, seed=seed)
    zc = np.ascontiguousarray(z - z.max(axis=1, keepdims=True))  # what every calibrator fits on (Calibrator._fit_inputs)

    def unscored() -> np.ndarray:
        return np.full(z.shape[0], np.nan)

    scores = {UNCALIBRATED: MethodScores(UNCALIBRATED, sample_nll=unscored())}
    for fold, (_, val) in enumerate(folds):
        scores[UNCALIBRATED].add_fold(fold, {**_scores(z[val], z[val], y[val], n_bins), "fit_seconds": 0.0}, val, sample_nll(z[val], y[val]))
    predictions = {UNCALIBRATED: z} if keep_predictions else None
    seeds = {name: [seed + i for i in range(fit_seeds)] if is_stochastic(name) and "seed" not in kwargs else [None]
             for name, kwargs in specs.items()}
    for name, kwargs in specs.items():
        scores[name] = MethodScores(name, kwargs, fit_seeds=len(seeds[name]), sample_nll=unscored())
        if keep_predictions:
            predictions[name] = np.full_like(z, np.nan)

    running = list(specs)
    with _progress.progress_bar(total=len(specs) * cv, desc="compare_calibrators", enabled=progress_bar) as bar:
        for fold, (train, val) in enumerate(folds):
            for name in running:
                bar.set_postfix_str(f"{name}, fold {fold + 1}/{cv}", refresh=False)
                try:
                    values, calibrated, held_out_nll = _fit_and_score(name, specs[name], seeds[name], z, zc, y, train, val, n_bins)
                except Exception as err:  # noqa: BLE001 - a method that fails is a row of the table, not a crash
                    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
                    scores[name].errors.append(f"fold {fold + 1}: {type(err).__name__}: {message}")
                    logger.warning("compare_calibrators: %s failed on fold %d/%d: %s", name, fold + 1, cv, err)
                else:
                    scores[name].add_fold(fold, values, val, held_out_nll)
                    if keep_predictions:
                        predictions[name][val] = calibrated
                bar.update(1)
            if race and fold + 1 < cv:
                for name, why in _race(scores, running, metric, list(range(fold + 1))).items():
                    scores[name].stopped = why
                    running.remove(name)
                    bar.total -= cv - fold - 1
                    logger.info("compare_calibrators: %s stopped after fold %d/%d: %s", name, fold + 1, cv, why)
    return CalibratorComparison(scores, cv=cv, seed=seed, n_bins=n_bins, num_samples=int(z.shape[0]),
                                num_classes=int(z.shape[1]), predictions=predictions, labels=y if keep_predictions else None,
                                metric=metric, num_errors=int((z.argmax(axis=1) != y).sum()))


class AutoCalibrator:
    """Pick the calibrator with the best cross-validated score, refit it on the whole calibration set.

    After ``fit``, an ``AutoCalibrator`` behaves as the chosen calibrator (``__call__``, ``predict_proba``,
    ``attach``, ``temperature`` where it has one, ...): ``calibrator_`` is that calibrator, ``method_`` its
    name, ``comparison_`` the ``CalibratorComparison``. ``save_pretrained`` / ``push_to_hub`` save it as that
    method, with the selection (metric, folds, the whole table) in its config's ``fit["selection"]`` and the
    table in its model card; ``AutoCalibrator.from_pretrained`` (like ``load_calibrator``) returns the method's
    own class.

    Args:
        metric: what "best" means: ``"ece"`` (default), ``"adaece"``, ``"smce"``, ``"nll"`` or ``"brier"``,
            the mean over the held-out folds. Whatever the metric, a method whose held-out NLL is not significantly
            lower than the uncalibrated model's is never chosen, and the uncalibrated model competes on the metric
            (``CalibratorComparison.best``; the module docstring).
        cv: number of folds.
        methods: candidates, as in ``compare_calibrators`` (default ``"default"``: ``DEFAULT_METHODS``; ``"all"``
            adds matrix and Dirichlet scaling, PTS, CTS and one-vs-rest isotonic regression).
        seed: seed of the folds and of the refit of a seeded method.
        fit_seeds: fits per fold of a seeded method (scores averaged).
        max_accuracy_drop: a method whose mean cross-validated accuracy change is below ``-max_accuracy_drop``
            (a fraction; default 0: it must not lose accuracy on average) is not a candidate.
        n_bins: bins of ECE and AdaECE.
        race: stop candidates that cannot win after each fold (``compare_calibrators``); False runs them all.
        tie_break: among the candidates within one standard error of the lowest ``metric``, the lowest mean of this
            one wins (default ``"nll"``; None: the lowest ``metric`` alone; ``CalibratorComparison.best``).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (1000,), generator=g)
        >>> logits = 3 * torch.randn(1000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> auto = AutoCalibrator(methods=["temperature_scaling", "isotonic"]).fit(logits, labels, progress_bar=False)
        >>> auto.method_ in ("temperature_scaling", "isotonic"), auto(logits).shape
        (True, torch.Size([1000, 5]))
    """

    def __init__(self, metric: str = "ece", cv: int = 5, methods: Any = "default", seed: int = 0, fit_seeds: int = 1,
                 max_accuracy_drop: float = 0.0, n_bins: int = 15, race: bool = True, tie_break: str | None = "nll"):
        self.metric = check_choice(metric, "metric", SELECTION_METRICS)
        self.cv = check_int(cv, "cv", minimum=2)
        self.methods = methods
        _method_specs(methods, None)  # bad names fail here, not after a long comparison (the head's kind: at fit)
        self.seed = check_int(seed, "seed", minimum=0)
        self.fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
        self.max_accuracy_drop = check_float(max_accuracy_drop, "max_accuracy_drop", minimum=0.0, maximum=1.0)
        self.n_bins = check_int(n_bins, "n_bins", minimum=1)
        if not isinstance(race, bool):
            raise TypeError(f"Expected argument `race` to be a bool, but got {race!r}.")
        self.race = race
        self.tie_break = None if tie_break is None else check_choice(tie_break, "tie_break", SELECTION_METRICS)
        self.calibrator_ = None
        self.method_: str | None = None
        self.reason_: str | None = None  # why the choice is "uncalibrated" (None otherwise)
        self.comparison_: CalibratorComparison | None = None

    def fit(self, logits: Any, labels: Any = None, *, from_logits: bool | None = None, progress_bar: bool = True,
            task: str | None = None) -> "AutoCalibrator":
        """Cross-validate the candidates on ``(logits, labels)``, then refit the best on all of it. Returns ``self``.

        ``logits`` may be probabilities (``from_logits=None`` detects them, as every calibrator does). When no
        candidate qualifies (none lowers the cross-validated NLL significantly, or every one failed), or the
        uncalibrated model is better on ``metric`` beyond noise, the model is left as it is: ``method_`` is
        ``"uncalibrated"``, ``reason_`` says why, ``calibrator_`` is a temperature scaling fixed at T = 1 (the identity,
        so that it saves, loads and attaches as any calibrator), and an ``UncalibratedWarning`` says why.
        """
        logits, labels = _labels_of(logits, labels)
        sigmoid = sigmoid_task_of(logits, labels, task)
        self.comparison_ = compare_calibrators(logits, labels, self.methods, self.cv, self.seed, metric=self.metric, race=self.race,
                                               fit_seeds=self.fit_seeds, n_bins=self.n_bins, from_logits=from_logits,
                                               progress_bar=progress_bar, task=task)
        self.method_, self.reason_ = self.comparison_.decide(self.metric, self.max_accuracy_drop, self.tie_break)
        if self.method_ == UNCALIBRATED:
            calibrator = identity_calibrator(logits, labels, from_logits, self.reason_, who="AutoCalibrator", task=sigmoid)
        else:
            kwargs = dict(self.comparison_[self.method_].kwargs)
            if is_stochastic(self.method_):
                kwargs.setdefault("seed", self.seed)
            logger.info("AutoCalibrator: %s is the best by cross-validated %s; refitting it on all %d samples.",
                        self.method_, self.metric, self.comparison_.num_samples)
            extra = {} if sigmoid is None else {"task": sigmoid}
            with held_out_checked():  # the cross-validation above is its held-out check
                calibrator = create_calibrator(self.method_, **kwargs).fit(logits, labels, from_logits=from_logits,
                                                                           progress_bar=progress_bar, **extra)
        calibrator.fit_info_["selection"] = self.selection()
        self.calibrator_ = calibrator
        return self

    def selection(self) -> dict[str, Any]:
        """How the method was chosen: the settings, the chosen method and the whole table (JSON-ready)."""
        self._check_fitted()
        return {"chosen": self.method_, "reason": self.reason_, "significance": SIGNIFICANCE, "metric": self.metric, "cv": self.cv,
                "seed": self.seed, "fit_seeds": self.fit_seeds,
                "max_accuracy_drop": self.max_accuracy_drop, "n_bins": self.n_bins, "race": self.race, "tie_break": self.tie_break,
                "excluded": self.comparison_.exclusions(self.metric, self.max_accuracy_drop), "table": self.comparison_.to_dict()}

    def _check_fitted(self) -> None:
        if self.comparison_ is None:
            raise NotFittedError("This AutoCalibrator is not fitted yet: call fit(logits, labels) first.")

    def _card_section(self) -> str:
        if self.method_ == UNCALIBRATED:
            chosen = f"no calibrator: {self.reason_}, so the model is left as it is (temperature scaling fixed at T = 1)"
        else:
            qualifying = ("the candidates that ran every fold with a held-out NLL significantly lower than the uncalibrated "
                          "model's (and the uncalibrated model)")
            if self.tie_break and self.tie_break != self.metric:
                chosen = (f"among {qualifying}, those within one standard error of the lowest mean held-out {self.metric} "
                          f"tie, and `{self.method_}` has the lowest mean held-out {self.tie_break} of them")
            else:
                chosen = f"`{self.method_}` has the lowest mean held-out {self.metric} among {qualifying}"
        return f"Chosen by `AutoCalibrator(metric={self.metric!r}, cv={self.cv})`: {chosen}.\n\n{self.comparison_.to_markdown()}"

    def _with_card(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        self._check_fitted()
        card = dict(kwargs.pop("model_card_kwargs", None) or {})
        card.setdefault("selection", self._card_section())
        return {**kwargs, "model_card_kwargs": card}

    def save_pretrained(self, save_directory, **kwargs: Any):
        """Save the chosen calibrator (its own checkpoint format), the selection table in its card."""
        kwargs = self._with_card(kwargs)
        return self.calibrator_.save_pretrained(save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs: Any):
        """Push the chosen calibrator (``Calibrator.push_to_hub`` arguments), the selection table in its card."""
        kwargs = self._with_card(kwargs)
        return self.calibrator_.push_to_hub(repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs: Any):
        """Load a saved choice: the chosen method's own class (as ``load_calibrator``)."""
        from ..hub import load_calibrator

        return load_calibrator(pretrained_model_name_or_path, **kwargs)

    def __call__(self, logits: Any, **kwargs: Any) -> torch.Tensor:
        self._check_fitted()
        return self.calibrator_(logits, **kwargs)

    def __getattr__(self, name: str):
        # only reached for names this object lacks: those of the chosen calibrator (kind, predict_proba, attach, ...)
        calibrator = self.__dict__.get("calibrator_")
        if calibrator is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}" + ("" if calibrator is not None else " before fit()"))
        return getattr(calibrator, name)

    def __repr__(self) -> str:
        chosen = f", chosen={self.method_!r}" if self.method_ else ""
        return f"AutoCalibrator(metric={self.metric!r}, cv={self.cv}{chosen})"
