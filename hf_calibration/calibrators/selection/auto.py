"""Choosing a calibrator: cross-validate the candidates on the calibration set, then refit the best.

``compare_calibrators`` splits the calibration set (only that set: the test set stays untouched) into ``cv``
stratified folds (``_machinery.fitting.cv.stratified_folds``, one split that every candidate shares), fits each candidate on
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
Dirichlet scaling (each fit runs its own 5-fold cross-validation of lambda), PTS (an MLP), CTS (a per-class grid
search, the worst NLL of the temperature family at K = 100; never chosen) and one-vs-rest isotonic regression (never chosen, and it
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

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hf_calibration._core import progress as _progress
from hf_calibration._core.checks import check_bool, check_choice, check_float, check_int
from hf_calibration._core.inputs import read_multiclass, read_task
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators._machinery.base import NotFittedError, UncalibratedWarning, _labels_of
from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds
from hf_calibration.calibrators._machinery.fitting.held_out import held_out_checked, sample_nll
from hf_calibration.calibrators._machinery.registry import create_calibrator
from hf_calibration.calibrators.selection.comparison import (
    COLUMNS,
    DEFAULT_METHODS,
    SELECTION_METRICS,
    SIGMOID_DEFAULT_METHODS,
    SIGNIFICANCE,
    UNCALIBRATED,
    CalibratorComparison,
    MethodScores,
    _method_specs,
    _race,
    _scores,
    clearly_worse,
    is_stochastic,
    method_names,
    within_one_standard_error,
)

__all__ = [  # the comparison's table and constants are re-exported here, where users and the docs have always found them
    "COLUMNS",
    "DEFAULT_METHODS",
    "SELECTION_METRICS",
    "SIGMOID_DEFAULT_METHODS",
    "UNCALIBRATED",
    "AutoCalibrator",
    "CalibratorComparison",
    "MethodScores",
    "clearly_worse",
    "compare_calibrators",
    "identity_calibrator",
    "is_stochastic",
    "method_names",
    "sample_nll",
    "within_one_standard_error",
]

logger = logging.getLogger(__name__)


def _as_logits(logits: Any, labels: Any, from_logits: bool | None) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 logits (probabilities become log-probabilities) and int64 labels, ignored rows dropped."""
    logits, labels = _labels_of(logits, labels)
    inputs = read_multiclass(logits, labels, from_logits=from_logits, preds_name="logits", target_name="labels")
    z, y = np.asarray(inputs.preds, dtype=np.float64), inputs.target
    if not inputs.from_logits:
        z = np.log(np.maximum(z, np.finfo(np.float64).tiny))  # log-probabilities: the same softmax
    bad = ~np.isfinite(z).all(axis=1)
    if bad.any():
        raise ValueError(f"Expected `logits` to be finite, but row {int(np.flatnonzero(bad)[0])} contains NaN or inf.")
    return np.ascontiguousarray(z), y


class _SoftmaxHead:
    """The calibration set of a softmax head, as ``compare_calibrators`` reads it: ``z`` checked, ``zc`` is ``z`` with its
    row maxima at 0 (what ``Calibrator._fit_inputs`` would make of it), so a fit skips ``Calibrator.fit``'s checks and
    its fit-set report; each held-out sample's NLL is kept for the paired test of ``CalibratorComparison.best``."""

    task = "multiclass"

    def __init__(self, logits: Any, labels: Any, from_logits: bool | None, n_bins: int) -> None:
        self.z, self.y = _as_logits(logits, labels, from_logits)
        self.zc = np.ascontiguousarray(self.z - self.z.max(axis=1, keepdims=True))
        self.n_bins = n_bins

    def folds(self, cv: int, seed: int):
        return stratified_folds(self.y, cv=cv, seed=seed)

    def fit(self, calibrator, train: np.ndarray) -> None:
        objective, options = calibrator._resolve_objective(None, {})
        calibrator._fit_checked(self.zc[train], self.y[train], objective, options, False, report=False)

    def predict(self, calibrator, val: np.ndarray) -> np.ndarray:
        with torch.no_grad(), torch_single_threaded():
            return calibrator(torch.from_numpy(self.z[val]), from_logits=True).numpy()

    def score(self, calibrated: np.ndarray, val: np.ndarray) -> dict[str, float]:
        return _scores(calibrated, self.z[val], self.y[val], self.n_bins)

    def sample_nll(self, calibrated: np.ndarray, val: np.ndarray) -> np.ndarray:
        return sample_nll(calibrated, self.y[val])

    def table(self, keep_predictions: bool) -> dict[str, Any]:
        return {
            "labels": self.y if keep_predictions else None,
            "num_errors": int((self.z.argmax(axis=1) != self.y).sum()),
        }


def sigmoid_task_of(logits: Any, labels: Any, task: str | None) -> str | None:
    """``"binary"`` / ``"multilabel"`` when the calibration data (or ``task``) is a sigmoid head's, None for a softmax one,
    by the one rule of :func:`hf_calibration._core.inputs.read_task` (two softmax logits are a softmax head unless
    ``task="binary"``; one-hot labels without ``task`` are refused)."""
    found = read_task(task, logits, labels, preds_name="logits", target_name="labels")
    return None if found == "multiclass" else found


def identity_calibrator(
    logits: Any, labels: Any, from_logits: bool | None, reason: str, *, who: str, task: str | None = None
):
    """A temperature scaling fixed at T = 1 (the identity map) with the fit record of ``logits`` (a sigmoid head's
    ``task``: ``SigmoidTemperatureScaling`` at T = 1); an ``UncalibratedWarning`` says that ``who``
    (``"AutoCalibrator"``, ...) leaves the model as it is, and why."""
    from hf_calibration.calibrators.temperature import TemperatureScaling

    if task is not None:
        from hf_calibration.calibrators.selection.sigmoid import sigmoid_identity

        identity = sigmoid_identity(logits, labels, from_logits, task, reason)
        warnings.warn(
            f"{who} leaves every prediction uncalibrated (as the model gave them): {reason}.",
            UncalibratedWarning,
            stacklevel=3,
        )
        return identity
    identity = TemperatureScaling()
    z, y, is_logits = identity._fit_inputs(logits, labels, from_logits)
    identity.fit_info_ = {
        "task": "multiclass",
        "objective": "identity",
        "objective_options": {},
        "input": "logits" if is_logits else "probabilities",
        "num_samples": int(z.shape[0]),
        "num_classes": int(z.shape[1]),
        "temperature": 1.0,
    }
    identity.fit_info_.update(identity._fit_set_report(z, y)[0])
    identity.fit_info_["uncalibrated"] = {"classes": "all", "reason": reason}
    warnings.warn(
        f"{who} leaves every prediction uncalibrated (as the model gave them): {reason}.",
        UncalibratedWarning,
        stacklevel=3,
    )
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
            (:func:`hf_calibration._core.tasks.resolve_task`). A binary or multi-label head compares the sigmoid calibrators
            (``"default"``: ``SIGMOID_DEFAULT_METHODS``, every one of them), scored by the macro averages over labels
            (:mod:`hf_calibration.calibrators.selection.sigmoid`: the folds and the scores of a sigmoid head).

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
    if sigmoid is None:
        specs = _method_specs(methods)
    cv = check_int(cv, "cv", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    metric = check_choice(metric, "metric", SELECTION_METRICS)
    fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
    n_bins = check_int(n_bins, "n_bins", minimum=1)
    for name, flag in (("race", race), ("keep_predictions", keep_predictions), ("progress_bar", progress_bar)):
        check_bool(flag, name)
    if sigmoid is None:
        head = _SoftmaxHead(logits, labels, from_logits, n_bins)
    else:
        from hf_calibration.calibrators.selection.sigmoid import SigmoidHead

        head = SigmoidHead(logits, labels, from_logits, sigmoid, n_bins)
        specs = _method_specs(methods, head.task)
    z, folds = head.z, head.folds(cv, seed)

    def unscored() -> np.ndarray | None:  # each sample's held-out NLL, for the paired test (softmax heads)
        return np.full(z.shape[0], np.nan) if head.task == "multiclass" else None

    scores = {UNCALIBRATED: MethodScores(UNCALIBRATED, sample_nll=unscored())}
    for fold, (_, val) in enumerate(folds):
        uncalibrated = {**head.score(z[val], val), "fit_seconds": 0.0}
        scores[UNCALIBRATED].add_fold(fold, uncalibrated, val, head.sample_nll(z[val], val))
    predictions = {UNCALIBRATED: z} if keep_predictions else None
    seeds = {
        name: [seed + i for i in range(fit_seeds)] if is_stochastic(name) and "seed" not in kwargs else [None]
        for name, kwargs in specs.items()
    }
    for name, kwargs in specs.items():
        scores[name] = MethodScores(name, kwargs, fit_seeds=len(seeds[name]), sample_nll=unscored())
        if keep_predictions:
            predictions[name] = np.full_like(z, np.nan)

    def fit_and_score(name: str, train: np.ndarray, val: np.ndarray):
        """Fit ``name`` on ``train`` once per fit seed (``[None]``: unseeded), score it on ``val``: the scores averaged
        over the seeds, the first seed's calibrated held-out logits, each held-out sample's NLL (averaged)."""
        runs, first, nlls = [], None, []
        for fit_seed in seeds[name]:
            calibrator = create_calibrator(name, **specs[name], **({} if fit_seed is None else {"seed": fit_seed}))
            start = time.perf_counter()
            head.fit(calibrator, train)
            elapsed = time.perf_counter() - start
            calibrated = head.predict(calibrator, val)
            runs.append({**head.score(calibrated, val), "fit_seconds": elapsed})
            nlls.append(head.sample_nll(calibrated, val))
            first = calibrated if first is None else first
        values = {column: float(np.mean([run[column] for run in runs])) for column in COLUMNS}
        return values, first, None if nlls[0] is None else np.mean(nlls, axis=0)

    running = list(specs)
    with _progress.progress_bar(total=len(specs) * cv, desc="compare_calibrators", enabled=progress_bar) as bar:
        for fold, (train, val) in enumerate(folds):
            for name in running:
                bar.set_postfix_str(f"{name}, fold {fold + 1}/{cv}", refresh=False)
                try:
                    values, calibrated, held_out_nll = fit_and_score(name, train, val)
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
    return CalibratorComparison(
        scores,
        cv=cv,
        seed=seed,
        n_bins=n_bins,
        num_samples=int(z.shape[0]),
        num_classes=int(z.shape[1]),
        predictions=predictions,
        metric=metric,
        task=head.task,
        **head.table(keep_predictions),
    )


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

    def __init__(
        self,
        metric: str = "ece",
        cv: int = 5,
        methods: Any = "default",
        seed: int = 0,
        fit_seeds: int = 1,
        max_accuracy_drop: float = 0.0,
        n_bins: int = 15,
        race: bool = True,
        tie_break: str | None = "nll",
    ):
        self.metric = check_choice(metric, "metric", SELECTION_METRICS)
        self.cv = check_int(cv, "cv", minimum=2)
        self.methods = methods
        _method_specs(methods, None)  # bad names fail here, not after a long comparison (the head's kind: at fit)
        self.seed = check_int(seed, "seed", minimum=0)
        self.fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
        self.max_accuracy_drop = check_float(max_accuracy_drop, "max_accuracy_drop", minimum=0.0, maximum=1.0)
        self.n_bins = check_int(n_bins, "n_bins", minimum=1)
        self.race = check_bool(race, "race")
        self.tie_break = None if tie_break is None else check_choice(tie_break, "tie_break", SELECTION_METRICS)
        self.calibrator_ = None
        self.method_: str | None = None
        self.reason_: str | None = None  # why the choice is "uncalibrated" (None otherwise)
        self.comparison_: CalibratorComparison | None = None

    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        from_logits: bool | None = None,
        progress_bar: bool = True,
        task: str | None = None,
    ) -> AutoCalibrator:
        """Cross-validate the candidates on ``(logits, labels)``, then refit the best on all of it. Returns ``self``.

        ``logits`` may be probabilities (``from_logits=None`` detects them, as every calibrator does). When no
        candidate qualifies (none lowers the cross-validated NLL significantly, or every one failed), or the
        uncalibrated model is better on ``metric`` beyond noise, the model is left as it is: ``method_`` is
        ``"uncalibrated"``, ``reason_`` says why, ``calibrator_`` is a temperature scaling fixed at T = 1 (the identity,
        so that it saves, loads and attaches as any calibrator), and an ``UncalibratedWarning`` says why.
        """
        logits, labels = _labels_of(logits, labels)
        sigmoid = sigmoid_task_of(logits, labels, task)
        self.comparison_ = compare_calibrators(
            logits,
            labels,
            self.methods,
            self.cv,
            self.seed,
            metric=self.metric,
            race=self.race,
            fit_seeds=self.fit_seeds,
            n_bins=self.n_bins,
            from_logits=from_logits,
            progress_bar=progress_bar,
            task=task,
        )
        self.method_, self.reason_ = self.comparison_.decide(self.metric, self.max_accuracy_drop, self.tie_break)
        if self.method_ == UNCALIBRATED:
            calibrator = identity_calibrator(
                logits, labels, from_logits, self.reason_, who="AutoCalibrator", task=sigmoid
            )
        else:
            kwargs = dict(self.comparison_[self.method_].kwargs)
            if is_stochastic(self.method_):
                kwargs.setdefault("seed", self.seed)
            logger.info(
                "AutoCalibrator: %s is the best by cross-validated %s; refitting it on all %d samples.",
                self.method_,
                self.metric,
                self.comparison_.num_samples,
            )
            extra = {} if sigmoid is None else {"task": sigmoid}
            with held_out_checked():  # the cross-validation above is its held-out check
                calibrator = create_calibrator(self.method_, **kwargs).fit(
                    logits, labels, from_logits=from_logits, progress_bar=progress_bar, **extra
                )
        calibrator.fit_info_["selection"] = self.selection()
        self.calibrator_ = calibrator
        return self

    def selection(self) -> dict[str, Any]:
        """How the method was chosen: the settings, the chosen method and the whole table (JSON-ready)."""
        self._check_fitted()
        return {
            "chosen": self.method_,
            "reason": self.reason_,
            "significance": SIGNIFICANCE,
            "metric": self.metric,
            "cv": self.cv,
            "seed": self.seed,
            "fit_seeds": self.fit_seeds,
            "max_accuracy_drop": self.max_accuracy_drop,
            "n_bins": self.n_bins,
            "race": self.race,
            "tie_break": self.tie_break,
            "excluded": self.comparison_.exclusions(self.metric, self.max_accuracy_drop),
            "table": self.comparison_.to_dict(),
        }

    def _check_fitted(self) -> None:
        if self.comparison_ is None:
            raise NotFittedError("This AutoCalibrator is not fitted yet: call fit(logits, labels) first.")

    def _card_section(self) -> str:
        if self.method_ == UNCALIBRATED:
            chosen = (
                f"no calibrator: {self.reason_}, so the model is left as it is (temperature scaling fixed at T = 1)"
            )
        else:
            qualifying = (
                "the candidates that ran every fold with a held-out NLL significantly lower than the uncalibrated "
                "model's (and the uncalibrated model)"
            )
            if self.tie_break and self.tie_break != self.metric:
                chosen = (
                    f"among {qualifying}, those within one standard error of the lowest mean held-out {self.metric} "
                    f"tie, and `{self.method_}` has the lowest mean held-out {self.tie_break} of them"
                )
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
        from hf_calibration.calibrators._machinery.registry import load_calibrator

        return load_calibrator(pretrained_model_name_or_path, **kwargs)

    def __call__(self, logits: Any, **kwargs: Any) -> torch.Tensor:
        self._check_fitted()
        return self.calibrator_(logits, **kwargs)

    def __getattr__(self, name: str):
        # only reached for names this object lacks: those of the chosen calibrator (kind, predict_proba, attach, ...)
        calibrator = self.__dict__.get("calibrator_")
        if calibrator is None or name.startswith("__"):
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r}" + ("" if calibrator is not None else " before fit()")
            )
        return getattr(calibrator, name)

    def __repr__(self) -> str:
        chosen = f", chosen={self.method_!r}" if self.method_ else ""
        return f"AutoCalibrator(metric={self.metric!r}, cv={self.cv}{chosen})"
