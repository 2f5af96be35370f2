"""The interface every calibrator shares: input handling, the calibrated forward, fitting, Hub persistence.

A calibrator maps (N, K) logits to calibrated logits (or log-probabilities: any row-wise map whose softmax
is the calibrated distribution). Subclasses implement ``_calibrate(z)`` and ``_fit(...)``; everything else
is here. Those that only divide each row by a positive temperature derive from
``TemperatureCalibrator`` (``_scaling.py``) and implement ``_temperature(z)`` instead of ``_calibrate``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

import numpy as np
import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from .. import hub
from ..metrics._format import validate
from . import attach as _attach
from .objectives import get_objective, objective_kwargs

logger = logging.getLogger(__name__)

REPO_URL = "https://github.com/hf-calibration/hf-calibration"


class NotFittedError(RuntimeError):
    """The calibrator was used before ``fit`` (or ``from_pretrained``)."""


def _labels_of(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Accept ``(logits, labels)``, or a transformers ``PredictionOutput`` / ``EvalPrediction`` alone."""
    if hasattr(logits, "predictions") and hasattr(logits, "label_ids"):
        if labels is None:
            labels = logits.label_ids
        logits = logits.predictions
    if isinstance(logits, tuple):  # predictions with extra outputs (hidden states, ...): logits come first
        if not logits:
            raise ValueError("Expected `logits` to be an (N, K) array, but got an empty tuple.")
        logits = logits[0]
    if isinstance(labels, tuple):
        labels = labels[0]
    if labels is None:
        raise ValueError("Expected argument `labels` (or a PredictionOutput / EvalPrediction carrying label_ids), but got None.")
    return logits, labels


def _next_up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, float("inf")))


class Calibrator(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="hf_calibration",
    tags=["calibration", "hf_calibration", "image-classification"],
    repo_url=REPO_URL,
    model_card_template=hub.CALIBRATOR_CARD_TEMPLATE,
):
    """Base class: ``fit``, ``forward``/``__call__``, ``predict_proba``, ``attach``/``detach``,
    ``save_pretrained``/``from_pretrained``/``push_to_hub``.

    Calibrated logits keep the input's dtype and device; inside, float64 inputs are computed in float64 and
    everything else in float32. A calibrator with ``preserves_argmax = True`` never changes the argmax: where
    rounding would merge the top two calibrated logits, the top one is raised by one ulp. Low-precision (fp16)
    outputs that would overflow are shifted by their row maximum (the softmax is unchanged) and saturated at the
    dtype's finite minimum, so the output is never inf or NaN. Non-finite input logits raise ``ValueError``.

    Class attributes a subclass sets: ``kind`` (its registry name), ``min_samples``, ``default_objective`` and
    ``objectives`` (the fit objectives it accepts), ``preserves_argmax`` (whether its predictions always equal the
    model's; methods such as vector scaling may move the argmax by design).
    """

    kind: ClassVar[str] = ""
    min_samples: ClassVar[int] = 2
    default_objective: ClassVar[str] = "nll"
    objectives: ClassVar[tuple[str, ...]] = ("nll",)
    preserves_argmax: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.fit_info_: dict[str, Any] | None = None
        self.history_: list[float] = []
        self.__dict__["_attached_to"] = None

    # ------------------------------------------------------------------ subclass hooks
    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits for finite logits ``z`` (float32 or float64, any device), same shape and dtype, no grad.

        May return non-finite values only where the input rows are non-finite (the caller reports those).
        """
        raise NotImplementedError

    def _fit(self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict:
        raise NotImplementedError

    def _forward_fused(self, z: torch.Tensor) -> torch.Tensor | None:
        """The whole forward (checks, map, argmax guard) in one fused pass, where a subclass has one; None otherwise."""
        return None

    # ------------------------------------------------------------------ state
    @property
    def is_fitted(self) -> bool:
        return self.fit_info_ is not None

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet: call fit(logits, labels) or load one with from_pretrained() first."
            )

    # ------------------------------------------------------------------ inputs
    def _check_logits(self, logits: Any) -> torch.Tensor:
        if isinstance(logits, np.ndarray):
            logits = torch.from_numpy(logits)
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"Expected `logits` to be a torch.Tensor or numpy array, but got {type(logits).__name__}.")
        if logits.ndim != 2:
            raise ValueError(f"Expected `logits` to have shape (N, K) (rank 2), but got rank {logits.ndim} with shape {tuple(logits.shape)}.")
        if not logits.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating tensor, but got {logits.dtype}.")
        if logits.shape[1] < 2:
            raise ValueError(f"Expected `logits` to have K >= 2 classes, but got K = {logits.shape[1]}.")
        expected = (self.fit_info_ or {}).get("num_classes")
        if expected is not None and logits.shape[1] != expected:
            logger.warning("Calibrating logits with K = %d classes; the calibrator was fitted on K = %d.", logits.shape[1], expected)
        return logits

    def _fit_inputs(self, logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        logits, labels = _labels_of(logits, labels)
        logits, labels = validate(logits, labels, preds_name="logits", target_name="labels")
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float32)  # fp16 (bf16 is already float32 here): exact
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():
            raise ValueError(f"Expected `logits` to be finite, but row {int(np.flatnonzero(bad)[0])} contains NaN or inf.")
        if logits.shape[0] < self.min_samples:
            raise ValueError(
                f"Expected at least {self.min_samples} labelled samples to fit {type(self).__name__}, but got {logits.shape[0]}."
            )
        return np.ascontiguousarray(logits), np.ascontiguousarray(labels)

    # ------------------------------------------------------------------ public API
    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        objective: str | None = None,
        progress_bar: bool = True,
        **objective_options: Any,
    ) -> "Calibrator":
        """Fit on held-out logits and labels; returns ``self``.

        Args:
            logits: (N, K) logits (torch tensor, numpy array), or a transformers ``PredictionOutput`` /
                ``EvalPrediction`` (then ``labels`` may be omitted; tuple predictions: the first element).
            labels: (N,) integer class indices; rows labelled -100 are ignored.
            objective: one of ``"nll"``, ``"brier"``, ``"soft_ece"``, ``"charbonnier_soft_ece"``
                (default: the class's ``default_objective``).
            progress_bar: show a tqdm bar when fitting takes longer than a second.
            **objective_options: ``n_bins``, ``sigma``, ``delta`` for the soft-binned objectives.
        """
        objective = self.default_objective if objective is None else objective
        get_objective(objective)
        if objective not in self.objectives:
            raise ValueError(f"Expected argument `objective` to be one of {list(self.objectives)} for {type(self).__name__}, but got {objective!r}.")
        if not isinstance(progress_bar, bool):
            raise TypeError(f"Expected argument `progress_bar` to be a bool, but got {progress_bar!r}.")
        unknown = set(objective_options) - {"n_bins", "sigma", "delta"}
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) for fit: {sorted(unknown)}.")
        kw = objective_kwargs(objective, **objective_options)
        z, y = self._fit_inputs(logits, labels)
        was_attached = self._attached_to
        self.fit_info_ = None
        info = self._fit(z, y, objective, kw, progress_bar)
        self.fit_info_ = {"objective": objective, "objective_options": kw, "num_samples": int(z.shape[0]), "num_classes": int(z.shape[1]), **info}
        self.fit_info_.update(self._fit_set_report(z, y))
        if was_attached is not None:
            logger.info("Refitted while attached: the model now uses the new fit.")
        return self

    def _fit_set_report(self, z: np.ndarray, y: np.ndarray) -> dict[str, float]:
        from ..metrics.ece import ece

        with torch.no_grad():
            calibrated = self(torch.from_numpy(z)).numpy()
        return {
            "accuracy": float((z.argmax(1) == y).mean()),
            "ece_before": float(ece(z, y, 15)),
            "ece_after": float(ece(calibrated, y, 15)),
        }

    def forward(self, logits: Any) -> torch.Tensor:
        """Calibrated logits: same shape, dtype and device as the input (same argmax when ``preserves_argmax``)."""
        self._check_fitted()
        z = self._check_logits(logits)
        cdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        zc = z.to(cdtype)
        out = self._forward_fused(zc) if z.dtype == cdtype else None
        if out is not None:
            return out
        out = self._calibrate(zc)
        if not bool(torch.isfinite(out.sum())):
            bad = ~torch.isfinite(zc).all(dim=1)
            if bool(bad.any()):
                raise ValueError(f"Expected `logits` to be finite, but row {int(bad.nonzero()[0])} contains NaN or inf.")
            out = out.clamp(min=torch.finfo(cdtype).min, max=torch.finfo(cdtype).max)  # log(0) = -inf of a top-label map
        if z.dtype != cdtype:
            limit = torch.finfo(z.dtype).max
            big = out.abs().amax(dim=1) > limit
            if bool(big.any()):
                out[big] = (out[big] - out[big].amax(dim=1, keepdim=True)).clamp_min(-limit)
            out = out.to(z.dtype)
        if self.preserves_argmax:
            top = z.argmax(dim=1)
            moved = (out.argmax(dim=1) != top).nonzero()[:, 0]
            if moved.numel():  # rounding merged the top logits: keep the original winner strictly on top
                out[moved, top[moved]] = _next_up(out[moved, top[moved]])
        return out

    def predict_proba(self, logits: Any) -> torch.Tensor:
        """Calibrated probabilities ``softmax(z_i / T_i)``, float32 (float64 for float64 input)."""
        out = self(logits)
        return torch.softmax(out.to(torch.float64 if out.dtype == torch.float64 else torch.float32), dim=1)

    def attach(self, model: nn.Module) -> nn.Module:
        """Calibrate ``model``'s logits (pipelines included) with a forward hook; returns the model."""
        return _attach.attach(self, model)

    def detach(self) -> nn.Module:
        """Undo ``attach``: the model's outputs are bit-for-bit what they were. Returns the model."""
        return _attach.detach(self)

    def extra_repr(self) -> str:
        return "fitted" if self.is_fitted else "not fitted"

    # ------------------------------------------------------------------ Hub
    def _save_pretrained(self, save_directory) -> None:
        from safetensors.torch import save_model

        self._check_fitted()
        save_model(
            self,
            str(save_directory / hub.WEIGHTS_NAME),
            metadata={"format": "pt", "calibrator": self.kind, "format_version": str(hub.CHECKPOINT_FORMAT_VERSION)},
        )
        from .. import __version__

        config = {
            **(self._hub_mixin_config or {}),
            "calibrator": self.kind,
            "format_version": hub.CHECKPOINT_FORMAT_VERSION,
            "hf_calibration_version": __version__,
            "fit": self.fit_info_,
        }
        (save_directory / hub.CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))

    def generate_model_card(self, *args, **kwargs):
        info = self.fit_info_ or {}

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.2f}%"

        values = {
            "title": f"{type(self).__name__} calibrator",
            "kind": self.kind,
            "objective": info.get("objective", "n/a"),
            "num_samples": info.get("num_samples", "n/a"),
            "num_classes": info.get("num_classes", "n/a"),
            "accuracy": pct(info.get("accuracy")),
            "ece_before": pct(info.get("ece_before")),
            "ece_after": pct(info.get("ece_after")),
            "format_version": hub.CHECKPOINT_FORMAT_VERSION,
            "method_description": self._card_description(),
            "argmax_statement": (
                "The predicted class never changes, only the confidences do."
                if self.preserves_argmax
                else "It may change the predicted class of some inputs (it is not a monotone map of each row)."
            ),
        }
        values.update(kwargs)
        return super().generate_model_card(*args, **values)

    def _card_description(self) -> str:
        """One sentence for the model card: what the calibrator does to the logits."""
        return "It maps the classifier's logits to calibrated ones."

    def push_to_hub(self, repo_id: str, *, path_in_repo: str | None = None, **kwargs: Any) -> str:
        """Upload the checkpoint; ``path_in_repo="calibrator"`` puts it in a subfolder of (say) the model's repo.

        Other keyword arguments are those of ``PyTorchModelHubMixin.push_to_hub`` (``token``, ``private``,
        ``commit_message``, ``branch``, ``create_pr``, ...).
        """
        self._check_fitted()
        if path_in_repo is None:
            return super().push_to_hub(repo_id, **kwargs)
        import tempfile
        from pathlib import Path

        from huggingface_hub import HfApi

        api = HfApi(token=kwargs.get("token"))
        repo_id = api.create_repo(repo_id=repo_id, private=kwargs.get("private"), exist_ok=True).repo_id
        with tempfile.TemporaryDirectory() as tmp:
            self.save_pretrained(Path(tmp), model_card_kwargs=kwargs.get("model_card_kwargs"))
            return api.upload_folder(
                repo_id=repo_id,
                repo_type="model",
                folder_path=tmp,
                path_in_repo=path_in_repo,
                commit_message=kwargs.get("commit_message", f"Upload {type(self).__name__} calibrator"),
                revision=kwargs.get("branch"),
                create_pr=kwargs.get("create_pr"),
            )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, subfolder: str | None = None, **kwargs: Any):
        """Load a checkpoint strictly (wrong kind, format version, shapes or a corrupted file: ``ValueError``).

        Args:
            pretrained_model_name_or_path: local folder or Hub repo id.
            subfolder: the checkpoint's folder inside it (e.g. ``"calibrator"`` beside a model).
            **kwargs: ``revision``, ``cache_dir``, ``token``, ``local_files_only``, ``force_download``, ``map_location``.
        """
        if kwargs.pop("strict", True) is not True:
            raise ValueError("Calibrators always load strictly: `strict=False` is not supported.")
        download = {k: kwargs.pop(k) for k in ("revision", "cache_dir", "force_download", "local_files_only", "token") if k in kwargs}
        folder = hub.resolve_checkpoint(pretrained_model_name_or_path, subfolder=subfolder, **download)
        config = hub.read_config(folder)
        cls._check_config(config, folder)
        return super().from_pretrained(folder, **kwargs)

    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        kind = config.get("calibrator")
        if kind != cls.kind:
            raise ValueError(
                f"Expected a {cls.__name__} checkpoint (calibrator={cls.kind!r}), but {str(where)!r} holds calibrator={kind!r}. "
                "Use hf_calibration.calibrators.load_calibrator to load any kind."
            )
        version = config.get("format_version")
        if version != hub.CHECKPOINT_FORMAT_VERSION:
            raise ValueError(
                f"Expected checkpoint format_version {hub.CHECKPOINT_FORMAT_VERSION}, but {str(where)!r} has {version!r}: "
                "it was written by an incompatible version of hf_calibration."
            )
        if not isinstance(config.get("fit"), dict):
            raise ValueError(f"The checkpoint in {str(where)!r} has no `fit` record in its config: it is corrupted or was never fitted.")

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision,
        cache_dir,
        force_download,
        local_files_only,
        token,
        map_location: str = "cpu",
        strict: bool = True,
        config: dict | None = None,
        **model_kwargs,
    ):
        import os

        from safetensors import safe_open
        from safetensors.torch import load_model

        cls._check_config(config or {}, model_id)
        try:
            model = cls(**model_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"The checkpoint's config in {model_id!r} does not fit {cls.__name__}: {err}") from None
        path = os.path.join(model_id, hub.WEIGHTS_NAME)
        if not os.path.isfile(path):
            raise ValueError(f"Expected the calibrator weights {hub.WEIGHTS_NAME} in {model_id!r}, but the file is missing.")
        try:
            with safe_open(path, framework="pt") as handle:
                metadata = handle.metadata() or {}
            load_model(model, path, strict=True, device=map_location)
        except Exception as err:  # safetensors header errors, strict-load key/shape mismatches
            raise ValueError(f"Could not load the calibrator weights {path!r}: the file is corrupted or does not match {cls.__name__} ({err}).") from None
        if metadata.get("calibrator", cls.kind) != cls.kind:
            raise ValueError(f"The weights in {path!r} belong to calibrator={metadata.get('calibrator')!r}, not {cls.kind!r}.")
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"The calibrator weights {path!r} are corrupted: {name} holds NaN or inf.")
        model.fit_info_ = dict(config["fit"])
        model.eval()
        return model


