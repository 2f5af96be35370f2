"""`CalibrationTrainer`: a transformers `Trainer` that trains with the calibration losses of `hf_calibration.losses`.

What it adds to `Trainer(..., compute_loss_func=loss)`:

* losses with ``requires_features`` (FeDLaS) get the classifier's input, captured by a forward pre-hook on the
  model's classification head (``hf_calibration.features``) while the loss is computed;
* the loss's own parameters (the FeDLaS gate) are trained by the Trainer's optimizer, and under DDP their
  gradients are averaged across processes before clipping and the optimizer step (DDP only syncs the model's);
  ``max_grad_norm`` clips model and gate gradients together, by one global norm;
* the loss state (gate weights and EMA buffers) is saved as ``calibration_loss.safetensors`` in every checkpoint
  and in ``save_model``'s folder, and restored by ``train(resume_from_checkpoint=...)``;
* the loss follows the model's train/eval mode, so ``evaluate()`` never moves EMA statistics, and eval
  predictions stay plain logits (no hidden states are requested);
* the optional MaC-Cal second stage runs after ``train()`` when ``maccal=MaCCalConfig(...)`` is given.

The loss normalisation follows transformers' ``compute_loss_func`` contract: the loss returns
``sum / num_items_in_batch`` and the Trainer neither divides it by the gradient-accumulation steps nor
averages it itself, so gradient accumulation and multi-process training give the gradient of one big batch.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch
from torch import nn
from transformers import Trainer, TrainerCallback

from .features import FeatureCapture, find_classifier_head

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
        compute_loss_func: a loss of ``hf_calibration.losses`` (e.g. ``FeDLaSLoss(num_classes=10)``) or any
            callable with transformers' ``compute_loss_func(outputs, labels, num_items_in_batch)`` contract.
            ``None`` trains with the model's own loss, exactly as `Trainer` does.
        head: dotted attribute path of the model's final ``nn.Linear`` (e.g. ``"classifier"``) when the model is
            not one whose head is found automatically (ViT, Swin, ResNet, timm through
            ``TimmWrapperForImageClassification``...). Only used by losses that need features and by MaC-Cal.
        maccal: a ``hf_calibration.maccal.MaCCalConfig``; when set, ``train()`` runs the MaC-Cal second stage
            (``run_maccal``) once normal training has finished.
        maccal_dataset: the data MaC-Cal retrains the head on. The paper uses the original, non-augmented
            training images: pass them here when ``train_dataset`` applies augmentation (default: ``train_dataset``).
        **kwargs: everything `Trainer` takes (``model``, ``args``, ``train_dataset``, ``optimizers`` ...).

    The loss's trainable parameters join the optimizer as extra parameter groups, with the Trainer's learning
    rate and the Trainer's weight-decay policy (no decay on biases), and are scheduled like the model's. When you
    pass your own ``optimizers=(optimizer, scheduler)``, add them yourself (``trainer.calibration_loss.parameters()``).

    Example::

        from hf_calibration import CalibrationTrainer
        from hf_calibration.losses import FeDLaSLoss

        trainer = CalibrationTrainer(model=model, args=args, train_dataset=train,
                                     compute_loss_func=FeDLaSLoss(num_classes=10))
        trainer.train()
    """

    def __init__(
        self,
        *args: Any,
        compute_loss_func: Callable | None = None,
        head: str | None = None,
        maccal: Any = None,
        maccal_dataset: Any = None,
        **kwargs: Any,
    ):
        if head is not None and not isinstance(head, str):
            raise TypeError(f"Expected argument `head` to be a dotted attribute path (str), but got {head!r}.")
        if compute_loss_func is not None and not callable(compute_loss_func):
            raise TypeError(f"Expected argument `compute_loss_func` to be callable, but got {compute_loss_func!r}.")
        self.calibration_loss = compute_loss_func
        self.head = head
        self.maccal = maccal
        self.maccal_dataset = maccal_dataset
        self._needs_features = _requires_features(compute_loss_func)
        self._capture: FeatureCapture | None = None
        # a loss that needs features is reached through `_loss_with_features`; Trainer only checks that
        # `compute_loss_func` is set (it then counts `num_items_in_batch` and trusts the loss's normalisation)
        loss_func = self._loss_with_features if self._needs_features else compute_loss_func
        super().__init__(*args, compute_loss_func=loss_func, **kwargs)

        if self._needs_features:
            if self.args.n_gpu > 1:
                raise ValueError(
                    "A loss that needs features cannot run under torch.nn.DataParallel (the head's hook would see "
                    "one replica's features only): launch with torchrun or `accelerate launch` (DDP) instead."
                )
            if self.model is not None:
                find_classifier_head(self.model, head)  # fail now, not at the first step, when there is no head
        if isinstance(compute_loss_func, nn.Module):
            compute_loss_func.to(self.args.device)
            if _trainable(compute_loss_func):
                self.add_callback(CalibrationLossCallback(compute_loss_func))

    # -- features ------------------------------------------------------------------------------
    def _capture_for(self, model: nn.Module) -> FeatureCapture:
        """A hook on the head of the *unwrapped* model (DDP / accelerate wrappers have no head attribute).

        Resolved afresh at each call (a few attribute look-ups): the head may have been replaced since, e.g. by
        MaC-Cal's bottleneck head, whose input is the same pre-classifier feature.
        """
        self._capture = FeatureCapture(self.accelerator.unwrap_model(model), self.head)
        return self._capture

    def _loss_with_features(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None):
        features = self._capture.pop() if self._capture is not None else None
        if features is None:
            raise ValueError(
                f"The classification head {self.head or '(auto-detected)'} was not called during the forward pass, "
                "so the loss got no features: pass `head=` with the dotted path of the Linear that produces the logits."
            )
        return self.calibration_loss(outputs, labels, num_items_in_batch=num_items_in_batch, features=features)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if isinstance(self.calibration_loss, nn.Module):
            # keep the loss's mode in step with the model's: EMA statistics move only in training
            self.calibration_loss.train(model.training)
        if not self._needs_features:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        capture = self._capture_for(model).attach()
        try:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        finally:
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
        """Save the model (as `Trainer` does) and, beside it, the loss state (gate weights, EMA buffers)."""
        super().save_model(output_dir, _internal_call=_internal_call)
        self.save_loss_state(output_dir if output_dir is not None else self.args.output_dir)

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
        out = super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._reload_renamed_weights(resume_from_checkpoint, model)
        self.load_loss_state(resume_from_checkpoint)
        return out

    def _reload_renamed_weights(self, checkpoint_dir: str, model: nn.Module | None = None) -> None:
        """Work around `Trainer` resuming models whose saved weight names differ from their module names.

        transformers 5.x saves some models (ViT, Swin) under their legacy weight names, while
        ``Trainer._load_from_checkpoint`` loads the file with ``load_state_dict(strict=False)``: every renamed
        weight is silently left at its current value (a warning only). ``from_pretrained`` applies the renaming,
        so when the names differ the weights are reloaded through it.
        """
        from transformers import PreTrainedModel

        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        path = os.path.join(checkpoint_dir, "model.safetensors")
        if (
            not isinstance(target, PreTrainedModel)
            or not os.path.isfile(path)
            or self.is_deepspeed_enabled
            or self.is_fsdp_enabled
        ):
            return
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            saved = set(f.keys())
        if saved == set(target.state_dict()):
            return
        logger.info("Reloading %s through from_pretrained: its saved weight names differ from the model's.", path)
        fresh = type(target).from_pretrained(checkpoint_dir)
        target.load_state_dict(fresh.state_dict(), strict=True)

    def _load_best_model(self, *args: Any, **kwargs: Any):
        out = super()._load_best_model(*args, **kwargs)
        if self.state.best_model_checkpoint:
            self.load_loss_state(self.state.best_model_checkpoint)
        return out

    # -- MaC-Cal ---------------------------------------------------------------------------------
    def train(self, *args: Any, **kwargs: Any):
        output = super().train(*args, **kwargs)
        if self.maccal is not None:
            self.run_maccal()
        return output

    def run_maccal(self):
        """Run the MaC-Cal second stage on the trained model (frozen backbone, masked bottleneck head).

        The stage's base loss is this trainer's loss (a copy: FeDLaS gets the cached features and its gate
        is retrained with the head), cross-entropy when the trainer uses the model's own loss.
        """
        if self.maccal is None:
            raise ValueError("Expected argument `maccal` to be a MaCCalConfig to run the MaC-Cal stage, but got None.")
        from .maccal import maccal_stage

        base = self.calibration_loss
        if not isinstance(base, nn.Module):
            base = None  # the model's own loss or a plain function: the stage's default (cross-entropy)
        return maccal_stage(
            self.model,
            self.maccal_dataset if self.maccal_dataset is not None else self.train_dataset,
            self.maccal,
            data_collator=self.data_collator,
            loss=base,
            head=self.head,
            log_fn=self.log,
        )
