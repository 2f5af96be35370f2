"""A calibrator fitted on a Trainer's eval split when training ends, saved beside the model, reported on its card: the
functional core of ``CalibrationCallback`` (``hf_calibration.training.callback``, the adapter to any ``Trainer``).

``CalibrationCallback(...)``, and ``CalibrationTrainer(..., calibrate_on_eval="temperature_scaling")`` which adds one,
call :func:`fit_eval_calibration` on the eval split's logits once training (and the MaC-Cal stage) is over: the
calibrator is fitted on the whole split, and the numbers that go on the model card are measured on that split

* before: the model's own logits;
* after: cross-fitted logits (``cv`` stratified folds, each sample calibrated by a calibrator fitted on the other
  folds), because the calibrator's score on the very samples it was fitted on flatters it.

The calibrator is kept by the rule ``AutoCalibrator`` applies (``CalibratorComparison.decide``, metric ECE, the
card's headline): its cross-fitted NLL must be significantly lower than the uncalibrated model's, and the uncalibrated
model must not have a lower cross-fitted ECE beyond one standard error. Otherwise the model is left as it is: the
saved calibrator is the identity (temperature scaling fixed at T = 1), an ``UncalibratedWarning`` and the card say
why, and the card still shows the rejected calibrator's cross-fitted numbers.

The callback writes the calibrator to ``calibrator/`` (so ``load_calibrated_model`` and
``hf_calibration.pipeline`` load it with the model) and ``push_to_hub`` uploads it; the model card gets the ECE and NLL
before and after as ``model-index`` evaluation results (``huggingface_hub.EvalResult``), which the Hub shows on the
model's page, and a short section saying how to load the calibrated model.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf_calibration.serving.calibrated_model import CALIBRATOR_FOLDER

__all__ = [
    "EvalCalibration",
    "MetricValue",
    "dataset_fields",
    "fit_eval_calibration",
    "resolve_calibrator",
]

logger = logging.getLogger(__name__)

CARD_METRICS = {"ece": "ECE", "nll": "NLL"}  # report key -> name on the card
N_BINS = 15  # ECE's bins on the card (Guo et al.'s 15 equal-width bins)
CI_LEVEL, N_BOOT = 0.95, 1000  # the card's intervals: bootstrap over the eval rows (ECE basic, NLL percentile)
DEFAULT_CALIBRATOR = "temperature_scaling"
SIGMOID_DEFAULT_CALIBRATOR = "sigmoid_temperature_scaling"  # binary and multi-label heads
_TASK = "image-classification"  # the card's default pipeline task
_SECTION = "## Calibration"  # the card section this module writes (replaced, never duplicated, on a new push)
_UNCALIBRATED, _CROSS_FITTED = "uncalibrated", "-cross-fitted"  # the `config` of the model-index metrics written here


@dataclass(frozen=True)
class MetricValue:
    """A metric on the eval split, as a fraction (ECE) or in nats (NLL); ``interval``: its confidence interval;
    ``note``: the interval's note in a few words (``MetricInterval.short_note``: ``"interval reaches 0"``, ...)."""

    value: float
    interval: tuple[float, float] | None = None
    note: str = ""


def _measure(logits: np.ndarray, labels: np.ndarray, task: str | None = None) -> dict[str, MetricValue]:
    """The card's metrics of one set of logits, each with its 95 % bootstrap interval (1,000 resamples of the rows,
    seed 0; the interval each metric's function gives): the only place that computes them. A sigmoid head (``task``):
    macro averages over the labels."""
    from hf_calibration.metrics import ece, nll

    extra = {} if task is None else {"task": task}
    functions = {"ece": lambda z, y, **kw: ece(z, y, N_BINS, **kw), "nll": nll}
    values = {
        key: functions[key](logits, labels, from_logits=True, ci=CI_LEVEL, n_boot=N_BOOT, seed=0, **extra)
        for key in CARD_METRICS
    }
    return {
        key: MetricValue(
            float(v),
            (float(v.low), float(v.high)) if v.has_interval else None,
            v.short_note or ("" if v.has_interval else "no interval"),
        )
        for key, v in values.items()
    }


AUTO = "auto"  # the spec that picks the calibrator by AutoCalibrator's rule


def resolve_calibrator(spec: Any, task: str | None = None, argument: str = "calibrate_on_eval"):
    """The unfitted calibrator ``spec`` names: ``True`` (temperature scaling; a sigmoid head's for a binary or
    multi-label ``task``), a registered kind (``"smart"``, ...), ``"auto"`` or an ``AutoCalibrator`` (the method it
    picks), or a ``Calibrator`` instance (copied, so the instance given stays as it is). A kind for another head than
    ``task``'s is a ``ValueError`` naming ``problem_type``; ``argument``: the name errors give."""
    from hf_calibration.calibrators import AutoCalibrator, Calibrator, create_calibrator, list_calibrators

    sigmoid = task in ("binary", "multilabel")
    if spec == AUTO and isinstance(spec, str):
        return AutoCalibrator()
    if isinstance(spec, AutoCalibrator):
        return copy.deepcopy(spec)
    if spec is True:
        spec = SIGMOID_DEFAULT_CALIBRATOR if sigmoid else DEFAULT_CALIBRATOR
    if task is not None and isinstance(spec, (str, Calibrator)):
        kind = spec if isinstance(spec, str) else spec.kind
        if kind in list_calibrators() and kind not in list_calibrators(task):
            raise ValueError(
                f"Expected argument `{argument}` to name a calibrator for the model's {task} head "
                f"({list_calibrators(task)}), but {kind!r} calibrates a {'softmax' if sigmoid else 'sigmoid'} "
                "head (see the model's config.problem_type)."
            )
    if isinstance(spec, str):
        if spec not in list_calibrators():
            raise ValueError(
                f"Expected argument `{argument}` to be True, 'auto', a calibrator instance or one of {list_calibrators()}, but got {spec!r}."
            )
        return create_calibrator(spec)
    if isinstance(spec, Calibrator):
        return copy.deepcopy(spec)
    raise TypeError(
        f"Expected argument `{argument}` to be True, a calibrator kind (str), 'auto', a Calibrator or an AutoCalibrator, but got {spec!r}."
    )


def _interval_text(value: MetricValue, percent: bool) -> str:
    note = f" ({value.note})" if value.note else ""
    if value.interval is None:
        return note
    lo, hi = (100 * v if percent else v for v in value.interval)
    return (f" [{lo:.2f}, {hi:.2f}]" if percent else f" [{lo:.4f}, {hi:.4f}]") + note


def _cell(key: str, value: MetricValue | None) -> str:
    if value is None:
        return "-"
    percent = key == "ece"
    return (f"{100 * value.value:.2f} %" if percent else f"{value.value:.4f}") + _interval_text(value, percent)


@dataclass
class EvalCalibration:
    """A calibrator fitted on an eval split, and the split's metrics before and after (cross-fitted)."""

    calibrator: Any  # the calibrator kept: the one fitted, or the identity when it did not qualify (``reason``)
    before: dict[str, MetricValue]
    after: (
        dict[str, MetricValue] | None
    )  # the fitted method's cross-fitted numbers; None when a fold could not be fitted
    num_samples: int
    cv: int
    seed: int
    task: str = "multiclass"
    candidate: str | None = None  # the kind asked for (default: the calibrator's)
    reason: str | None = None  # why the model is left uncalibrated (None: the calibrator was kept)
    pipeline_task: str | None = (
        None  # the model's pipeline task, on the cards (None: read from the saved model's config)
    )

    @property
    def method(self) -> str:
        """The calibrator kind that was fitted and cross-fitted (kept unless ``reason`` says why not)."""
        return self.candidate or self.calibrator.kind

    def save(self, folder: str | os.PathLike) -> Path:
        """Save the calibrator to ``folder/calibrator`` (replacing one saved there by an earlier call); returns that path."""
        target = Path(folder) / CALIBRATOR_FOLDER
        card = {"pipeline_task": self.pipeline_task} if self.pipeline_task else {}  # else the saved model's, if any
        self.calibrator.save_pretrained(target, overwrite=True, model_card_kwargs=card)
        return target

    def eval_results(
        self,
        *,
        dataset_type: str,
        dataset_name: str,
        dataset_config: str | None = None,
        dataset_split: str | None = None,
    ) -> list:
        """The metrics as ``huggingface_hub.EvalResult`` s (one per metric and state), for a card's ``model-index``."""
        from huggingface_hub import EvalResult

        states = [(_UNCALIBRATED, "uncalibrated", self.before)]
        if self.after is not None:
            states.append((f"{self.method}{_CROSS_FITTED}", f"{self.method}, {self.cv}-fold cross-fitted", self.after))
        out = []
        for config, state, values in states:
            for key, label in CARD_METRICS.items():
                value = values[key]
                out.append(
                    EvalResult(
                        task_type=self.pipeline_task or _TASK,
                        dataset_type=dataset_type,
                        dataset_name=dataset_name,
                        dataset_config=dataset_config,
                        dataset_split=dataset_split,
                        metric_type=key,
                        metric_value=round(value.value, 6),
                        metric_name=f"{label} ({state})" + _interval_text(value, key == "ece"),
                        metric_config=config,
                        metric_args={"n_bins": N_BINS} if key == "ece" else None,
                    )
                )
        return out

    def card_section(self, repo_id: str | None = None) -> str:
        """The model card's calibration section (Markdown); ``repo_id``: the model's repo, for the loading example."""
        repo = repo_id or "<this repo>"
        task = f'"{self.pipeline_task}", ' if self.pipeline_task else ""  # else read from the model's config
        rows = [
            f"| {CARD_METRICS[key]} | {_cell(key, self.before[key])} | {_cell(key, None if self.after is None else self.after[key])} |"
            for key in CARD_METRICS
        ]
        after = (
            f"after: each sample calibrated by a `{self.method}` fitted on the other {self.cv - 1} of {self.cv} "
            "stratified folds (cross-fitted), so the numbers are not measured on the data a calibrator was fitted on"
            if self.after is not None
            else "after: not measured (a cross-fitting fold could not be fitted)"
        )
        if self.reason is None:
            saved = (
                f"A `{self.method}` calibrator fitted on the {self.num_samples} samples of the evaluation split is saved in "
                f"`{CALIBRATOR_FOLDER}/`. With `pip install hf-calibration`, one call loads the model calibrated:"
            )
        else:
            saved = (
                f"A `{self.method}` calibrator was fitted on the {self.num_samples} samples of the evaluation split, but not "
                f"kept: {self.reason}. `{CALIBRATOR_FOLDER}/` holds the identity (temperature scaling fixed at T = 1), so "
                "the loaded model gives the uncalibrated scores:"
            )
        return "\n".join(
            [
                _SECTION,
                "",
                saved,
                "",
                "```python",
                "import hf_calibration",
                "",
                f'classifier = hf_calibration.pipeline({task}model="{repo}")   # calibrated scores',
                f'model = hf_calibration.load_calibrated_model("{repo}")   # calibrated logits',
                "```",
                "",
                "Without it, transformers loads the plain (uncalibrated) model from the same repo.",
                "",
                f"| evaluation split | uncalibrated | {self.method} |",
                "|---|---:|---:|",
                *rows,
                "",
                f"ECE: {N_BINS} equal-width bins"
                + (
                    "; a multi-label head's ECE and NLL (binary cross-entropy) are macro averages over its labels"
                    if self.task == "multilabel"
                    else "; a binary head's: its probability against its 0/1 label"
                    if self.task == "binary"
                    else ""
                )
                + f". Before: the model's logits; {after}.",
                "",
            ]
        )

    def add_to_model_card(
        self, readme: str | os.PathLike, *, model_name: str, repo_id: str | None = None, **dataset: Any
    ) -> None:
        """Add the results to the ``model-index`` of the card at ``readme`` and its calibration section (both replaced
        if an earlier call wrote them). ``dataset``: ``dataset_type``, ``dataset_name``, ``dataset_config``, ``dataset_split``;
        ``repo_id``: the model's Hub repo, named in the loading example."""
        from huggingface_hub import ModelCard

        readme = Path(readme)
        card = ModelCard.load(readme) if readme.is_file() else ModelCard("---\n---\n")
        kept = [r for r in (card.data.eval_results or []) if not _written_here(r)]
        card.data.eval_results = kept + self.eval_results(**dataset)
        card.data.model_name = card.data.model_name or model_name
        text = card.text
        if _SECTION in text:  # an earlier section of ours: up to the next section of the same level
            head, _, rest = text.partition(_SECTION)
            nxt = rest.find("\n## ")
            text = head + (rest[nxt + 1 :] if nxt >= 0 else "")
        card.text = text.rstrip("\n") + "\n\n" + self.card_section(repo_id)
        card.save(readme)


def _written_here(result: Any) -> bool:
    config = str(result.metric_config or "")
    return result.metric_type in CARD_METRICS and (config == _UNCALIBRATED or config.endswith(_CROSS_FITTED))


def dataset_fields(
    dataset: Any, dataset_tags: Any = None, dataset_name: Any = None, dataset_args: Any = None
) -> dict[str, Any]:
    """``dataset_type`` / ``dataset_name`` / ``dataset_config`` / ``dataset_split`` of the eval split for an
    ``EvalResult``: what ``Trainer.create_model_card`` was given (``dataset_tags``, ``dataset``, ``dataset_args``),
    else the ``datasets.Dataset``'s own info, else a generic description."""

    def first(value: Any) -> str | None:
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        return None if value is None else str(value)

    info = getattr(dataset, "info", None)
    builder = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    kind = first(dataset_tags) or builder
    name = first(dataset_name) or kind
    split = getattr(dataset, "split", None)
    return {
        "dataset_type": kind or "custom",
        "dataset_name": name or "evaluation split",
        "dataset_config": first(dataset_args) or getattr(info, "config_name", None),
        "dataset_split": None if split is None else str(split),
    }


def fit_eval_calibration(
    logits: Any,
    labels: Any = None,
    calibrator: Any = DEFAULT_CALIBRATOR,
    *,
    cv: int = 5,
    seed: int = 0,
    task: str | None = None,
    who: str = "calibrate_on_eval",
) -> EvalCalibration:
    """Fit ``calibrator`` on an eval split and measure ECE / NLL before and after (cross-fitted, ``cv`` folds); keep it
    only if it qualifies by ``AutoCalibrator``'s rule (module docstring), else keep the identity and warn.

    Args:
        logits: (N, K) eval-split logits, or the ``PredictionOutput`` of ``Trainer.predict`` (then ``labels`` may be
            omitted). Rows labelled -100 are left out.
        labels: (N,) integer labels.
        calibrator: what :func:`resolve_calibrator` takes: ``True``, a registered kind, ``"auto"`` / an
            ``AutoCalibrator`` (its pick, cross-fitted and kept by the same rule), or a calibrator instance.
        cv: cross-fitting folds of the "after" numbers. seed: their split.
        task: the head's kind (``hf_calibration._core.tasks``); None reads it from the shapes. A binary or multi-label head's
            numbers are macro averages over its labels, and -100 leaves out one label of a sample.
        who: what the warnings and logs name as fitting it.
    """
    from hf_calibration._core.inputs import logits_and_labels as _labels_of
    from hf_calibration._core.inputs import read_multiclass
    from hf_calibration.calibrators.selection.auto import sigmoid_task_of

    logits, labels = _labels_of(logits, labels)
    sigmoid = sigmoid_task_of(logits, labels, task)
    template = resolve_calibrator(
        calibrator if sigmoid is None or calibrator != DEFAULT_CALIBRATOR else True, sigmoid or "multiclass"
    )
    if sigmoid is not None:
        return _fit_eval(np.asarray(logits, dtype=np.float64), np.asarray(labels), template, cv, seed, sigmoid, who)
    inputs = read_multiclass(
        logits, labels, from_logits=True, preds_name="logits", target_name="labels"
    )  # drops -100 rows
    return _fit_eval(
        np.asarray(inputs.preds, dtype=np.float64), np.asarray(inputs.target), template, cv, seed, "multiclass", who
    )


def _fit_eval(z: np.ndarray, y: np.ndarray, template: Any, cv: int, seed: int, task: str, who: str) -> EvalCalibration:
    """``fit_eval_calibration`` on checked ``(z, y)`` of a ``task`` head: cross-fit ``template``, keep it by its rule."""
    from hf_calibration.calibrators import compare_calibrators, held_out_checked
    from hf_calibration.calibrators.selection.auto import UNCALIBRATED, identity_calibrator

    sigmoid = None if task == "multiclass" else task
    extra = {} if sigmoid is None else {"task": task}
    before = _measure(z, y, sigmoid)
    template, declined = _auto_pick(template, z, y, sigmoid)
    if template is None:
        return _left_uncalibrated(z, y, before, declined, cv, seed, task, who)
    try:
        table = compare_calibrators(
            z,
            y,
            {template.kind: dict(template._hub_mixin_config or {})},
            cv=cv,
            seed=seed,
            metric="ece",
            race=False,
            fit_seeds=1,
            n_bins=N_BINS,
            from_logits=True,
            keep_predictions=True,
            progress_bar=False,
            **extra,
        )
        crossfit, errors = table.predictions[template.kind], "; ".join(table[template.kind].errors)
        chosen, reason = table.decide("ece")
    except ValueError as err:  # fewer samples than folds
        crossfit, errors = None, str(err)
        chosen, reason = UNCALIBRATED, f"it could not be cross-fitted ({err})"
    after = None
    if crossfit is not None and np.isfinite(crossfit).all():  # a sigmoid head's may come back flat
        after = _measure(crossfit.reshape(z.shape) if crossfit.size == z.size else crossfit, y, sigmoid)
    else:
        logger.warning(
            "%s: %s could not be cross-fitted on the %d eval samples (%s); the card reports "
            "the uncalibrated numbers only.",
            who,
            template.kind,
            len(y),
            errors,
        )
    if chosen == UNCALIBRATED:
        reason = f"{template.kind} did not qualify: {reason}"
        fitted = identity_calibrator(z, y, True, reason, who=who, **extra)
    else:
        with held_out_checked():  # the cross-fitting above is its held-out check
            fitted = template.fit(z, y, from_logits=True, progress_bar=False, **extra)
    result = EvalCalibration(
        fitted,
        before,
        after,
        num_samples=int(len(y)),
        cv=cv,
        seed=seed,
        task=task,
        candidate=template.kind,
        reason=reason,
    )
    if sigmoid is None:
        logger.info(
            "%s: %s fitted on %d eval samples; ECE %s -> %s (cross-fitted)%s",
            who,
            template.kind,
            len(y),
            _cell("ece", before["ece"]),
            _cell("ece", None if after is None else after["ece"]),
            "" if reason is None else "; not kept, the model stays uncalibrated",
        )
    return result


def _auto_pick(template: Any, z: np.ndarray, y: np.ndarray, task: str | None) -> tuple[Any, str | None]:
    """``(template, None)`` for a calibrator; for an ``AutoCalibrator``, an unfitted calibrator of the method it picks on
    ``(z, y)`` (then cross-fitted and kept by the same rule as a named one), or ``(None, why)`` when it picks none."""
    from hf_calibration.calibrators import AutoCalibrator, create_calibrator
    from hf_calibration.calibrators.selection.auto import UNCALIBRATED

    if not isinstance(template, AutoCalibrator):
        return template, None
    with warnings.catch_warnings():  # its UncalibratedWarning: said once, by _left_uncalibrated
        warnings.simplefilter("ignore")
        template.fit(z, y, from_logits=True, progress_bar=False, **({} if task is None else {"task": task}))
    if template.method_ == UNCALIBRATED:
        return None, f"AutoCalibrator picked no calibrator: {template.reason_}"
    return create_calibrator(template.method_, **dict(template.comparison_[template.method_].kwargs)), None


def _left_uncalibrated(
    z: np.ndarray, y: np.ndarray, before: dict, reason: str, cv: int, seed: int, task: str, who: str
) -> EvalCalibration:
    """The model left as it is (the identity saved, an ``UncalibratedWarning`` saying ``reason``)."""
    from hf_calibration.calibrators.selection.auto import identity_calibrator

    extra = {} if task == "multiclass" else {"task": task}
    fitted = identity_calibrator(z, y, True, reason, who=who, **extra)
    return EvalCalibration(
        fitted, before, None, num_samples=int(len(y)), cv=cv, seed=seed, task=task, candidate=AUTO, reason=reason
    )


IGNORE_INDEX = -100  # the label of a row the loss and the calibrator skip (transformers' convention)


def _labelled_rows(dataset: Any, needed: int, label_names: tuple[str, ...]) -> int | None:
    """How many rows of ``dataset`` carry a label other than -100, counted until ``needed`` are found (so a map-style
    dataset of images is read only that far); None when its rows hold no label under ``label_names``."""
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, list):  # a datasets.Dataset: the label column alone, no image decoded
        name = next((n for n in label_names if n in columns), None)
        if name is None:
            return None
        plain = (
            dataset.with_format(None) if hasattr(dataset, "with_format") else dataset
        )  # no transform: no image decoded
        return int(sum(1 for v in plain[name] if v is not None and np.any(np.asarray(v) != IGNORE_INDEX)))
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return None
    count = 0
    for i in range(len(dataset)):
        row = dataset[i]
        if not isinstance(row, dict):
            return None
        name = next((n for n in label_names if n in row), None)
        if name is None:
            return None
        label = row[name]
        value = np.asarray(label.detach().cpu() if hasattr(label, "detach") else label)
        count += int(bool(np.any(value != IGNORE_INDEX)))  # a multi-label row: any label
        if count >= needed:
            break
    return count


def check_calibrate_on_eval(
    spec: Any,
    eval_dataset: Any,
    label_names: tuple[str, ...] = ("labels", "label"),
    task: str | None = None,
    argument: str = "calibrate_on_eval",
) -> None:
    """Fail before training, not after it: a calibrator spec that does not resolve (or is for another head than
    ``task``'s), no single eval split, or one too small to fit the calibrator on (its rows with a label other than
    -100, which the fit counts). ``argument``: the name the errors give."""
    template = resolve_calibrator(spec, task, argument)
    if eval_dataset is None:
        raise ValueError(
            f"Expected an `eval_dataset` to fit the calibrator on, since `{argument}` is set, but got None: give the "
            "Trainer an eval_dataset."
        )
    if isinstance(eval_dataset, dict):
        raise ValueError(
            f"Expected one `eval_dataset` for `{argument}`, but got a dict of several: name the one to fit on, "
            "CalibrationCallback(eval_dataset=name), or trainer.fit_calibrator(eval_dataset[name])."
        )
    if not hasattr(template, "min_samples"):  # AutoCalibrator: its candidates' own checks, at fit
        return
    if hasattr(eval_dataset, "__len__") and len(eval_dataset) < template.min_samples:
        raise ValueError(
            f"Expected an `eval_dataset` of at least {template.min_samples} samples to fit {type(template).__name__} "
            f"on (`{argument}`), but it holds {len(eval_dataset)}."
        )
    labelled = _labelled_rows(eval_dataset, template.min_samples, label_names)
    if labelled is not None and labelled < template.min_samples:
        raise ValueError(
            f"Expected an `eval_dataset` with at least {template.min_samples} labelled samples to fit "
            f"{type(template).__name__} on (`{argument}`), but only {labelled} of its {len(eval_dataset)} rows "
            f"have a label other than {IGNORE_INDEX}."
        )
