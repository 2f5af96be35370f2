"""`CalibrationTrainer`: a transformers `Trainer` that trains with the calibration losses of `hf_calibration.losses`.

What it adds to `Trainer(..., compute_loss_func=loss)`:

* the loss may be given as an instance or as a class (``compute_loss=FeDLaSLoss``, the product card's spelling, or
  ``compute_loss_func=FeDLaSLoss``): a class is built with its defaults, and a loss that needs ``num_classes``
  gets ``model.config.num_labels``;
* losses with ``requires_features`` (FeDLaS) get the classifier's input, captured by a forward pre-hook on the
  model's classification head (``hf_calibration._core.features``) while the loss is computed;
* the FeDLaS gate is drawn from ``args.seed`` (unless the loss has a ``seed`` of its own or a loaded / trained
  state), and under DDP every process starts from rank 0's loss state, so one seed gives one run;
* the loss's own parameters (the FeDLaS gate) are trained by the Trainer's optimizer, and under DDP their
  gradients are averaged across processes before clipping and the optimizer step (DDP only syncs the model's);
  ``max_grad_norm`` clips model and gate gradients together, by one global norm;
* the loss state (gate weights and EMA buffers) is saved as ``calibration_loss.safetensors`` in every checkpoint
  and in ``save_model``'s folder, and restored by ``train(resume_from_checkpoint=...)`` and by
  ``load_best_model_at_end``, together with every model weight (transformers 5 saves some models under other
  weight names than it loads them with; those are reloaded through ``from_pretrained``);
* the loss follows the model's train/eval mode, so ``evaluate()`` never moves EMA statistics, and eval
  predictions stay plain logits (no hidden states are requested);
* optional Mixup (Zhang et al. 2018) in training, ``mixup_alpha > 0``: the stage 1 that MaC-Cal pairs with;
* the optional MaC-Cal second stage runs after ``train()`` when ``maccal=MaCCalConfig(...)`` is given;
* with ``calibrate_on_eval``, a calibrator is fitted on the eval split once training (and MaC-Cal) is over, saved in
  ``calibrator/`` by ``save_model`` / ``push_to_hub``, its results on the model card: a ``CalibrationCallback``
  (``hf_calibration.training.callback``) that this trainer adds and fits after MaC-Cal, as it does any
  ``CalibrationCallback`` it is given.

The loss normalisation follows transformers' ``compute_loss_func`` contract: the loss returns
``sum / num_items_in_batch`` and the Trainer neither divides it by the gradient-accumulation steps nor
averages it itself, so gradient accumulation and multi-process training give the gradient of one big batch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback

from hf_calibration._core.checks import check_float
from hf_calibration._core.features import FeatureCapture, find_classifier_head
from hf_calibration.training.callback import CalibrationCallback

logger = logging.getLogger(__name__)

LOSS_STATE_NAME = "calibration_loss.safetensors"

__all__ = ["CalibrationTrainer", "CalibrationLossCallback", "LOSS_STATE_NAME"]


def _requires_features(loss: Any) -> bool:
    return bool(getattr(loss, "requires_features", False))


def _trainable(loss: Any) -> list[tuple[str, nn.Parameter]]:
    if not isinstance(loss, nn.Module):
        return []
    return [(n, p) for n, p in loss.named_parameters() if p.requires_grad]


def average_gradients(parameters: list[nn.Parameter]) -> None:
    """All-reduce (mean) the gradients of parameters that live outside the DDP-wrapped model.

    One flat all-reduce; a missing gradient counts as zero so that every rank joins the same collective.
    """
    import torch.distributed as dist

    if not parameters or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for p, g in zip(parameters, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def _head_task(model: Any) -> str | None:
    """The model's head kind by its config (``hf_calibration._core.tasks``); None without a model or a config that names one."""
    from hf_calibration._core.tasks import task_of_model

    if model is None:
        return None
    try:
        return task_of_model(model)
    except ValueError:  # a regression head, or one logit without a problem type: the Trainer's own business
        return None


# softmax losses with a sigmoid counterpart: what to use on a multi-label / binary head instead
_SIGMOID_COUNTERPART = {
    "CrossEntropyLoss": "BinaryCrossEntropyLoss",
    "LabelSmoothingLoss": "BinaryLabelSmoothingLoss",
    "FocalLoss": "SigmoidFocalLoss",
    "FLSD53Loss": "SigmoidFocalLoss",
}


def check_loss_for_head(loss: Any, task: str | None, model: Any = None) -> None:
    """Refuse a softmax loss on a sigmoid (binary / multi-label) head and the reverse, naming ``problem_type``. MbLS and
    FeDLaS are defined on the softmax by their papers (the gaps to the largest logit; a gate over softmax confidences):
    they have no sigmoid form and are refused on a sigmoid head."""
    from hf_calibration.losses import CalibrationLoss

    if task is None or not isinstance(loss, CalibrationLoss):
        return
    problem_type = getattr(getattr(model, "config", None), "problem_type", None)
    name = type(loss).__name__
    sigmoid_loss = bool(getattr(loss, "sigmoid_head", False))
    if task in ("binary", "multilabel") and not sigmoid_loss:
        counterpart = _SIGMOID_COUNTERPART.get(name)
        if counterpart is None:
            why = (
                f"{name} is defined by its paper for a softmax head (MbLS penalises the gaps to the largest logit, FeDLaS "
                "gates label smoothing by a softmax over the logits), and has no sigmoid form"
            )
            fix = "use BinaryCrossEntropyLoss, SigmoidFocalLoss, BinaryLabelSmoothingLoss or AsymmetricLoss"
        else:
            why = f"{name} reads the logits as one softmax over classes"
            fix = f"use {counterpart} (its sigmoid form), or AsymmetricLoss"
        raise ValueError(
            f"Expected a loss for the model's {task} sigmoid head (config.problem_type={problem_type!r}), but {why}: "
            f"{fix}."
        )
    if task == "multiclass" and sigmoid_loss:
        raise ValueError(
            f"Expected a softmax loss for the model's multi-class head (config.problem_type={problem_type!r}), but "
            f"{name} treats every logit as its own sigmoid: use CrossEntropyLoss, FocalLoss, LabelSmoothingLoss, "
            "... (or set config.problem_type='multi_label_classification' if each image carries several labels)."
        )


class CalibrationLossCallback(TrainerCallback):
    """Clears the loss parameters' gradients after each optimizer step.

    The Trainer calls ``model.zero_grad()`` after ``optimizer.step()``; the loss is not part of the model,
    so without this its gradients would accumulate across steps.
    """

    def __init__(self, loss: nn.Module):
        self.loss = loss

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.loss.zero_grad(set_to_none=True)


class CalibrationTrainer(Trainer):
    """`Trainer` for calibration losses: feature capture, loss parameters, loss checkpoints, MaC-Cal.

    Args:
        compute_loss_func: a loss of ``hf_calibration.losses``, as an instance (``FeDLaSLoss(num_classes=10)``)
            or as a class (``FeDLaSLoss``: built with its defaults, ``num_classes`` from ``model.config.num_labels``),
            or any callable with transformers' ``compute_loss_func(outputs, labels, num_items_in_batch)`` contract.
            ``None`` trains with the model's own loss, exactly as `Trainer` does.
        compute_loss: the same argument under the product card's name (``CalibrationTrainer(..., compute_loss=FeDLaSLoss)``);
            give one of the two.
        head: dotted attribute path of the model's final ``nn.Linear`` (e.g. ``"classifier"``) when the model is
            not one whose head is found automatically (ViT, Swin, ResNet, timm through
            ``TimmWrapperForImageClassification``...). Only used by losses that need features and by MaC-Cal.
        maccal: a ``hf_calibration.maccal.MaCCalConfig``; when set, ``train()`` runs the MaC-Cal second stage
            (``run_maccal``) once normal training has finished.
        maccal_dataset: the data MaC-Cal retrains the head on: held-out, non-augmented images (``MaCCalConfig`` says
            why: the paper's training images made ECE worse wherever the model fits them). Default ``train_dataset``,
            with a warning.
        mixup_alpha: Mixup in training (Zhang et al. 2018): each training batch's ``pixel_values`` become
            ``λ·x + (1 − λ)·x[π]`` for a random permutation π and ``λ ~ Beta(α, α)``, and the loss
            ``λ·L(z, y) + (1 − λ)·L(z, y[π])``, with this trainer's loss (cross-entropy when none is given; a FeDLaS
            loss moves its statistics once per batch). ``0`` (default) turns it off; evaluation never mixes. λ and π
            are drawn from ``(args.seed, global step, micro-batch)``, so a resumed run draws what the first run
            would have. MaC-Cal pairs a Mixup stage 1 with a stage 2 on clean data (its Table 3: CIFAR-10 Mixup
            2.40 → 1.10 % ECE): pass ``maccal`` too.
        calibrate_on_eval: ``True`` (temperature scaling), a calibrator kind (``"smart"``, ...) or an unfitted
            ``Calibrator``: fitted on ``eval_dataset`` at the end of ``train()`` (``trainer.calibrator``), saved in
            ``calibrator/`` beside the model by ``save_model`` and ``push_to_hub``, whose model card then carries ECE
            and NLL before / after as ``model-index`` results (see :mod:`hf_calibration.training.eval_calibration`).
        endpoint_handler: with ``calibrate_on_eval``, ``save_model`` (hence ``push_to_hub``) also writes
            ``handler.py`` and ``requirements.txt`` beside the model, so that a Hugging Face Inference Endpoint serves
            calibrated scores (``hf_calibration.serving.write_endpoint_handler``); ``True`` (the requirement of the code
            installed here, as ``push-metrics`` writes it) or the ``requirements.txt`` line that installs hf-calibration
            there (a string, needed when it was installed from a local folder). Needs ``processing_class``.
        **kwargs: everything `Trainer` takes (``model``, ``args``, ``train_dataset``, ``optimizers`` ...).

    The loss's trainable parameters join the optimizer as extra parameter groups, with the Trainer's learning
    rate and the Trainer's weight-decay policy (no decay on biases), and are scheduled like the model's. When you
    pass your own ``optimizers=(optimizer, scheduler)``, add them yourself (``trainer.calibration_loss.parameters()``).

    Example::

        from hf_calibration import CalibrationTrainer, FeDLaSLoss

        trainer = CalibrationTrainer(model=model, args=args, train_dataset=train, compute_loss=FeDLaSLoss)
        trainer.train()
    """

    # private Trainer methods overridden below; a transformers release without one would skip the override silently
    # (the gate unclipped, a checkpoint's loss state not restored): refuse it instead
    _OVERRIDDEN = ("_clip_grad_norm", "_load_from_checkpoint", "_load_best_model", "_issue_warnings_after_load")

    def __init__(
        self,
        *args: Any,
        compute_loss_func: Callable | type | None = None,
        compute_loss: Callable | type | None = None,
        head: str | None = None,
        maccal: Any = None,
        maccal_dataset: Any = None,
        mixup_alpha: float = 0.0,
        calibrate_on_eval: Any = None,
        endpoint_handler: bool | str = False,
        **kwargs: Any,
    ):
        missing = [name for name in self._OVERRIDDEN if not hasattr(Trainer, name)]
        if missing:
            import transformers

            raise ImportError(
                f"CalibrationTrainer overrides Trainer.{', Trainer.'.join(missing)}, which transformers "
                f"{transformers.__version__} does not have: install the transformers range hf-calibration declares "
                "(pip install -U hf-calibration)."
            )
        if compute_loss is not None and compute_loss_func is not None:
            raise TypeError(
                "Expected one of the arguments `compute_loss` and `compute_loss_func` (the same loss under two names), "
                "but got both."
            )
        loss = compute_loss_func if compute_loss is None else compute_loss
        name = "compute_loss_func" if compute_loss is None else "compute_loss"
        if head is not None and not isinstance(head, str):
            raise TypeError(f"Expected argument `head` to be a dotted attribute path (str), but got {head!r}.")
        self.mixup_alpha = check_float(mixup_alpha, "mixup_alpha", minimum=0.0)
        self.head_task = _head_task(kwargs.get("model", args[0] if args else None))
        if self.mixup_alpha > 0 and loss is None:
            from hf_calibration.losses import BinaryCrossEntropyLoss, CrossEntropyLoss

            # the model's own loss sees one label per sample: mix through ours (the sigmoid head's own loss is BCE)
            loss = BinaryCrossEntropyLoss() if self.head_task in ("binary", "multilabel") else CrossEntropyLoss()
        if isinstance(loss, type) and not issubclass(loss, nn.Module):
            raise TypeError(
                f"Expected argument `{name}` to be a loss instance or a loss class (an nn.Module), but got {loss!r}."
            )
        if loss is not None and not callable(loss):
            raise TypeError(f"Expected argument `{name}` to be callable, but got {loss!r}.")
        self.calibration_loss = loss  # a class is built below, once the model is known
        self.head = head
        self.maccal = maccal
        self.maccal_dataset = maccal_dataset
        self._needs_features = _requires_features(loss)
        self._capture: FeatureCapture | None = None
        self._mixup: tuple[torch.Tensor, float] | None = None  # (π, λ) of the batch being trained on
        self._mixup_draw = (-1, 0)  # (global step, micro-batches drawn at that step)
        self._silence_load_warnings = False
        # Trainer only checks that `compute_loss_func` is set (it then counts `num_items_in_batch` and trusts the
        # loss's normalisation); the call goes through `_compute_calibration_loss`, which adds the features
        super().__init__(*args, compute_loss_func=None if loss is None else self._compute_calibration_loss, **kwargs)

        if isinstance(loss, type):
            self.calibration_loss = loss()
        if self._needs_features:
            if self.args.n_gpu > 1:
                raise ValueError(
                    "A loss that needs features cannot run under torch.nn.DataParallel (the head's hook would see "
                    "one replica's features only): launch with torchrun or `accelerate launch` (DDP) instead."
                )
            if self.model is not None:
                find_classifier_head(self.model, head)  # fail now, not at the first step, when there is no head
        if isinstance(self.calibration_loss, nn.Module):
            self._prepare_loss(self.calibration_loss)
        if maccal is not None and self.model is not None:
            from hf_calibration.maccal.stage import check_softmax_head

            check_softmax_head(self.model)
        self._init_calibrate_on_eval(calibrate_on_eval, endpoint_handler)

    # -- the calibrator fitted on the eval split: a CalibrationCallback, fitted after MaC-Cal ------------
    def _init_calibrate_on_eval(self, spec: Any, endpoint_handler: bool | str = False) -> None:
        self.calibrate_on_eval = None if spec is None or spec is False else spec
        if not isinstance(endpoint_handler, (bool, str)):
            raise TypeError(
                f"Expected argument `endpoint_handler` to be a bool or a requirement line (str), but got {endpoint_handler!r}."
            )
        if endpoint_handler is not False and self.calibrate_on_eval is None:
            raise ValueError(
                "Expected argument `calibrate_on_eval` with `endpoint_handler`: the handler serves the calibrated model."
            )
        if endpoint_handler is not False and getattr(self, "processing_class", None) is None:
            raise ValueError(
                "Expected argument `processing_class` (the model's image processor) with `endpoint_handler`: the "
                "Endpoint reads images through it, and save_model writes it beside the model only when it is given."
            )
        if endpoint_handler is True:  # resolved now: an install with no address to give fails before training
            from hf_calibration._core.version import package_requirement

            endpoint_handler = package_requirement()
        self.endpoint_handler = endpoint_handler
        self.calibration_callback: CalibrationCallback | None = None
        if self.calibrate_on_eval is not None:
            self._add_calibration_callback(self.calibrate_on_eval)

    def _add_calibration_callback(self, spec: Any, check: bool = True) -> CalibrationCallback:
        """``calibrate_on_eval``'s callback: saved by ``save_model`` (not at the end of training: ``save_model``
        writes it, as it writes the model), checked now against the eval split (``check``)."""
        callback = CalibrationCallback(spec, save=False, _argument="calibrate_on_eval").bind(self)
        if check:
            callback._check(self)
        self.calibration_callback = callback
        self.add_callback(callback)
        return callback

    def _calibration_callbacks(self) -> list[CalibrationCallback]:
        return [c for c in self.callback_handler.callbacks if isinstance(c, CalibrationCallback)]

    @property
    def eval_calibration(self):
        """The :class:`EvalCalibration` of ``calibrate_on_eval`` (None before it is fitted)."""
        return None if self.calibration_callback is None else self.calibration_callback.eval_calibration

    @property
    def calibrator(self):
        """The calibrator fitted on the eval split (None before ``fit_calibrator``)."""
        return None if self.calibration_callback is None else self.calibration_callback.calibrator

    def fit_calibrator(self, eval_dataset: Any = None):
        """Fit ``calibrate_on_eval``'s calibrator (temperature scaling if unset) on the eval split's logits; returns the
        :class:`EvalCalibration`, also ``trainer.eval_calibration``. ``train()`` calls it last; call it again after
        changing the model. Every process must call it (``predict`` gathers the split)."""
        callback = self.calibration_callback or self._add_calibration_callback(True, check=False)
        return callback.calibrate(self, eval_dataset=eval_dataset)

    def _prepare_loss(self, loss: nn.Module) -> None:
        """Fill the loss's ``num_classes`` from the model, seed its gate from ``args.seed``, put it on the device."""
        check_loss_for_head(loss, self.head_task, self.model)
        if hasattr(loss, "set_num_classes"):
            num_labels = self._num_labels()
            if getattr(loss, "num_classes", None) is None:
                if num_labels is None:
                    raise ValueError(
                        f"Expected `{type(loss).__name__}` to be given `num_classes`, or a model whose `config.num_labels` "
                        "gives it, but got neither."
                    )
                loss.set_num_classes(num_labels)
            elif num_labels is not None and loss.num_classes != num_labels:
                raise ValueError(
                    f"Expected the loss's `num_classes` ({loss.num_classes}) to equal the model's number of labels "
                    f"({num_labels}), but they differ."
                )
        if getattr(loss, "gate_from_global_rng", False):  # not seeded, loaded or trained: one seed, one run
            loss.reset_gate(self.args.seed)
        loss.to(self.args.device)
        if _trainable(loss):
            self.add_callback(CalibrationLossCallback(loss))

    def _num_labels(self) -> int | None:
        """The model's number of classes: ``config.num_labels``, else the classification head's width."""
        num_labels = getattr(getattr(self.model, "config", None), "num_labels", None)
        if isinstance(num_labels, int):
            return num_labels
        try:
            return find_classifier_head(self.model, self.head)[2].out_features
        except (ValueError, AttributeError):
            return None

    # -- features ------------------------------------------------------------------------------
    def _capture_for(self, model: nn.Module) -> FeatureCapture:
        """A hook on the head of the *unwrapped* model (DDP / accelerate wrappers have no head attribute).

        Resolved afresh at each call (a few attribute look-ups): the head may have been replaced since, e.g. by
        MaC-Cal's bottleneck head, whose input is the same pre-classifier feature.
        """
        self._capture = FeatureCapture(self.accelerator.unwrap_model(model), self.head)
        return self._capture

    def _compute_calibration_loss(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None):
        """What `Trainer` calls as ``compute_loss_func``: the loss, with the captured features when it needs them,
        and under Mixup ``λ·L(z, y) + (1 − λ)·L(z, y[π])``."""
        extra = {}
        if self._needs_features:
            features = self._capture.pop() if self._capture is not None else None
            if features is None:
                raise ValueError(
                    f"The classification head {self.head or '(auto-detected)'} was not called during the forward pass, "
                    "so the loss got no features: pass `head=` with the dotted path of the Linear that produces the logits."
                )
            extra["features"] = features
        loss = self.calibration_loss(outputs, labels, num_items_in_batch=num_items_in_batch, **extra)
        if self._mixup is None:
            return loss
        perm, lam = self._mixup
        module = self.calibration_loss if isinstance(self.calibration_loss, nn.Module) else None
        was_training = module is not None and module.training
        if was_training:
            module.eval()  # the partner labels' term: statistics (FeDLaS's EMA) move once per batch
        try:
            partner = self.calibration_loss(outputs, labels[perm], num_items_in_batch=num_items_in_batch, **extra)
        finally:
            if was_training:
                module.train()
        return lam * loss + (1.0 - lam) * partner

    def _mix_batch(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Mixup of one training batch (``mixup_alpha``): mixed ``pixel_values``, and (π, λ) kept for the loss."""
        pixels, labels = inputs.get("pixel_values"), inputs.get("labels")
        if not isinstance(pixels, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise ValueError(
                "Expected each training batch to hold `pixel_values` and `labels` tensors for `mixup_alpha` > 0, "
                f"but got keys {sorted(inputs)}."
            )
        import numpy as np

        step, drawn = self._mixup_draw
        drawn = drawn + 1 if step == self.state.global_step else 0
        self._mixup_draw = (self.state.global_step, drawn)
        rng = np.random.default_rng((self.args.seed, self.state.global_step, drawn))
        lam = float(rng.beta(self.mixup_alpha, self.mixup_alpha))
        perm = torch.from_numpy(rng.permutation(labels.shape[0])).to(labels.device)
        self._mixup = (perm, lam)
        mixed = pixels * lam + pixels.index_select(0, perm.to(pixels.device)) * (1.0 - lam)
        return {**inputs, "pixel_values": mixed}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if isinstance(self.calibration_loss, nn.Module):
            # keep the loss's mode in step with the model's: EMA statistics move only in training
            self.calibration_loss.train(model.training)
        if self.mixup_alpha > 0 and model.training:
            inputs = self._mix_batch(inputs)
        capture = self._capture_for(model).attach() if self._needs_features else None
        try:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        finally:
            self._mixup = None
            if capture is not None:
                capture.remove()

    # -- loss parameters: optimizer and gradient sync ----------------------------------------
    def create_optimizer(self, *args: Any, **kwargs: Any):
        given = self.optimizer is not None
        optimizer = super().create_optimizer(*args, **kwargs)
        named = _trainable(self.calibration_loss)
        if not named:
            return optimizer
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [(n, p) for n, p in named if id(p) not in present]
        if not missing:
            return optimizer
        if given:
            logger.warning(
                "The optimizer you passed does not hold the loss's parameters (%s): they will not be trained. "
                "Add `trainer.calibration_loss.parameters()` to it.",
                ", ".join(n for n, _ in missing),
            )
            return optimizer
        decay = set(self.get_decay_parameter_names(self.calibration_loss))
        for wd, params in (
            (self.args.weight_decay, [p for n, p in missing if n in decay]),
            (0.0, [p for n, p in missing if n not in decay]),
        ):
            if params:
                optimizer.add_param_group({"params": params, "weight_decay": wd})
        return optimizer

    def training_step(self, model, inputs, num_items_in_batch=None, *args, **kwargs):
        loss = super().training_step(model, inputs, num_items_in_batch, *args, **kwargs)
        # DDP averages the model's gradients only; the loss lives outside the wrapped model. Average its
        # gradients on the micro-step that precedes clipping and the optimizer step.
        if self.args.world_size > 1 and self.accelerator.sync_gradients:
            average_gradients([p for _, p in _trainable(self.calibration_loss)])
        return loss

    def _clip_grad_norm(self, model):
        """Clip the model's and the loss's gradients together, by one global norm (the gate is trained as part of
        the model); returns the pre-clip norm. Sharded set-ups (FSDP, DeepSpeed, ...) clip the model alone."""
        from accelerate.utils import DistributedType

        params = [p for _, p in _trainable(self.calibration_loss)]
        simple = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
        if not params or self.accelerator.distributed_type not in simple:
            return super()._clip_grad_norm(model)
        return self.accelerator.clip_grad_norm_([*model.parameters(), *params], self.args.max_grad_norm)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (as `Trainer` does) and, beside it, the loss state (gate weights, EMA buffers), and with
        ``calibrate_on_eval`` the calibrator in ``calibrator/`` (and the Endpoint handler)."""
        super().save_model(output_dir, _internal_call=_internal_call)
        folder = output_dir if output_dir is not None else self.args.output_dir
        self.save_loss_state(folder)
        if self.eval_calibration is not None and self.args.should_save:
            self.calibration_callback.save(folder)
            if self.endpoint_handler is not False:
                from hf_calibration.serving import write_endpoint_handler

                write_endpoint_handler(folder, requirement=self.endpoint_handler, overwrite=True)  # the package's own

    def save_loss_state(self, output_dir: str) -> None:
        loss = self.calibration_loss
        if not isinstance(loss, nn.Module) or not self.args.should_save:
            return
        state = loss.state_dict()
        if not state:
            return
        from safetensors.torch import save_file

        os.makedirs(output_dir, exist_ok=True)
        save_file(
            {k: v.detach().cpu().contiguous().clone() for k, v in state.items()},
            os.path.join(output_dir, LOSS_STATE_NAME),
        )

    def load_loss_state(self, checkpoint_dir: str) -> bool:
        """Restore the loss state saved in ``checkpoint_dir``; False when the folder holds none."""
        loss = self.calibration_loss
        path = os.path.join(checkpoint_dir, LOSS_STATE_NAME)
        if not isinstance(loss, nn.Module) or not loss.state_dict():
            return False
        if not os.path.isfile(path):
            logger.warning("No %s in %s: the loss state (gate, EMA statistics) starts afresh.", LOSS_STATE_NAME, path)
            return False
        from safetensors.torch import load_file

        loss.load_state_dict(load_file(path), strict=True)
        return True

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with self._restoring_every_weight(resume_from_checkpoint, model):
            out = super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.load_loss_state(resume_from_checkpoint)
        return out

    def _load_best_model(self, *args: Any, **kwargs: Any):
        best = self.state.best_model_checkpoint
        with self._restoring_every_weight(best):
            out = super()._load_best_model(*args, **kwargs)
        if best:
            self.load_loss_state(best)
        return out

    @contextlib.contextmanager
    def _restoring_every_weight(self, checkpoint_dir: str | None, model: nn.Module | None = None):
        """Work around `Trainer` loading checkpoints whose saved weight names differ from the model's module names.

        transformers 5.x saves some models (ViT, Swin) under their legacy weight names, while ``Trainer`` loads a
        checkpoint file (``resume_from_checkpoint``, ``load_best_model_at_end``) with
        ``load_state_dict(strict=False)``: every renamed weight is silently left at its current value, with a
        "missing keys" warning. ``from_pretrained`` applies the renaming, so when the names differ, the weights are
        reloaded through it once `Trainer` is done, and its warning about exactly those keys is replaced by one line.
        """
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        renamed = checkpoint_dir is not None and self._saved_names_differ(checkpoint_dir, target)
        self._silence_load_warnings = renamed
        try:
            yield
        finally:
            self._silence_load_warnings = False
        if renamed:
            self._reload_through_from_pretrained(checkpoint_dir, target)

    def _saved_names_differ(self, checkpoint_dir: str, target: nn.Module) -> bool:
        from transformers import PreTrainedModel

        path = os.path.join(checkpoint_dir, "model.safetensors")
        if (
            not isinstance(target, PreTrainedModel)
            or not os.path.isfile(path)
            or self.is_deepspeed_enabled
            or self.is_fsdp_enabled
        ):
            return False
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            saved = set(f.keys())
        return saved != set(target.state_dict())

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        if not self._silence_load_warnings:
            return super()._issue_warnings_after_load(load_result)
        logger.info(
            "%d weights are saved under transformers' checkpoint names: they are restored through from_pretrained.",
            len(load_result.missing_keys),
        )

    def _reload_through_from_pretrained(self, checkpoint_dir: str, target: nn.Module) -> None:
        """Load every weight of ``checkpoint_dir`` into ``target`` through ``from_pretrained`` (which renames them)."""
        from hf_calibration.maccal.persistence import CONFIG_KEY, load_maccal_model

        if getattr(target.config, CONFIG_KEY, None) is not None:  # a MaC-Cal head: its loader rebuilds it
            fresh, info = load_maccal_model(checkpoint_dir, model_class=type(target), output_loading_info=True)
        else:
            fresh, info = type(target).from_pretrained(checkpoint_dir, output_loading_info=True)
        stray = {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}
        if stray:
            logger.warning("Checkpoint %s does not match the model: %s.", checkpoint_dir, stray)
        target.load_state_dict(fresh.state_dict(), strict=True)

    def train(self, *args: Any, **kwargs: Any):
        self._broadcast_loss_state()
        self._calibration_deferred = True  # the calibration callbacks fit after MaC-Cal, on the final model
        try:
            output = super().train(*args, **kwargs)
        finally:
            self._calibration_deferred = False
        if self.maccal is not None:
            self.run_maccal()
        for callback in self._calibration_callbacks():  # last: the calibrator is fitted on the final model
            callback.calibrate(self)
        return output

    def _broadcast_loss_state(self) -> None:
        """Under several processes, start every process from rank 0's loss state (gate and EMA statistics), as DDP
        does for the model's parameters and buffers."""
        import torch.distributed as dist

        loss = self.calibration_loss
        if not isinstance(loss, nn.Module) or not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size() < 2:
            return
        with torch.no_grad():
            for tensor in loss.state_dict().values():
                dist.broadcast(tensor, src=0)

    # -- MaC-Cal ---------------------------------------------------------------------------------
    def run_maccal(self):
        """Run the MaC-Cal second stage on the trained model (frozen backbone, masked bottleneck head).

        The stage's base loss is this trainer's loss (a copy: FeDLaS gets the cached features and its gate
        is retrained with the head), cross-entropy when the trainer uses the model's own loss. Its progress bars
        follow ``args.disable_tqdm``, and each epoch is logged (``maccal/retention``, ``maccal/train_accuracy``,
        ...) on the stage's own step axis: the callbacks (TensorBoard, W&B, ...) see ``state.global_step`` equal
        to the stage's epoch, so every epoch is a point of its own.
        """
        if self.maccal is None:
            raise ValueError("Expected argument `maccal` to be a MaCCalConfig to run the MaC-Cal stage, but got None.")
        from hf_calibration.maccal import MaCCalConfig, maccal_stage

        if not isinstance(self.maccal, MaCCalConfig):
            raise TypeError(f"Expected argument `maccal` to be a MaCCalConfig, but got {type(self.maccal).__name__}.")
        config = self.maccal
        if config.progress and (self.args.disable_tqdm or not self.is_local_process_zero()):
            config = dataclasses.replace(config, progress=False)
        if self.maccal_dataset is None:
            logger.warning(
                "MaC-Cal retrains the head on `train_dataset`: on a model that fits its training set the head relearns "
                "the over-confidence (ECE about twice stage 1's on CIFAR-10, benchmarks/training_cifar.py). Pass "
                "`maccal_dataset=` held-out, non-augmented images (see MaCCalConfig)."
            )
        base = self.calibration_loss
        if not isinstance(base, nn.Module):
            base = None  # the model's own loss or a plain function: the stage's default (cross-entropy)
        return maccal_stage(
            self.model,
            self.maccal_dataset if self.maccal_dataset is not None else self.train_dataset,
            config,
            data_collator=self.data_collator,
            loss=base,
            head=self.head,
            log_fn=self._log_maccal_epoch,
        )

    def _log_maccal_epoch(self, logs: dict[str, float]) -> None:
        """`Trainer.log` for one MaC-Cal epoch, with ``state.global_step`` = the stage's epoch for the callbacks
        (the trainer's own state is left alone; its ``log_history`` gets the record at the trainer's step)."""
        state = copy.copy(self.state)
        state.global_step = int(logs["maccal/epoch"])
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, state, self.control, logs)
