"""Choosing a calibrator: cross-validate every method on the calibration set, then refit the best.

``compare_calibrators`` splits the calibration set (only that set: the test set stays untouched) into ``cv``
stratified folds (``_cv.stratified_folds``, the folds every method shares), fits each method on ``cv - 1``
folds and scores it on the held-out fold: change in accuracy, ECE, AdaECE (15 bins), smCE, NLL, Brier, and
the fit time. Methods whose fit depends on a seed (their constructor takes ``seed``) are fitted once per fit
seed and their scores averaged within the fold. A method that fails on a fold (too few samples, a numerical
failure) is reported in the table with its error, never raised. The table reports mean and sample standard
deviation over folds.

``AutoCalibrator`` picks the method with the best cross-validated score, refits it on the whole calibration
set and then behaves as that calibrator: it saves as that method (``load_calibrator`` gives the method's own
class back) with the cross-validation table in its config (``fit["selection"]``) and model card.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .. import _progress
from .._checks import check_choice, check_float, check_int, resolve_from_logits
from ..metrics._format import validate
from ._base import NotFittedError, _labels_of
from ._cv import stratified_folds
from ._registry import create_calibrator, get_calibrator_class, list_calibrators

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


def is_stochastic(method: str) -> bool:
    """Whether a registered method's fit depends on a seed: its constructor takes ``seed``."""
    return "seed" in inspect.signature(get_calibrator_class(method)).parameters


def _method_specs(methods: Any) -> dict[str, dict[str, Any]]:
    """``"all"`` / a name / names / ``{name: constructor kwargs}`` -> ``{name: kwargs}`` (names checked)."""
    if isinstance(methods, str):
        specs = {name: {} for name in list_calibrators()} if methods == "all" else {methods: {}}
    elif isinstance(methods, Mapping):
        specs = {}
        for name, kwargs in methods.items():
            if kwargs is not None and not isinstance(kwargs, Mapping):
                raise TypeError(f"Expected argument `methods` to map names to constructor kwargs (dicts), but {name!r} maps to {kwargs!r}.")
            specs[name] = dict(kwargs or {})
    elif isinstance(methods, Sequence) and all(isinstance(m, str) for m in methods):
        specs = {name: {} for name in methods}
    else:
        raise TypeError(f"Expected argument `methods` to be 'all', a method name, a list of names or a dict name -> kwargs, but got {methods!r}.")
    if not specs:
        raise ValueError("Expected argument `methods` to name at least one calibrator, but got none.")
    for name in specs:
        if name not in list_calibrators():
            raise ValueError(f"Expected argument `methods` to hold names from {list_calibrators()}, but got {name!r}.")
    return specs


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


@dataclass
class MethodScores:
    """One method's cross-validated scores: one value per fold it fitted on, and the folds it failed on."""

    method: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    folds: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    errors: list[str] = field(default_factory=list)
    fit_seeds: int = 1

    def mean(self, column: str) -> float:
        values = self.folds[column]
        return float(np.mean(values)) if values else math.nan

    def std(self, column: str) -> float:
        values = self.folds[column]
        return float(np.std(values, ddof=1)) if len(values) > 1 else (0.0 if values else math.nan)


class CalibratorComparison:
    """The table ``compare_calibrators`` returns: prints as Markdown, converts to a dict or to flat rows.

    ``str(table)`` is the table (percent with two decimals, as the papers print); ``table.to_dict()`` is
    ``{method: {column: {"mean", "std"}, "failed_folds", "errors", ...}}`` (fractions, JSON-ready);
    ``table.rows()`` is one flat dict per method (``pandas.DataFrame(table.rows())`` works);
    ``table.best("ece")`` is the method with the lowest mean held-out ECE among those that fitted on every
    fold; ``table.predictions[method]`` holds each sample's calibrated logits from the fold that held it out
    (when asked for).
    """

    def __init__(self, scores: dict[str, MethodScores], *, cv: int, seed: int, n_bins: int, num_samples: int,
                 num_classes: int, predictions: dict[str, np.ndarray] | None = None, labels: np.ndarray | None = None):
        self.scores = scores
        self.cv, self.seed, self.n_bins = cv, seed, n_bins
        self.num_samples, self.num_classes = num_samples, num_classes
        self.predictions = predictions or {}
        self.labels = labels  # the labels of `predictions` (kept with them)

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

    def best(self, metric: str = "ece", max_accuracy_drop: float = 0.0) -> str:
        """The calibrator with the lowest mean held-out ``metric``, among methods that fitted on every fold and
        whose mean accuracy change is at least ``-max_accuracy_drop`` (a fraction). Ties: the first listed."""
        check_choice(metric, "metric", SELECTION_METRICS)
        max_accuracy_drop = check_float(max_accuracy_drop, "max_accuracy_drop", minimum=0.0, maximum=1.0)
        candidates = [
            s for name, s in self.scores.items()
            if name != UNCALIBRATED and not s.errors and math.isfinite(s.mean(metric))
            and s.mean("accuracy_change") >= -max_accuracy_drop - 1e-12
        ]
        if not candidates:
            raise ValueError(
                f"No calibrator qualifies: every method failed on some fold or lost more than {100 * max_accuracy_drop:.2f} "
                f"accuracy points. The table:\n{self}"
            )
        return min(candidates, key=lambda s: s.mean(metric)).method

    def to_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if not math.isfinite(x) else x

        out: dict[str, Any] = {}
        for name, s in self.scores.items():
            entry: dict[str, Any] = {c: {"mean": clean(s.mean(c)), "std": clean(s.std(c))} for c in COLUMNS}
            entry.update(failed_folds=len(s.errors), errors=list(s.errors), fit_seeds=s.fit_seeds, kwargs=dict(s.kwargs))
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
            rows.append(row)
        return rows

    def _cell(self, s: MethodScores, column: str) -> str:
        mean, std = s.mean(column), s.std(column)
        if not math.isfinite(mean):
            return "failed" if s.errors else "-"
        scale, digits = (100.0, 2) if COLUMNS[column][1] else (1.0, 3 if column == "fit_seconds" else 4)
        return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"

    def to_markdown(self) -> str:
        header = ["method"] + [COLUMNS[c][0] for c in COLUMNS] + ["failed folds"]
        body = [[name] + [self._cell(s, c) for c in COLUMNS] + [f"{len(s.errors)}/{self.cv}"] for name, s in self.scores.items()]
        widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

        rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
        seeds = sorted({s.fit_seeds for s in self.scores.values() if s.fit_seeds > 1})
        lines = [
            f"{self.cv}-fold cross-validation on the calibration set (N = {self.num_samples}, K = {self.num_classes}, "
            f"seed {self.seed}), scored on the held-out folds ({self.n_bins} bins): mean ± std over folds"
            + (f"; seeded methods averaged over {seeds[0]} fit seeds" if seeds else "") + ".",
            "",
            line(header),
            rule,
        ] + [line(row) for row in body]
        errors = [(name, e) for name, s in self.scores.items() for e in s.errors]
        if errors:
            lines += [""] + [f"- {name}: {error}" for name, error in errors]
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


def _cross_validate(name: str, kwargs: dict, z: np.ndarray, y: np.ndarray, folds, seeds: list, n_bins: int,
                    predictions: np.ndarray | None, bar) -> MethodScores:
    """Fit ``name`` on every fold's training part (once per fit seed; ``[None]``: unseeded) and score it on the
    held-out part; a fold whose fit fails is recorded as an error. Fills ``predictions`` (first seed) if given."""
    entry = MethodScores(name, kwargs, fit_seeds=len(seeds))
    for fold, (train, val) in enumerate(folds):
        bar.set_postfix_str(f"{name}, fold {fold + 1}/{len(folds)}", refresh=False)
        try:
            runs = []
            for fit_seed in seeds:
                calibrator = create_calibrator(name, **kwargs, **({} if fit_seed is None else {"seed": fit_seed}))
                start = time.perf_counter()
                calibrator.fit(z[train], y[train], from_logits=True, progress_bar=False)
                elapsed = time.perf_counter() - start
                with torch.no_grad():
                    calibrated = calibrator(torch.from_numpy(z[val]), from_logits=True).numpy()
                runs.append({**_scores(calibrated, z[val], y[val], n_bins), "fit_seconds": elapsed})
                if predictions is not None and len(runs) == 1:
                    predictions[val] = calibrated
        except Exception as err:  # noqa: BLE001 - a method that fails is a row of the table, not a crash
            message = str(err).strip().splitlines()[0] if str(err).strip() else ""
            entry.errors.append(f"fold {fold + 1}: {type(err).__name__}: {message}")
            logger.warning("compare_calibrators: %s failed on fold %d/%d: %s", name, fold + 1, len(folds), err)
        else:
            for column in COLUMNS:
                entry.folds[column].append(float(np.mean([run[column] for run in runs])))
        bar.update(1)
    return entry


def compare_calibrators(
    logits: Any,
    labels: Any = None,
    methods: str | Sequence[str] | Mapping[str, Mapping[str, Any]] = "all",
    cv: int = 5,
    seed: int = 0,
    *,
    fit_seeds: int = 3,
    n_bins: int = 15,
    from_logits: bool | None = None,
    keep_predictions: bool = False,
    progress_bar: bool = True,
) -> CalibratorComparison:
    """Cross-validate calibrators on the calibration set only (see the module docstring).

    Args:
        logits: (N, K) calibration-set logits (or probabilities), or a transformers ``PredictionOutput``.
        labels: (N,) integer labels; -100 rows are dropped.
        methods: ``"all"`` (every registered calibrator, ``list_calibrators()``), one name, a list of names, or
            a dict ``{name: constructor kwargs}``.
        cv: number of stratified folds (>= 2).
        seed: seed of the fold split (and the first fit seed).
        fit_seeds: fits per fold, seeds ``seed, seed + 1, ...``, for methods whose constructor takes ``seed``
            (unless the kwargs fix it); their fold scores are the means over these fits.
        n_bins: bins of ECE and AdaECE.
        from_logits: None detects probabilities (rows in [0, 1] summing to 1), which are turned into
            log-probabilities; True/False forces.
        keep_predictions: keep every method's out-of-fold calibrated logits (first fit seed) in
            ``table.predictions`` (N x K float64 each; rows of failed folds are NaN).
        progress_bar: a tqdm bar over methods x folds.

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
    specs = _method_specs(methods)
    cv = check_int(cv, "cv", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
    n_bins = check_int(n_bins, "n_bins", minimum=1)
    for name, flag in (("keep_predictions", keep_predictions), ("progress_bar", progress_bar)):
        if not isinstance(flag, bool):
            raise TypeError(f"Expected argument `{name}` to be a bool, but got {flag!r}.")
    z, y = _as_logits(logits, labels, from_logits)
    folds = stratified_folds(y, cv=cv, seed=seed)

    scores = {UNCALIBRATED: MethodScores(UNCALIBRATED)}
    for _, val in folds:
        for column, value in {**_scores(z[val], z[val], y[val], n_bins), "fit_seconds": 0.0}.items():
            scores[UNCALIBRATED].folds[column].append(value)
    predictions = {UNCALIBRATED: z} if keep_predictions else None

    with _progress.progress_bar(total=len(specs) * cv, desc="compare_calibrators", enabled=progress_bar) as bar:
        for name, kwargs in specs.items():
            seeds = [seed + i for i in range(fit_seeds)] if is_stochastic(name) and "seed" not in kwargs else [None]
            if keep_predictions:
                predictions[name] = np.full_like(z, np.nan)
            scores[name] = _cross_validate(name, kwargs, z, y, folds, seeds, n_bins, predictions[name] if keep_predictions else None, bar)
    return CalibratorComparison(scores, cv=cv, seed=seed, n_bins=n_bins, num_samples=int(z.shape[0]),
                                num_classes=int(z.shape[1]), predictions=predictions, labels=y if keep_predictions else None)


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
            the mean over the held-out folds.
        cv: number of folds.
        methods: candidates, as in ``compare_calibrators`` (default: every registered calibrator).
        seed: seed of the folds and of the refit of a seeded method.
        fit_seeds: fits per fold of a seeded method (scores averaged).
        max_accuracy_drop: a method whose mean cross-validated accuracy change is below ``-max_accuracy_drop``
            (a fraction; default 0: it must not lose accuracy on average) is not a candidate.
        n_bins: bins of ECE and AdaECE.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (1000,), generator=g)
        >>> logits = 3 * torch.randn(1000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> auto = AutoCalibrator(methods=["temperature_scaling", "isotonic"]).fit(logits, labels, progress_bar=False)
        >>> auto.method_ in ("temperature_scaling", "isotonic"), auto(logits).shape
        (True, torch.Size([1000, 5]))
    """

    def __init__(self, metric: str = "ece", cv: int = 5, methods: Any = "all", seed: int = 0, fit_seeds: int = 3,
                 max_accuracy_drop: float = 0.0, n_bins: int = 15):
        self.metric = check_choice(metric, "metric", SELECTION_METRICS)
        self.cv = check_int(cv, "cv", minimum=2)
        self.methods = methods
        _method_specs(methods)  # bad names fail here, not after a long comparison
        self.seed = check_int(seed, "seed", minimum=0)
        self.fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
        self.max_accuracy_drop = check_float(max_accuracy_drop, "max_accuracy_drop", minimum=0.0, maximum=1.0)
        self.n_bins = check_int(n_bins, "n_bins", minimum=1)
        self.calibrator_ = None
        self.method_: str | None = None
        self.comparison_: CalibratorComparison | None = None

    def fit(self, logits: Any, labels: Any = None, *, from_logits: bool | None = None, progress_bar: bool = True) -> "AutoCalibrator":
        """Cross-validate every candidate on ``(logits, labels)``, then refit the best on all of it. Returns ``self``.

        ``logits`` may be probabilities (``from_logits=None`` detects them, as every calibrator does).
        """
        logits, labels = _labels_of(logits, labels)
        self.comparison_ = compare_calibrators(logits, labels, self.methods, self.cv, self.seed, fit_seeds=self.fit_seeds,
                                               n_bins=self.n_bins, from_logits=from_logits, progress_bar=progress_bar)
        self.method_ = self.comparison_.best(self.metric, self.max_accuracy_drop)
        kwargs = dict(self.comparison_[self.method_].kwargs)
        if is_stochastic(self.method_):
            kwargs.setdefault("seed", self.seed)
        logger.info("AutoCalibrator: %s has the lowest cross-validated %s; refitting it on all %d samples.",
                    self.method_, self.metric, self.comparison_.num_samples)
        calibrator = create_calibrator(self.method_, **kwargs).fit(logits, labels, from_logits=from_logits, progress_bar=progress_bar)
        calibrator.fit_info_["selection"] = self.selection()
        self.calibrator_ = calibrator
        return self

    def selection(self) -> dict[str, Any]:
        """How the method was chosen: the settings, the chosen method and the whole table (JSON-ready)."""
        self._check_fitted()
        return {"chosen": self.method_, "metric": self.metric, "cv": self.cv, "seed": self.seed, "fit_seeds": self.fit_seeds,
                "max_accuracy_drop": self.max_accuracy_drop, "n_bins": self.n_bins, "table": self.comparison_.to_dict()}

    def _check_fitted(self) -> None:
        if self.comparison_ is None:
            raise NotFittedError("This AutoCalibrator is not fitted yet: call fit(logits, labels) first.")

    def _card_section(self) -> str:
        return (f"Chosen by `AutoCalibrator(metric={self.metric!r}, cv={self.cv})`: `{self.method_}` had the lowest "
                f"mean held-out {self.metric} among the candidates.\n\n{self.comparison_.to_markdown()}")

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
