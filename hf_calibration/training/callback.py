"""``CalibrationCallback``: calibration for any ``transformers.Trainer``, its subclasses included.

``Trainer(..., callbacks=[CalibrationCallback("temperature_scaling", conformal="aps")])``: when training ends, the
callback computes the eval split's logits, fits the calibrator on them (:func:`fit_eval_calibration`: kept only if its
cross-fitted numbers qualify, else the identity), fits the conformal predictor behind it (its sets are built from the
calibrated scores the model serves, and it records the calibrator's fingerprint), and writes ``calibrator/`` and
``conformal/`` with their model cards into ``args.output_dir``, where ``load_calibrated_model`` and
``hf_calibration.pipeline`` load them and ``trainer.push_to_hub`` uploads them. The ECE / NLL before and after go on the
model card the trainer writes (its ``model-index`` and a section).

How it reaches the trainer: a callback is given the model and the dataloaders, not the trainer. The callback finds its
trainer on the call stack when the trainer first calls it (the ``Trainer`` whose callback handler holds it), then uses
``trainer.predict`` for the logits: the trainer's own collator, devices, precision and gathering across processes
(``accelerate``'s, which drops the padding of uneven splits). sentence-transformers' ``CrossEncoderTrainer`` returns no
logits from ``predict`` (its collator hands raw text pairs to the loss, which tokenizes them): the callback runs its eval
dataloader as its losses do, and reads the head from the ``CrossEncoder``'s inner classifier. Without a ``Trainer`` (a
trainer of another family that calls transformers callbacks), it runs the ``model`` it is given over the
``eval_dataloader``, in eval mode and without gradients, and gathers the rows with ``hf_calibration._core.distributed``.

Under several processes every process computes its share of the logits, the main process alone fits (once, on all the
rows) and saves, and every process gets the fitted objects. The model's weights are never changed: the calibrator acts on
the logits, outside the model.

``CalibrationTrainer(calibrate_on_eval=...)`` is this callback, added for you (after the MaC-Cal stage).
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from hf_calibration._core.distributed import all_gather_object, all_gather_rows, even_batches_padding, is_distributed
from hf_calibration.serving.calibrated_model import CALIBRATOR_FOLDER, CONFORMAL_FOLDER
from hf_calibration.training.eval_calibration import (
    IGNORE_INDEX,
    EvalCalibration,
    check_calibrate_on_eval,
    dataset_fields,
    fit_eval_calibration,
    resolve_calibrator,
)

__all__ = ["CalibrationCallback"]

logger = logging.getLogger(__name__)

_CONFORMAL_METHODS = ("thr", "aps", "raps", "crc")  # crc: a multi-label head's sets


def _classifier(model: Any) -> Any:
    """The transformers classifier a trainer's model is or wraps: sentence-transformers' ``CrossEncoder`` (an
    ``nn.Module`` that tokenizes pairs itself) holds its ``...ForSequenceClassification`` as ``model.model``."""
    from transformers import PreTrainedModel

    inner = getattr(model, "model", None)
    if not isinstance(model, PreTrainedModel) and isinstance(inner, PreTrainedModel):
        return inner
    return model


def _pipeline_task(model: Any) -> str:
    """The model's pipeline task, as the loaders read it from a saved config; a model built from its config has no
    ``architectures`` until it is saved, so its class stands in for them."""
    from hf_calibration._core.tasks import IMAGE_TASK, pipeline_task_of_config

    model = _classifier(model)
    config = getattr(model, "config", None)
    if config is not None and not getattr(config, "architectures", None):
        config = {
            "architectures": [type(model).__name__],
            "model_type": getattr(config, "model_type", None),
            "maccal_head": getattr(config, "maccal_head", None),
        }
    return pipeline_task_of_config(config)[0] or IMAGE_TASK


def _head_task(model: Any) -> str | None:
    from hf_calibration._core.tasks import task_of_model

    try:
        return None if model is None else task_of_model(_classifier(model))
    except ValueError:
        return None


class CalibrationCallback(TrainerCallback):
    """Fit a calibrator (and conformal sets) on a ``Trainer``'s eval split when training ends; save them beside the model.

    Args:
        calibrator: a registered kind (``"temperature_scaling"``, ``"smart"``, ... see ``list_calibrators()``),
            ``"auto"`` or an ``AutoCalibrator`` (the method it picks), or an unfitted ``Calibrator`` (copied). Default
            (None): temperature scaling, a sigmoid head's (``sigmoid_temperature_scaling``) for a binary or multi-label
            head.
        conformal: ``None`` (no sets), ``"thr"`` / ``"aps"`` / ``"raps"`` (a ``ConformalPredictor``), ``"crc"`` (a
            multi-label head's ``MultiLabelConformalPredictor``) or an unfitted predictor (copied): fitted behind the
            calibrator, on the same eval logits, and saved in ``conformal/``.
        alpha: the conformal miscoverage (false-negative rate for ``"crc"``).
        eval_dataset: the split to fit on: default the trainer's ``eval_dataset``; a name picks one of a dict of eval
            datasets; a dataset is used as it is.
        on_evaluate: also fit at each evaluation and log ``eval_ece_uncalibrated``, ``eval_ece_calibrated`` (cross-fitted,
            5 folds), and the two NLLs through the trainer's loggers (``Trainer.log``: TensorBoard, W&B, ...). Costs one
            prediction pass over the eval split per evaluation.
        save: write ``calibrator/`` and ``conformal/`` into ``args.output_dir`` when training ends.
        cv: folds of the cross-fitted "after" numbers.

    After training, ``callback.calibrator``, ``callback.conformal_predictor`` and ``callback.eval_calibration`` hold
    what was fitted. The calibrator is fitted on the whole eval split and the conformal threshold on the same rows, as
    the RAPS paper does with Platt scaling: the coverage guarantee is then approximate (exact for sets fitted on other
    rows than the calibrator); a calibrator of few parameters (temperature scaling: one) moves it little.

    Example::

        trainer = Trainer(model, args, train_dataset=train, eval_dataset=val,
                          callbacks=[CalibrationCallback("temperature_scaling", conformal="aps")])
        trainer.train()       # output_dir/calibrator/ and output_dir/conformal/
        trainer.save_model()  # the model beside them
        hf_calibration.load_calibrated_model(args.output_dir)  # the task read from the saved config
    """

    def __init__(
        self,
        calibrator: Any = None,
        *,
        conformal: Any = None,
        alpha: float = 0.1,
        eval_dataset: Any = None,
        on_evaluate: bool = False,
        save: bool = True,
        cv: int = 5,
        _argument: str = "calibrator",  # the name errors give (CalibrationTrainer: calibrate_on_eval)
    ) -> None:
        from hf_calibration._core.checks import check_int
        from hf_calibration.conformal.quantile import check_alpha

        self._argument = _argument
        resolve_calibrator(True if calibrator is None else calibrator, None, _argument)  # a bad spec fails now
        self.spec = calibrator
        self.conformal = self._check_conformal(conformal)
        self.alpha = check_alpha(alpha)
        for name, value in (("on_evaluate", on_evaluate), ("save", save)):
            if not isinstance(value, bool):
                raise TypeError(f"Expected argument `{name}` to be a bool, but got {value!r}.")
        self.every_evaluation, self.save_to_output_dir = on_evaluate, save
        self.eval_dataset = eval_dataset
        self.cv = check_int(cv, "cv", minimum=2)
        self.eval_calibration: EvalCalibration | None = None
        self.conformal_predictor: Any = None
        self.trainer: Trainer | None = None

    # ------------------------------------------------------------------ arguments
    @staticmethod
    def _check_conformal(conformal: Any) -> Any:
        if conformal is None or (isinstance(conformal, str) and conformal in _CONFORMAL_METHODS):
            return conformal
        from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor

        if isinstance(conformal, (ConformalPredictor, MultiLabelConformalPredictor)):
            if conformal.is_fitted:
                raise ValueError(
                    "Expected argument `conformal` to be an unfitted predictor (it is fitted on the eval split behind "
                    "the calibrator), but it is fitted."
                )
            return conformal
        raise ValueError(
            f"Expected argument `conformal` to be None, one of {list(_CONFORMAL_METHODS)} or an unfitted "
            f"ConformalPredictor / MultiLabelConformalPredictor, but got {conformal!r}."
        )

    @property
    def calibrator(self):
        """The calibrator fitted on the eval split (None before training ends)."""
        return None if self.eval_calibration is None else self.eval_calibration.calibrator

    # ------------------------------------------------------------------ the trainer
    def bind(self, trainer: Trainer) -> CalibrationCallback:
        """Use ``trainer`` for the logits, its loggers and its model card (found by itself on the first event
        otherwise). Returns ``self``."""
        if self.trainer is trainer:
            return self
        self.trainer = trainer
        _wrap_model_card(trainer)
        return self

    def _find_trainer(self) -> Trainer | None:
        """The ``Trainer`` up the call stack whose callback handler holds this callback (each event is called from one)."""
        frame = inspect.currentframe()
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and self in getattr(candidate.callback_handler, "callbacks", ()):
                return candidate
            frame = frame.f_back
        return None

    def _trainer(self) -> Trainer | None:
        if self.trainer is None:
            found = self._find_trainer()
            if found is not None:
                self.bind(found)
        return self.trainer

    def _dataset(self, trainer: Trainer | None) -> Any:
        """The split to fit on (see ``eval_dataset``); None when the trainer is unknown (the eval dataloader is used)."""
        if self.eval_dataset is not None and not isinstance(self.eval_dataset, str):
            return self.eval_dataset
        if trainer is None:
            return None
        given = trainer.eval_dataset
        if isinstance(self.eval_dataset, str):
            if not isinstance(given, dict) or self.eval_dataset not in given:
                raise ValueError(
                    f"Expected argument `eval_dataset` to name one of the trainer's eval datasets "
                    f"({sorted(given) if isinstance(given, dict) else 'it has one, unnamed'}), but got {self.eval_dataset!r}."
                )
            return given[self.eval_dataset]
        return given

    def _label_names(self, args: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(getattr(args, "label_names", None) or []), "labels", "label"]))

    def _check(self, trainer: Trainer) -> None:
        """Fail before training, not after it: no single eval split, too small a one, a calibrator or sets for another
        head, a model whose outputs are no class scores (a regression or reward head: one logit, no problem type)."""
        from hf_calibration._core.tasks import task_of_model

        try:
            task = task_of_model(_classifier(trainer.model))
        except ValueError as err:
            raise ValueError(
                f"{type(self).__name__} fits a calibrator on a classifier's class scores, but {type(trainer).__name__}'s "
                f"model gives none: {err}"
            ) from None
        if _tokenizes_in_loss(trainer) and not type(_classifier(trainer.model)).__name__.endswith(
            "ForSequenceClassification"
        ):
            raise ValueError(
                f"{type(self).__name__} fits a calibrator on a classifier's class scores, but {type(trainer).__name__}'s "
                f"model ({type(trainer.model).__name__}) holds no sequence classifier: of sentence-transformers' models, "
                "a CrossEncoder with num_labels >= 2 gives class scores; an embedding model gives none."
            )
        check_calibrate_on_eval(
            self._spec(), self._dataset(trainer), self._label_names(trainer.args), task, self._argument
        )
        self._check_conformal_head(task)

    def _check_conformal_head(self, task: str | None) -> None:
        if isinstance(self.conformal, str) and (self.conformal == "crc") != (task == "multilabel"):
            raise ValueError(
                f"Expected argument `conformal` to be 'crc' for a multi-label head and 'thr' / 'aps' / 'raps' otherwise, "
                f"but got {self.conformal!r} for a {task or 'multiclass'} head."
            )

    def _spec(self) -> Any:
        return True if self.spec is None else self.spec  # True: temperature scaling, the sigmoid head's for one

    # ------------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        trainer = self._trainer()
        if trainer is not None and trainer.model is not None:
            self._check(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self._trainer()
        if trainer is not None:
            self._check(trainer)
        self.eval_calibration, self.conformal_predictor = None, None  # fitted on an earlier model: not this one's

    def on_train_end(self, args, state, control, model=None, eval_dataloader=None, **kwargs):
        trainer = self._trainer()
        if getattr(trainer, "_calibration_deferred", False):  # CalibrationTrainer: after its MaC-Cal stage
            return
        self.calibrate(trainer, model=model, eval_dataloader=eval_dataloader, args=args)

    def on_evaluate(self, args, state, control, model=None, eval_dataloader=None, **kwargs):
        if not self.every_evaluation:
            return
        trainer = self._trainer()
        if trainer is None:
            logger.warning("CalibrationCallback(on_evaluate=True) found no Trainer to log through: nothing logged.")
            return
        result = self._fit(trainer, model, eval_dataloader, args)[0]
        logs = {}
        for key in ("ece", "nll"):
            logs[f"eval_{key}_uncalibrated"] = result.before[key].value
            if result.after is not None:
                logs[f"eval_{key}_calibrated"] = result.after[key].value
        trainer.log(logs)

    def on_push_begin(self, args, state, control, **kwargs):
        if self.eval_calibration is not None and self.save_to_output_dir and _should_save(args):
            self.save(args.output_dir)  # the trainer's own save_model may have cleaned output_dir since

    # ------------------------------------------------------------------ the work
    def calibrate(
        self,
        trainer: Trainer | None = None,
        *,
        eval_dataset: Any = None,
        model: Any = None,
        eval_dataloader: Any = None,
        args: Any = None,
    ) -> EvalCalibration:
        """Fit on the eval split now (``on_train_end`` calls it); returns the :class:`EvalCalibration`. Every process
        must call it. ``trainer``: default the one bound; without one, ``model`` is run over ``eval_dataloader``."""
        trainer = trainer if trainer is not None else self._trainer()
        if trainer is not None:
            self.bind(trainer)
            args = trainer.args
        if args is None:
            raise ValueError("Expected a `trainer`, or `args` with `model` and `eval_dataloader`, but got neither.")
        self.eval_calibration, self.conformal_predictor = self._fit(trainer, model, eval_dataloader, args, eval_dataset)
        if self.save_to_output_dir and _should_save(args):
            self.save(args.output_dir)
        if trainer is not None and trainer.is_world_process_zero() and self.save_to_output_dir:
            self.add_to_model_card(trainer)
        return self.eval_calibration

    def _fit(self, trainer, model, eval_dataloader, args, eval_dataset=None) -> tuple[EvalCalibration, Any]:
        """Logits on every process, the fit on the main one, its result on every process."""
        model = trainer.model if trainer is not None else model
        task = _head_task(model)
        if trainer is not None:
            dataset = eval_dataset if eval_dataset is not None else self._dataset(trainer)
            check_calibrate_on_eval(self._spec(), dataset, self._label_names(args), task, self._argument)
            if _tokenizes_in_loss(trainer):
                logits, labels = _run_cross_encoder(trainer, dataset)
            else:
                prediction = trainer.predict(dataset, metric_key_prefix="calibration")
                logits, labels = prediction.predictions, prediction.label_ids
            if logits is None or labels is None:
                raise ValueError(
                    "Expected the trainer's predictions and labels on the eval split, but got none: set "
                    "prediction_loss_only=False and give the eval rows a label column (args.label_names)."
                )
        else:
            logits, labels = _run_model(model, eval_dataloader, self._label_names(args))
        fitted, error = None, None
        if not is_distributed() or torch.distributed.get_rank() == 0:
            try:
                fitted = self._fit_here(np.asarray(logits), np.asarray(labels), task, getattr(args, "seed", 0), model)
            except Exception as err:  # noqa: BLE001 - raised below on every process, not left to hang the others
                error = err
        if is_distributed():
            fitted, error = all_gather_object((fitted, error))[0]
        if error is not None:
            raise error
        return fitted

    def _fit_here(self, logits, labels, task, seed, model) -> tuple[EvalCalibration, Any]:
        spec = resolve_calibrator(self._spec(), task, self._argument)
        who = "calibrate_on_eval" if self._argument == "calibrate_on_eval" else type(self).__name__
        result = fit_eval_calibration(logits, labels, calibrator=spec, cv=self.cv, seed=seed, task=task, who=who)
        result.pipeline_task = _pipeline_task(model)
        predictor = None
        if self.conformal is not None:
            predictor = self._new_predictor(task, seed)
            keep = labels != IGNORE_INDEX if labels.ndim == 1 else slice(None)
            predictor.fit(logits[keep], labels[keep], alpha=self.alpha, calibrator=result.calibrator)
        return result, predictor

    def _new_predictor(self, task: str | None, seed: int):
        from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor

        if not isinstance(self.conformal, str):
            return copy.deepcopy(self.conformal)
        self._check_conformal_head(task)
        return (
            MultiLabelConformalPredictor() if self.conformal == "crc" else ConformalPredictor(self.conformal, seed=seed)
        )

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``calibrator/`` (and ``conformal/``) into ``folder``, replacing what an earlier save wrote there."""
        if self.eval_calibration is None:
            raise ValueError("Expected a fitted calibration to save, but nothing is fitted yet: train first.")
        self.eval_calibration.save(folder)
        if self.conformal_predictor is not None:
            self.conformal_predictor.save_pretrained(
                Path(folder) / CONFORMAL_FOLDER,
                overwrite=True,
                model_card_kwargs={"pipeline_task": self.eval_calibration.pipeline_task},
            )
        return Path(folder) / CALIBRATOR_FOLDER

    def add_to_model_card(self, trainer: Trainer, **given: Any) -> None:
        """Add the ECE / NLL before and after to the card ``trainer`` writes in ``output_dir`` (``README.md``)."""
        if self.eval_calibration is None:
            return
        args = trainer.args
        self.eval_calibration.add_to_model_card(
            os.path.join(args.output_dir, "README.md"),
            model_name=given.get("model_name") or Path(args.output_dir).absolute().name,
            repo_id=getattr(trainer, "hub_model_id", None) or args.hub_model_id,
            **dataset_fields(
                self._dataset(trainer), given.get("dataset_tags"), given.get("dataset"), given.get("dataset_args")
            ),
        )


def _should_save(args: Any) -> bool:
    """``args.should_save`` (the process that writes files); the main process for arguments without it."""
    default = not is_distributed() or torch.distributed.get_rank() == 0
    return bool(getattr(args, "should_save", default))


def _wrap_model_card(trainer: Trainer) -> None:
    """Make ``trainer.create_model_card`` (which ``push_to_hub`` calls, rewriting ``README.md``) add the results of the
    trainer's calibration callbacks to the card it writes. Instance attribute: the class is untouched."""
    if "create_model_card" in trainer.__dict__:
        return
    create = trainer.create_model_card

    def create_model_card(*args: Any, **kwargs: Any) -> None:
        create(*args, **kwargs)
        if not trainer.is_world_process_zero():
            return
        given = dict(inspect.signature(Trainer.create_model_card).bind(trainer, *args, **kwargs).arguments)
        given.pop("self", None)
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, CalibrationCallback) and callback.trainer is trainer:
                callback.add_to_model_card(trainer, **given)

    trainer.__dict__["create_model_card"] = create_model_card


def _tokenizes_in_loss(trainer: Trainer) -> bool:
    """sentence-transformers' ``CrossEncoderTrainer``: its collator hands raw text columns to the loss, which tokenizes
    the pairs with ``model.preprocess``, and ``predict`` returns no logits (its losses return no outputs)."""
    return callable(getattr(trainer, "collect_features", None)) and callable(getattr(trainer.model, "preprocess", None))


def _run_cross_encoder(trainer: Trainer, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """The logits and labels of a ``CrossEncoderTrainer``'s eval split, computed as its losses compute them: the
    trainer's eval dataloader (its collator, its sharding across processes), ``trainer.collect_features`` for the
    text columns and the label, ``model.preprocess`` on the (first, second) pairs, ``model(features)["scores"]``."""
    model = trainer.model
    if callable(getattr(trainer, "preprocess_dataset", None)):
        dataset = trainer.preprocess_dataset(dataset, dataset_name="eval")
    loader = trainer.get_eval_dataloader(dataset)

    def forward(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        batch = dict(batch)
        batch.pop("dataset_name", None)
        options = {key: batch.pop(key) for key in ("prompt", "task") if key in batch}
        features, labels = trainer.collect_features(batch)
        if labels is None or len(features) != 2:
            raise ValueError(
                f"Expected the eval split of {type(trainer).__name__} to hold two text columns and a label column "
                f"(sentence pairs and their classes), but got {len(features)} text columns and "
                f"{'a' if labels is not None else 'no'} label."
            )
        tokens = model.preprocess(list(zip(*features)), **options)
        tokens = {k: (v.to(model.device) if isinstance(v, torch.Tensor) else v) for k, v in tokens.items()}
        return model(tokens)["scores"], torch.as_tensor(labels)

    return _run_batches(model, loader, forward)


def _run_model(model: Any, loader: Any, label_names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every process's logits and labels over ``loader`` (accelerate's padding of uneven splits dropped), gathered in
    rank order; the model in eval mode, without gradients, its mode restored after."""
    if model is None or loader is None:
        raise ValueError(
            "Expected the trainer's eval dataloader to fit the calibrator on, but got none: give the trainer an "
            "eval_dataset (and evaluate), or call callback.calibrate(trainer)."
        )
    device = next(model.parameters()).device

    def forward(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        name = next((n for n in label_names if n in batch), None)
        if name is None:
            raise ValueError(f"Expected each eval batch to hold labels under one of {list(label_names)}.")
        inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items() if k != name}
        return model(**inputs).logits, torch.as_tensor(batch[name])

    return _run_batches(model, loader, forward)


def _run_batches(model: Any, loader: Any, forward: Any) -> tuple[np.ndarray, np.ndarray]:
    """``forward(batch) -> (logits, labels)`` over ``loader``, this process's rows gathered with the others' in rank
    order, accelerate's padding of uneven splits dropped; the model in eval mode, without gradients, its mode restored
    after."""
    was_training, logits, labels = model.training, [], []
    model.eval()
    try:
        with torch.no_grad():
            for batch in loader:
                z, y = forward(batch)
                z, y = z.float().cpu(), y.cpu()
                padded = even_batches_padding(z.shape[0])
                if padded is None:
                    raise ValueError(
                        "The eval dataloader pads its last batches (accelerate's even_batches) where the padding cannot "
                        "be located: call callback.calibrate(trainer) with the Trainer instead."
                    )
                logits.append(z[: z.shape[0] - padded])
                labels.append(y[: y.shape[0] - padded])
    finally:
        model.train(was_training)
    return all_gather_rows(torch.cat(logits)).numpy(), all_gather_rows(torch.cat(labels)).numpy()
