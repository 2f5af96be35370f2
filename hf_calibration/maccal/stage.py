"""MaC-Cal second stage (Ni et al. 2025): retrain a masked bottleneck head on the frozen backbone.

After ordinary training, the backbone is frozen and the linear head is replaced by a freshly
initialised :class:`~hf_calibration.maccal.head.MaskedBottleneckHead`, trained on the original
(non-augmented) training data with Bernoulli weight masks redrawn every epoch (MaC-Cal Eqs. 8–11)
whose retention ρ adapts after each epoch (:mod:`~hf_calibration.maccal.retention`, Eqs. 12–13).
Because the backbone is frozen and the data are not augmented, the head's inputs are computed once
(one batched forward pass, :func:`cache_features`) and the head trains on the cache.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hf_calibration._core.checks import IGNORE_INDEX, check_int, check_labels_in_range
from hf_calibration._core.features import capture_features, find_classifier_head
from hf_calibration._core.progress import progress_iter
from hf_calibration.maccal.config import MaCCalConfig
from hf_calibration.maccal.head import FlatHeadTrainer, MaskedBottleneckHead, MaskedSGD
from hf_calibration.maccal.persistence import head_path, install_head
from hf_calibration.maccal.retention import clip_bound, update_retention

logger = logging.getLogger(__name__)

__all__ = ["MaCCalResult", "cache_features", "train_masked_head", "maccal_stage"]

_LABEL_KEYS = ("labels", "label", "label_ids")


@dataclass
class MaCCalResult:
    """What the stage returns: the model (modified in place), its new head and the per-epoch log."""

    model: nn.Module
    head: MaskedBottleneckHead
    head_path: str
    history: list[dict[str, float]] = field(default_factory=list)
    feature_seconds: float = 0.0
    train_seconds: float = 0.0

    @property
    def retention(self) -> list[float]:
        return [h["retention"] for h in self.history]


# ----------------------------------------------------------------------------- features


def _labels_of(batch) -> torch.Tensor:
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        for key in _LABEL_KEYS:
            if key in batch and batch[key] is not None:
                return torch.as_tensor(batch[key])
        raise ValueError(
            f"Expected each batch to carry labels under one of {list(_LABEL_KEYS)}, but got keys {list(batch.keys())}."
        )
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return torch.as_tensor(batch[1])
    raise TypeError(
        f"Expected each batch to be a dict with labels or an (inputs, labels) pair, but got {type(batch).__name__}."
    )


def _forward(model: nn.Module, batch, device: torch.device, accepted: set[str] | None) -> None:
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        inputs = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()
            if k not in _LABEL_KEYS and (accepted is None or k in accepted)
        }
        model(**inputs)
    else:
        model(batch[0].to(device))


def _forward_keys(model: nn.Module) -> set[str] | None:
    params = inspect.signature(model.forward).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _loader(data, batch_size: int, data_collator, model: nn.Module, shuffle: bool = False, generator=None):
    """A DataLoader over ``data`` keeping only the columns the model's forward takes (plus labels)."""
    if isinstance(data, torch.utils.data.DataLoader):
        return data
    accepted = _forward_keys(model)
    if data_collator is None:
        from transformers import default_data_collator

        data_collator = default_data_collator

    def collate(items):
        if items and isinstance(items[0], dict) and accepted is not None:
            items = [{k: v for k, v in it.items() if k in accepted or k in _LABEL_KEYS} for it in items]
        if items and isinstance(items[0], (list, tuple)):
            return torch.utils.data.default_collate(items)
        return data_collator(items)

    return torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=shuffle, collate_fn=collate, generator=generator
    )


def _batches_features(
    model, loader, head: str | None, progress: bool, desc: str
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(features, labels)`` per batch: the head's input under a frozen, eval-mode forward pass."""
    device = _model_device(model)
    accepted = _forward_keys(model)
    with capture_features(model, head) as cap:
        for batch in progress_iter(loader, desc=desc, enabled=progress, leave=False):
            labels = _labels_of(batch).to(device)
            with torch.no_grad():  # not around the yield: the consumer trains the head with grad enabled
                _forward(model, batch, device, accepted)
            features = cap.pop()
            if features is None:
                raise RuntimeError("The classification head did not run during the forward pass: pass `head=`.")
            features = features.detach().flatten(1).float()
            keep = labels != IGNORE_INDEX
            yield features[keep], labels[keep]


def cache_features(
    model: nn.Module,
    data,
    *,
    head: str | None = None,
    data_collator: Callable | None = None,
    batch_size: int = 256,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batched, no-grad, eval-mode pass of ``model`` over ``data``: ``(features (N, d) float32, labels (N,))``.

    ``features`` is what the classification head receives (captured with a forward pre-hook), on
    the model's device. ``data`` is a map-style dataset of dicts (``pixel_values``, ``labels``) or
    of ``(input, label)`` pairs, or a ``DataLoader``. Rows labelled -100 are dropped.
    """
    check_int(batch_size, "batch_size", minimum=1)
    was_training = model.training
    model.eval()
    try:
        loader = _loader(data, batch_size, data_collator, model)
        feats, labels = [], []
        for f, y in _batches_features(model, loader, head, progress, "MaC-Cal: caching features"):
            feats.append(f)
            labels.append(y)
    finally:
        model.train(was_training)
    if not feats:
        raise ValueError("Expected argument `dataset` to hold at least one sample, but it is empty.")
    return torch.cat(feats), torch.cat(labels).long()


def _check_features_argument(features: Any, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``features=(X, Y)`` as tensors, checked before anything trains: a pair of arrays, X real-valued with ``N``
    rows of ``in_features`` values (trailing dimensions are flattened), Y integer class indices of shape (N,).

    Non-finite values and labels out of range are checked by `_check_stage_data`, on X and Y as given.
    """
    if not isinstance(features, (tuple, list)) or len(features) != 2:
        raise TypeError(
            "Expected argument `features` to be a pair (features (N, d), labels (N,)), "
            f"but got {type(features).__name__}{f' of length {len(features)}' if isinstance(features, (tuple, list)) else ''}."
        )
    pair = []
    for name, value in zip(("features[0]", "features[1]"), features):
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                raise TypeError(f"Expected argument `{name}` to hold real numbers, but got dtype {value.dtype}.")
            value = torch.from_numpy(value)
        elif not isinstance(value, torch.Tensor):
            raise TypeError(
                f"Expected argument `{name}` to be a torch.Tensor or numpy array, but got {type(value).__name__}."
            )
        pair.append(value.detach())
    x, y = pair
    if x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"Expected argument `features[0]` (the features) to hold real numbers, but got {x.dtype}.")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(
            f"Expected argument `features[1]` (the labels) to hold integer class indices, but got {y.dtype} "
            "(cast exact class indices with `.long()`)."
        )
    if x.ndim < 2:
        raise ValueError(f"Expected argument `features[0]` to have shape (N, {in_features}), but got {tuple(x.shape)}.")
    if y.ndim != 1:
        raise ValueError(f"Expected argument `features[1]` (the labels) to have shape (N,), but got {tuple(y.shape)}.")
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            "Expected the features and labels of argument `features` to have the same number of samples N, "
            f"but got {x.shape[0]} and {y.shape[0]}."
        )
    x = x.flatten(1)
    if x.shape[1] != in_features:
        raise ValueError(
            f"Expected argument `features[0]` to have shape (N, {in_features}) (the head's input size), "
            f"but got {tuple(x.shape)}."
        )
    return x, y


def _check_stage_data(x: torch.Tensor, y: torch.Tensor, num_labels: int, name: str, labels_name: str) -> None:
    """Finite features and labels in [0, K) or -100 (ignored), before the head trains; ``name`` / ``labels_name``
    say where they came from (argument ``features``, or the backbone's output on ``dataset``)."""
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        rows = (~finite).any(dim=1)
        raise ValueError(
            f"Expected {name} to be finite, but {int(rows.sum())} of {x.shape[0]} rows hold NaN or inf "
            f"(first: row {int(rows.nonzero()[0, 0])})."
        )
    check_labels_in_range(y, num_labels, target_name=labels_name)


# ----------------------------------------------------------------------------- head training


def _resolve_loss(loss, num_labels: int):
    if loss is None:
        return None
    if isinstance(loss, str):
        from hf_calibration.losses import LOSS_MAPPING, get_loss

        cls = LOSS_MAPPING.get(loss.lower().replace("-", "_"))
        needs_k = cls is not None and "num_classes" in inspect.signature(cls.__init__).parameters
        return get_loss(loss, num_classes=num_labels) if needs_k else get_loss(loss)
    if not callable(loss):
        raise TypeError(
            f"Expected argument `loss` to be a loss name, a callable or None, but got {type(loss).__name__}."
        )
    if not isinstance(loss, nn.Module):
        return loss
    loss = copy.deepcopy(loss)
    if hasattr(loss, "sync_statistics"):  # every process runs the stage on the whole data: no cross-process sums
        loss.sync_statistics = False
    return loss


def _loss_value(loss_fn, logits, labels, features):
    if loss_fn is None:
        return F.cross_entropy(logits, labels)
    if getattr(loss_fn, "requires_features", False):
        return loss_fn(logits, labels, features=features)
    return loss_fn(logits, labels)


def _cross_entropy_grad(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``n · ∂ mean-CE / ∂ logits`` in closed form, ``softmax(z) − onehot(y)`` (autograd's gradient times n)."""
    index = labels.unsqueeze(1)
    return torch.softmax(logits, 1).scatter_add_(1, index, _MINUS_ONE.get(logits).expand(index.shape[0], 1))


class _Constant:
    """A cached ``-1`` scalar tensor per (device, dtype), so the closed-form gradient allocates nothing for it."""

    def __init__(self, value: float):
        self.value, self.cache = value, {}

    def get(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self.cache:
            self.cache[key] = torch.full((1, 1), self.value, device=like.device, dtype=like.dtype)
        return self.cache[key]


_MINUS_ONE = _Constant(-1.0)


def _autocast_off(device_type: str):
    """Disable an outer autocast around the head's step (it trains in its own dtype); a no-op when none is active."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def train_masked_head(
    head: MaskedBottleneckHead,
    batches: Callable[[int, torch.Generator], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    config: MaCCalConfig,
    *,
    loss=None,
    log_fn: Callable[[dict[str, float]], Any] | None = None,
) -> list[dict[str, float]]:
    """Train ``head`` for ``config.epochs`` epochs; ``batches(epoch, generator)`` yields ``(features, labels)``.

    Each epoch: draw masks with retention ρ (Eq. 8), train with :class:`MaskedSGD`'s rule (Eqs. 9–11),
    record training accuracy / mean confidence / loss of the masked forward passes, log them,
    then adapt ρ (``update_retention``) when ``config.adaptive``. Returns one dict per epoch.

    The head's steps are small and overhead-bound, so they skip the autograd engine
    (:class:`~hf_calibration.maccal.head.FlatHeadTrainer`: hand-written forward and backward passes,
    one update on a flat parameter vector); the default cross-entropy's gradient
    ``(softmax − onehot)/n`` is closed-form, and any other loss is differentiated by autograd w.r.t.
    the logits and its own parameters only (those get plain SGD, no decay). The result equals
    ``loss.backward(); MaskedSGD.step()`` through :meth:`MaskedBottleneckHead.forward` up to float
    rounding. Forward hooks on ``head`` do not run during this training.
    """
    loss_fn = _resolve_loss(loss, head.num_labels)
    generator = torch.Generator().manual_seed(config.seed)
    trainer = FlatHeadTrainer(head, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    loss_params, loss_optimizer = [], None
    if isinstance(loss_fn, nn.Module):
        loss_fn.to(trainer.theta.device).train()
        loss_params = [p for p in loss_fn.parameters() if p.requires_grad]
        if loss_params:  # the loss's own parameters (FeDLaS gate): plain SGD, no decay, no masks
            loss_optimizer = MaskedSGD(loss_params, lr=config.lr, momentum=config.momentum)
    rho, history = config.rho0, []
    head.train()
    bar = progress_iter(range(config.epochs), desc="MaC-Cal: head epochs", enabled=config.progress, leave=False)
    try:
        for epoch in bar:
            masks = head.draw_masks(rho, generator, rescale=config.rescale)
            trainer.set_masks(masks, head.mask_scale)
            seen_logits, seen_labels, losses, feedback = [], [], [], []  # kept on the device: one host sync per epoch
            with torch.no_grad():
                for x, y in batches(epoch, generator):
                    with _autocast_off(x.device.type):  # the head trains in its own dtype under any outer autocast
                        logits, saved = trainer.forward(x)
                        if loss_fn is None:  # mean CE: the 1/n goes into the backward pass's one scaling
                            grad_logits, grad_scale = _cross_entropy_grad(logits, y), 1.0 / y.shape[0]
                        else:
                            leaf = logits.detach().requires_grad_()
                            with torch.enable_grad():
                                value = _loss_value(loss_fn, leaf, y, x)
                            grad_logits, *loss_grads = torch.autograd.grad(
                                value, [leaf, *loss_params], allow_unused=True
                            )
                            if grad_logits is None:  # a loss that ignores the logits
                                grad_logits = torch.zeros_like(logits)
                            losses.append(value.detach() * y.numel())
                            grad_scale = 1.0
                            if loss_optimizer is not None:
                                loss_optimizer.update([loss_grads])
                        # the ρ feedback: these masked logits, or the unmasked head's on the same batch (pre-step)
                        feedback.append(logits if config.feedback == "masked" else trainer.forward_full(x))
                        trainer.backward(saved, grad_logits, grad_scale)
                        trainer.step()
                    seen_logits.append(logits)
                    seen_labels.append(y)
                if not seen_labels:
                    raise ValueError("Expected the stage-2 data to hold at least one labelled sample, but got none.")
                logits_all, labels_all = torch.cat(seen_logits), torch.cat(seen_labels)
                n = labels_all.numel()
                if loss_fn is None:  # the loss of each step's masked forward pass, summed once per epoch
                    loss_total = F.cross_entropy(logits_all, labels_all, reduction="sum").double()
                else:
                    loss_total = torch.stack(losses).double().sum()
                conf_all, pred = torch.cat(feedback).float().softmax(-1).max(-1)
                correct, conf_sum, loss_sum = torch.stack(
                    [(pred == labels_all).sum().double(), conf_all.double().sum(), loss_total]
                ).tolist()
            trainer.write_back()  # the head's parameters are current at every epoch's end (and log_fn)
            acc, conf = correct / n, conf_sum / n
            record = {
                "epoch": float(epoch),
                "retention": float(rho),
                "clip_bound": clip_bound(epoch, config),
                "train_accuracy": acc,
                "mean_confidence": conf,
                "loss": loss_sum / n,
            }
            history.append(record)
            bar.set_postfix(
                rho=f"{rho:.3f}", acc=f"{acc:.3f}", conf=f"{conf:.3f}", refresh=False
            )  # a refresh ignores the delay
            logger.info(
                "MaC-Cal epoch %d: rho=%.4f acc=%.4f conf=%.4f loss=%.4f", epoch, rho, acc, conf, record["loss"]
            )
            if log_fn is not None:
                log_fn({f"maccal/{k}": v for k, v in record.items()})
            if config.adaptive:
                rho = update_retention(rho, min(acc, 1.0), min(conf, 1.0), epoch, config)
    finally:
        trainer.write_back()
        head.clear_masks()
    head.eval()
    return history


def check_softmax_head(model: nn.Module, what: str = "the MaC-Cal stage (`maccal=`)") -> None:
    """Refuse a sigmoid head (binary or multi-label, by the model's ``config.problem_type``), naming it: MaC-Cal's adaptive
    retention is driven by the softmax confidence against the accuracy (Ni et al. 2025), which a sigmoid head has not."""
    from hf_calibration._core.tasks import task_of_model

    task = task_of_model(model)
    if task in ("binary", "multilabel"):
        raise ValueError(
            f"Expected a softmax head for {what}, but the model's config.problem_type is "
            f"{getattr(model.config, 'problem_type', None)!r} (a {task} sigmoid head): MaC-Cal's adaptive retention is driven "
            "by the softmax confidence against the accuracy (Ni et al. 2025), which a sigmoid head does not have. Train it "
            "without MaC-Cal, and calibrate it post hoc (calibrate_on_eval=True fits a sigmoid temperature scaling)."
        )


def maccal_stage(
    model: nn.Module,
    dataset=None,
    config: MaCCalConfig | None = None,
    *,
    data_collator: Callable | None = None,
    loss=None,
    head: str | None = None,
    log_fn: Callable[[dict[str, float]], Any] | None = None,
    features: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> MaCCalResult:
    """Run the MaC-Cal second stage on a trained classifier, in place.

    Args:
        model: a trained transformers / timm image classifier (``TimmWrapperForImageClassification``
            or a bare timm model). Its backbone is never modified.
        dataset: the original, non-augmented training data (map-style dataset of dicts or
            ``(input, label)`` pairs, or a ``DataLoader``). Not needed when ``features`` is given.
        config: :class:`MaCCalConfig`; default ``MaCCalConfig()``.
        data_collator: collates dataset items (transformers' ``default_data_collator`` if None).
        loss: base loss of the stage: None (cross-entropy), a name for ``losses.get_loss`` or any
            project loss module; losses with ``requires_features`` get the cached features as
            ``features=``. A loss module is deep-copied, so the caller's loss keeps its state.
        head: dotted path of the classification head, for models ``find_classifier_head`` misses.
        log_fn: called once per epoch with ``{"maccal/retention", "maccal/train_accuracy",
            "maccal/mean_confidence", "maccal/loss", ...}`` (pass ``Trainer.log``).
        features: precomputed ``(features, labels)`` of the head's input, skipping the backbone.

    Under several processes (``CalibrationTrainer`` after a DDP ``train()``) every process runs the stage on
    the whole ``dataset`` with the same seed, so all end with the same head; the loss copy's statistics
    (FeDLaS) are then not summed across processes.

    Returns:
        :class:`MaCCalResult`; ``result.model`` is ``model`` with the bottleneck head installed and
        recorded in ``model.config.maccal_head`` (save with ``save_pretrained``, load with
        :func:`~hf_calibration.maccal.load_maccal_model`).

    Example::

        from transformers import AutoImageProcessor, pipeline
        from hf_calibration.maccal import MaCCalConfig, load_maccal_model, maccal_stage

        result = maccal_stage(model, train_set_without_augmentation, MaCCalConfig(epochs=40))
        model.save_pretrained("out/maccal")
        image_processor.save_pretrained("out/maccal")
        model = load_maccal_model("out/maccal")  # plain from_pretrained would rebuild a Linear head
        clf = pipeline("image-classification", model=model, image_processor=AutoImageProcessor.from_pretrained("out/maccal"))
    """
    config = MaCCalConfig() if config is None else config
    if not isinstance(config, MaCCalConfig):
        raise TypeError(f"Expected argument `config` to be a MaCCalConfig, but got {type(config).__name__}.")
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected argument `model` to be a torch.nn.Module, but got {type(model).__name__}.")
    if dataset is None and features is None:
        raise ValueError("Expected argument `dataset` (or `features`) to be given, but got neither.")
    check_softmax_head(model, "maccal_stage")
    path = head_path(model, head)
    _, _, linear = find_classifier_head(model, head)
    if not isinstance(linear, nn.Linear):
        raise ValueError(
            f"Expected the classification head at {path!r} to be a Linear layer, but got {type(linear).__name__}."
        )
    in_features, num_labels = linear.in_features, linear.out_features
    device, dtype = linear.weight.device, linear.weight.dtype
    if features is not None:  # checked before anything is built or trained
        x_given, y_given = _check_features_argument(features, in_features)
        _check_stage_data(x_given, y_given, num_labels, "argument `features[0]`", "features[1]")
    hidden = config.hidden or max(in_features // 2, 2 * num_labels)

    if config.init == "linear" and hidden < 2 * num_labels:
        raise ValueError(
            f"Expected `hidden` >= 2 · num_labels = {2 * num_labels} with init='linear', but got {hidden}."
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        new_head = MaskedBottleneckHead(in_features, hidden, num_labels).to(device)
    if config.init == "linear":
        new_head.init_from_linear(linear)

    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        if features is not None:
            x_all, y_all = x_given.to(device).float(), y_given.to(device).long()
            keep = y_all != IGNORE_INDEX
            x_all, y_all = x_all[keep], y_all[keep]
        elif config.cache_features:
            x_all, y_all = cache_features(
                model,
                dataset,
                head=path,
                data_collator=data_collator,
                batch_size=config.feature_batch_size,
                progress=config.progress,
            )
            _check_stage_data(x_all, y_all, num_labels, "the backbone's features on argument `dataset`", "dataset")
        else:
            x_all = y_all = None
        if x_all is not None and (x_all.ndim != 2 or x_all.shape[1] != in_features or x_all.shape[0] != y_all.shape[0]):
            raise ValueError(
                f"Expected `features` of shape (N, {in_features}) with N labels, but got {tuple(x_all.shape)} and {tuple(y_all.shape)}."
            )
        feature_seconds = time.perf_counter() - t0
        if x_all is not None and x_all.shape[0] == 0:
            raise ValueError("Expected the stage-2 data to hold at least one labelled sample, but got none.")

        if x_all is not None:

            def batches(epoch, generator):
                perm = torch.randperm(x_all.shape[0], generator=generator).to(device)
                x_perm, y_perm = (
                    x_all.index_select(0, perm),
                    y_all.index_select(0, perm),
                )  # one gather per epoch, then views
                return zip(x_perm.split(config.batch_size), y_perm.split(config.batch_size))

        else:

            def batches(epoch, generator):
                loader = _loader(dataset, config.batch_size, data_collator, model, shuffle=True, generator=generator)
                yield from _batches_features(model, loader, path, config.progress, f"MaC-Cal: epoch {epoch} backbone")

        t1 = time.perf_counter()
        history = train_masked_head(new_head, batches, config, loss=loss, log_fn=log_fn)
        train_seconds = time.perf_counter() - t1
    finally:
        model.train(was_training)
    new_head.to(dtype=dtype).eval()
    install_head(model, new_head, path)
    return MaCCalResult(model, new_head, path, history, feature_seconds, train_seconds)
