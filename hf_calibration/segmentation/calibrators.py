"""Calibrating pixel logits: any package calibrator on the pixels as rows, and Local Temperature Scaling.

* ``pixel_rows`` turns ``(B, K, H, W)`` logits and ``(B, H, W)`` label maps into the ``(N, K)`` rows and labels every
  calibrator of :mod:`hf_calibration.calibrators` fits (ignored pixels dropped, an optional random subsample), and
  ``calibrate_pixels`` applies a fitted one back to a ``(B, K, H, W)`` map: temperature scaling of a segmenter is
  ``TemperatureScaling().fit(*pixel_rows(logits, masks))`` — one saved, pushed and loaded like any other.
* ``LocalTemperatureScaling`` (Ding et al., ICCV 2021): a small convolutional network reads the logits and the image
  and predicts a temperature per pixel, ``T(x) = softplus(f([z, image])) + t_min``; the calibrated logits are
  ``z / T(x)``, so every pixel keeps its predicted class. Fitted by NLL over the labelled pixels (Adam, full batch);
  the last layer starts at zero, so an unfitted map is plain temperature 1. The fit records the pixel ECE, AdaECE and
  classwise ECE before / after on the fit pixels (and on ``held_out`` maps where given) for the model card; saved,
  loaded and pushed like every calibrator (:class:`hf_calibration._core.persistence.Saved`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hf_calibration._core.persistence import Saved
from hf_calibration._core.vision_card import VISION_CARD_TEMPLATE, metric_rows
from hf_calibration.segmentation.metrics import PixelCalibrationAccumulator, _as_tensor

__all__ = ["LocalTemperatureScaling", "calibrate_pixels", "pixel_rows"]


def _check_maps(logits: torch.Tensor, target: torch.Tensor | None, ignore_index: int | None) -> None:
    if logits.ndim != 4 or not logits.is_floating_point():
        raise ValueError(
            f"Expected `logits` of shape (B, K, H, W), floating point, but got {tuple(logits.shape)} {logits.dtype}."
        )
    if not torch.isfinite(logits).all():
        raise ValueError("Expected `logits` to be finite, but it holds NaN or inf.")
    if target is None:
        return
    if target.shape != (logits.shape[0], *logits.shape[2:]) or target.is_floating_point():
        raise ValueError(
            f"Expected integer `target` of shape {(logits.shape[0], *logits.shape[2:])}, but got {tuple(target.shape)} {target.dtype}."
        )
    valid = target[target != ignore_index] if ignore_index is not None else target.reshape(-1)
    if valid.numel() and (valid.min() < 0 or valid.max() >= logits.shape[1]):
        raise ValueError(f"Expected `target` labels in [0, {logits.shape[1]}) or `ignore_index` ({ignore_index}).")


def pixel_rows(
    logits: Any, target: Any, *, ignore_index: int | None = 255, max_pixels: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` logits and ``(N,)`` labels of the labelled pixels (``max_pixels``: a uniform random subset of them,
    drawn with ``seed``), in the order of ``logits.permute(0, 2, 3, 1)``."""
    logits, target = _as_tensor(logits, "logits"), _as_tensor(target, "target")
    _check_maps(logits, target, ignore_index)
    rows = logits.permute(0, 2, 3, 1).reshape(-1, logits.shape[1])
    labels = target.reshape(-1).to(torch.int64)
    keep = torch.ones_like(labels, dtype=torch.bool) if ignore_index is None else labels != ignore_index
    index = keep.nonzero().squeeze(1)
    if max_pixels is not None and index.numel() > max_pixels:
        pick = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(seed))[:max_pixels]
        index = index[pick.sort().values]
    return rows[index], labels[index]


def calibrate_pixels(calibrator: Any, logits: Any) -> torch.Tensor:
    """Apply a fitted row calibrator (``(N, K)`` logits in, calibrated logits out) to ``(B, K, H, W)`` logits."""
    logits = _as_tensor(logits, "logits")
    _check_maps(logits, None, None)
    b, k, h, w = logits.shape
    out = calibrator(logits.permute(0, 2, 3, 1).reshape(-1, k))
    return torch.as_tensor(out).reshape(b, h, w, k).permute(0, 3, 1, 2)


_CARD_METRICS = {"ece": "pixel ECE (15 bins)", "adaece": "pixel AdaECE", "classwise_ece": "pixel classwise ECE"}


class LocalTemperatureScaling(
    Saved,
    library_name="hf_calibration",
    tags=["calibration", "hf_calibration"],  # and "image-segmentation", per card (Saved.generate_model_card)
    model_card_template=VISION_CARD_TEMPLATE,
):
    """A per-pixel temperature from the logits and the image (Ding et al., ICCV 2021).

    Args:
        num_classes: K, the logit channels.
        image_channels: channels of the image given beside the logits (0: logits only).
        hidden: width of the two 3x3 convolutions.
        t_min: the lowest temperature the map can give.
    """

    kind: ClassVar[str] = "local_temperature"
    checkpoint_key: ClassVar[str] = "calibrator"
    checkpoint_what: ClassVar[str] = "segmentation calibrator"
    save_subfolder: ClassVar[str] = "calibrator"
    pipeline_task: ClassVar[str] = "image-segmentation"

    def __init__(self, num_classes: int, image_channels: int = 3, hidden: int = 8, t_min: float = 0.05) -> None:
        super().__init__()
        for name, value, low in (
            ("num_classes", num_classes, 2),
            ("image_channels", image_channels, 0),
            ("hidden", hidden, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Expected argument `{name}` to be an integer >= {low}, but got {value!r}.")
        if not 0 < t_min < 1:
            raise ValueError(f"Expected argument `t_min` in (0, 1), but got {t_min!r}.")
        self.num_classes, self.image_channels, self.t_min = num_classes, image_channels, t_min
        self.fit_info_: dict[str, Any] | None = None
        self.net = nn.Sequential(
            nn.Conv2d(num_classes + image_channels, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, 1, 1),
        )
        self._initialise(seed=0)

    def _initialise(self, seed: int) -> None:
        """Hidden convolutions drawn from ``seed`` (PyTorch's default rule, a generator of their own: the global
        random state is neither read nor changed), the output layer at T = 1."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in self.net[:-1]:
                if isinstance(layer, nn.Conv2d):
                    nn.init.kaiming_uniform_(layer.weight, a=float(np.sqrt(5)), generator=g)
                    bound = 1 / float(np.sqrt(layer.weight[0].numel()))
                    layer.bias.uniform_(-bound, bound, generator=g)
            nn.init.zeros_(self.net[-1].weight)
            nn.init.constant_(self.net[-1].bias, float(np.log(np.expm1(1.0 - self.t_min))))

    def _input(self, logits: torch.Tensor, images: Any) -> torch.Tensor:
        _check_maps(logits, None, None)
        if logits.shape[1] != self.num_classes:
            raise ValueError(f"Expected `logits` with {self.num_classes} channels, but got {logits.shape[1]}.")
        # the logits enter centred per pixel (softmax ignores a shift), so the map sees their shape, not their offset
        z = logits - logits.mean(1, keepdim=True)
        if self.image_channels == 0:
            return z
        if images is None:
            raise ValueError(f"Expected `images` with {self.image_channels} channels beside the logits, but got None.")
        images = _as_tensor(images, "images").to(logits.dtype)
        if images.shape != (logits.shape[0], self.image_channels, *logits.shape[2:]):
            raise ValueError(
                f"Expected `images` of shape {(logits.shape[0], self.image_channels, *logits.shape[2:])} (resized to the "
                f"logits), but got {tuple(images.shape)}."
            )
        return torch.cat([z, images], 1)

    def temperature(self, logits: Any, images: Any = None) -> torch.Tensor:
        """The ``(B, 1, H, W)`` temperature map."""
        logits = _as_tensor(logits, "logits")
        return nn.functional.softplus(self.net(self._input(logits.to(self.net[0].weight.dtype), images))) + self.t_min

    def forward(self, logits: Any, images: Any = None) -> torch.Tensor:
        """Calibrated ``(B, K, H, W)`` logits ``z / T(x)``."""
        logits = _as_tensor(logits, "logits")
        return logits / self.temperature(logits, images).to(logits.dtype)

    def fit(
        self,
        logits: Any,
        target: Any,
        images: Any = None,
        *,
        ignore_index: int | None = 255,
        steps: int = 300,
        lr: float = 1e-2,
        seed: int = 0,
        held_out: tuple | None = None,
    ) -> LocalTemperatureScaling:
        """Minimise the NLL of the labelled pixels of ``logits`` (B, K, H, W) against ``target`` (B, H, W) with Adam,
        from hidden weights drawn from ``seed`` (the same fit whatever the global random state); ``held_out``: ``(logits, target)`` or ``(logits, target, images)`` to measure the map on as well (recorded
        for the model card)."""
        logits, target = _as_tensor(logits, "logits").float(), _as_tensor(target, "target").to(torch.int64)
        _check_maps(logits, target, ignore_index)
        if ignore_index is not None and not (target != ignore_index).any():
            raise ValueError("Expected labelled pixels in `target`, but every one is `ignore_index`.")
        loss_fn = nn.CrossEntropyLoss(ignore_index=-100 if ignore_index is None else ignore_index)
        self._initialise(seed)  # a fit starts afresh, from the same weights for the same seed
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        with torch.enable_grad():
            for _ in range(steps):
                opt.zero_grad()
                loss = loss_fn(self(logits, images), target)
                loss.backward()
                opt.step()
        self.fit_info_ = {
            "kind": self.kind,
            "num_images": int(logits.shape[0]),
            "num_pixels": int((target != ignore_index).sum()) if ignore_index is not None else int(target.numel()),
            "ignore_index": ignore_index,
            "steps": steps,
            "fit_set": self._measure(logits, target, images, ignore_index),
        }
        if held_out is not None:
            if not isinstance(held_out, (tuple, list)) or len(held_out) not in (2, 3):
                raise ValueError("Expected `held_out` to be (logits, target) or (logits, target, images).")
            z, y = _as_tensor(held_out[0], "held_out logits").float(), _as_tensor(held_out[1], "held_out target")
            self.fit_info_["held_out"] = self._measure(z, y, held_out[2] if len(held_out) == 3 else None, ignore_index)
        return self

    @torch.no_grad()
    def _measure(self, logits: torch.Tensor, target: torch.Tensor, images: Any, ignore_index: int | None) -> dict:
        """Pixel ECE / AdaECE / classwise ECE of ``logits`` before and after the map (PixelCalibrationAccumulator)."""
        out = {}
        for when, z in (("before", logits), ("after", self(logits, images))):
            got = PixelCalibrationAccumulator(self.num_classes, ignore_index=ignore_index).update(z, target).compute()
            out.update({f"{key}_{when}": got[key] for key in _CARD_METRICS if key in got})
        return out

    # ------------------------------------------------------------------ Saved's hooks
    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ValueError("LocalTemperatureScaling is not fitted: call `fit` (or `from_pretrained`) first.")

    def _card_values(self, values: dict[str, Any]) -> dict[str, Any]:
        info = self.fit_info_ or {}
        out = {
            "title": "LocalTemperatureScaling segmentation calibrator",
            "kind": self.kind,
            "model_kind": "a semantic segmenter's pixel logits",
            "method_description": (
                "A small convolutional network predicts a temperature per pixel from the logits"
                + (" and the image" if self.image_channels else "")
                + "; the calibrated logits are z / T(x), so every pixel keeps its predicted class."
            ),
            "citation": "Ding et al., ICCV 2021 (Local Temperature Scaling)",
            "fit_rows": (
                f"| fit images | {info.get('num_images', 'n/a')} ({info.get('num_pixels', 'n/a')} labelled pixels, "
                f"ignore_index {info.get('ignore_index')}) |\n| classes | {self.num_classes} |\n"
            ),
            "metric_rows": metric_rows(info, _CARD_METRICS),
            "metric_note": (
                "Per-pixel top-label metrics over the labelled pixels (ignore_index skipped). Numbers on the fit set "
                "flatter the calibrator: read the held-out rows."
            ),
            "usage": (
                'segmenter = hf_calibration.pipeline("image-segmentation", model="<model repo>")\n'
                'segmenter(image)  # each mask with its calibrated "score" and "probabilities" map'
            ),
            "format_version": self.format_version,
            "pipeline_task": self.pipeline_task,
        }
        out.update(values)
        return out
