"""Per-pixel calibration of semantic segmentation, streamed over images in O(bins) memory.

``PixelCalibrationAccumulator`` takes batches of ``(B, K, H, W)`` logits (or probabilities) and ``(B, H, W)`` labels,
skips ``ignore_index`` pixels, and keeps only per-bin sums, so a 2,000-image evaluation holds no pixel:

* top-label ECE (Guo et al. 2017, eq. 3) over all pixels and over *boundary* pixels (those within ``boundary_width``
  pixels, Chebyshev distance, of a pixel of another label — an ``ignore_index`` pixel counts as another label, as
  the void band that VOC / ADE20K draw along object edges): ``3 * n_bins`` sums each;
* classwise ECE (mean over classes ``k`` of the ECE of ``p_k`` against ``[y = k]``, each normalised by the pixel
  count): the signed sums ``sum [p_ik in b] (p_ik - [y_i = k])``, ``K * n_bins`` numbers;
* AdaECE (equal-count bins): from a ``adaptive_cells``-cell histogram of the top-label confidence (count, sum of
  confidence, sum of correctness per cell): each of the ``n_bins`` equal-count bins is a run of whole cells, cut
  where the cumulative count first reaches ``b * N / n_bins``. It equals the exact AdaECE whenever no cell
  straddles a cut (true of distinct confidences more than a cell apart); otherwise a bin's count is off by at most
  the pixels of one cell.

The bin rule is the package's (``lo < p <= hi``, 0 in the first bin). NaN or +inf scores are refused (checked on each
pixel's confidence, where they surface); a -inf logit is a probability of 0. Softmax runs in the input's floating dtype
(float16 / bfloat16 in float32) on the input's device, a slab of rows at a time; the sums are float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hf_calibration._core.bins import uniform_bin_index_torch

__all__ = ["PixelCalibrationAccumulator", "pixel_calibration_report"]

_SLAB_ELEMENTS = 1 << 20  # values of one (K, rows, W) slab: 4 MB of float32 temporaries, few enough slabs that the
# per-operation cost stays small (2^18-2^22 measured: benchmarks/RESULTS.md)


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, torch.Tensor):
        return x.detach()
    raise TypeError(f"Expected `{name}` to be a torch tensor or numpy array, but got {type(x).__name__}.")


def boundary_mask(target: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, H, W)`` bool: the pixels within ``width`` pixels (Chebyshev) of a pixel with another label."""
    labels = target.to(torch.float32).unsqueeze(1)
    size = 2 * width + 1
    high = F.max_pool2d(labels, size, stride=1, padding=width)
    low = -F.max_pool2d(-labels, size, stride=1, padding=width)
    return (high != low).squeeze(1)


class PixelCalibrationAccumulator:
    """Streamed per-pixel ECE, AdaECE, classwise ECE and boundary ECE of a semantic segmenter.

    Args:
        num_classes: K, the channels of the logits.
        n_bins: equal-width (ECE, classwise, boundary) and equal-count (AdaECE) bins.
        ignore_index: label of pixels to skip (255, the VOC / ADE20K / Cityscapes void).
        boundary_width: also the ECE of the pixels within this many pixels of a label edge (None: not kept).
        classwise: keep the ``K * n_bins`` classwise sums (one binning of every probability: the costly part).
        adaptive_cells: resolution of the AdaECE histogram.
        from_logits: whether ``preds`` are logits; None: probabilities when every value is in [0, 1] and each
            pixel's values sum to 1 (within 1e-3), decided on the first batch and kept.

    Example:
        >>> import torch
        >>> acc = PixelCalibrationAccumulator(3, n_bins=10)
        >>> logits = torch.zeros(1, 3, 2, 2)
        >>> logits[0, 0] = 5.0
        >>> _ = acc.update(logits, torch.tensor([[[0, 0], [1, 255]]]))
        >>> round(acc.compute()["ece"], 4)   # 3 labelled pixels at confidence 0.9867, 2 of them correct
        0.32
    """

    def __init__(
        self,
        num_classes: int,
        *,
        n_bins: int = 15,
        ignore_index: int | None = 255,
        boundary_width: int | None = None,
        classwise: bool = True,
        adaptive_cells: int = 1 << 14,
        from_logits: bool | None = None,
    ) -> None:
        for name, value, low in (
            ("num_classes", num_classes, 2),
            ("n_bins", n_bins, 1),
            ("adaptive_cells", adaptive_cells, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"Expected argument `{name}` to be an integer >= {low}, but got {value!r}.")
        if boundary_width is not None and (
            isinstance(boundary_width, bool) or not isinstance(boundary_width, int) or boundary_width < 1
        ):
            raise ValueError(
                f"Expected argument `boundary_width` to be None or an integer >= 1, but got {boundary_width!r}."
            )
        if ignore_index is not None and 0 <= ignore_index < num_classes:
            raise ValueError(f"Expected argument `ignore_index` outside [0, {num_classes}), but got {ignore_index}.")
        self.num_classes, self.n_bins, self.ignore_index = int(num_classes), int(n_bins), ignore_index
        self.boundary_width, self.classwise, self.adaptive_cells = boundary_width, bool(classwise), int(adaptive_cells)
        self.from_logits = from_logits
        self.reset()

    def reset(self) -> PixelCalibrationAccumulator:
        """Forget every batch."""
        self.top = torch.zeros(3, self.n_bins, dtype=torch.float64)  # count, sum of confidence, sum of correctness
        self.boundary = torch.zeros(3, self.n_bins, dtype=torch.float64)
        self.cells = torch.zeros(3, self.adaptive_cells, dtype=torch.float64)
        self.signed = torch.zeros(self.num_classes, self.n_bins, dtype=torch.float64)
        return self

    # ------------------------------------------------------------------ input
    def _check(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.ndim != 4 or preds.shape[1] != self.num_classes:
            raise ValueError(f"Expected `preds` of shape (B, {self.num_classes}, H, W), but got {tuple(preds.shape)}.")
        if not preds.is_floating_point():
            raise TypeError(f"Expected `preds` to be floating point, but got {preds.dtype}.")
        if target.ndim != 3 or target.shape != (preds.shape[0], *preds.shape[2:]):
            raise ValueError(
                f"Expected `target` of shape {(preds.shape[0], *preds.shape[2:])} (the logits' batch and size; upsample the "
                f"logits to the label map first), but got {tuple(target.shape)}."
            )
        if target.is_floating_point() or target.dtype == torch.bool:
            raise TypeError(f"Expected `target` to hold integer labels, but got {target.dtype}.")
        valid = target if self.ignore_index is None else target[target != self.ignore_index]
        if valid.numel() and (valid.min() < 0 or valid.max() >= self.num_classes):
            bad = valid[(valid < 0) | (valid >= self.num_classes)][0].item()
            raise ValueError(
                f"Expected `target` labels in [0, {self.num_classes}) or `ignore_index` ({self.ignore_index}), but got {bad}."
            )
        if self.from_logits is None and preds.numel():  # an empty batch decides nothing (and adds nothing)
            probs = bool(preds.min() >= 0) and bool(preds.max() <= 1) and bool(((preds.sum(1) - 1).abs() <= 1e-3).all())
            self.from_logits = not probs

    def update(self, preds: Any, target: Any) -> PixelCalibrationAccumulator:
        """Add a batch: ``preds`` (B, K, H, W) logits or probabilities, ``target`` (B, H, W) labels."""
        preds, target = _as_tensor(preds, "preds"), _as_tensor(target, "target")
        self._check(preds, target)
        target = target.to(preds.device, torch.int64)
        edge = boundary_mask(target, self.boundary_width) if self.boundary_width else None
        committed = self.top, self.boundary, self.cells, self.signed
        self.top, self.boundary, self.cells, self.signed = (torch.zeros_like(t) for t in committed)
        try:
            for b in range(preds.shape[0]):
                self._image(preds[b], target[b].reshape(-1), None if edge is None else edge[b].reshape(-1))
            for mine, theirs in zip(committed, (self.top, self.boundary, self.cells, self.signed)):
                mine += theirs
        finally:  # a batch refused half-way adds nothing
            self.top, self.boundary, self.cells, self.signed = committed
        return self

    def _image(self, scores: torch.Tensor, y: torch.Tensor, edge: torch.Tensor | None) -> None:
        """One image: ``scores`` (K, H, W), ``y`` (H * W,) labels, ``edge`` (H * W,) boundary pixels.

        The per-pixel confidence and correctness come from slabs of rows small enough to stay in cache (the
        classwise sums too, where kept); the binning runs once over the image's labelled pixels.
        """
        keep = y != self.ignore_index if self.ignore_index is not None else torch.ones_like(y, dtype=torch.bool)
        if not keep.any():
            return
        k, h, w = scores.shape
        dtype = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
        conf = torch.empty(h * w, dtype=dtype, device=scores.device)
        hit = torch.empty(h * w, dtype=torch.bool, device=scores.device)
        label = torch.where(keep, y, 0)  # ignored pixels read class 0 and are dropped below
        rows = max(1, _SLAB_ELEMENTS // (k * w))
        for r in range(0, h, rows):
            part = slice(r * w, min(r + rows, h) * w)
            z, yy = scores[:, r : r + rows].reshape(k, -1).to(dtype), label[part]
            if not self.from_logits or self.classwise:
                p = z if not self.from_logits else torch.softmax(z, 0)
                top, pred = p.max(0)
                conf[part], hit[part] = top, pred == yy
                if self.classwise:
                    self._classwise(p, yy, keep[part])
                continue
            # Logits, top label only: conf = 1 / sum_k exp(z_k - max z), with no (K, n) probabilities kept. A pixel
            # is right when its label's logit is the maximum and no earlier class ties it (argmax's first index);
            # a tie puts two exp(0) = 1 terms in the sum, so only pixels with a sum >= 2 need the full argmax.
            top = z.amax(0)
            total = (z - top).exp_().sum(0)
            right = z.gather(0, yy.unsqueeze(0)).squeeze(0) == top
            tied = right & (total >= 2)
            if bool(tied.any()):
                right[tied] = z[:, tied].argmax(0) == yy[tied]
            conf[part], hit[part] = total.reciprocal(), right
        if not bool(keep.all()):
            conf, hit = conf[keep], hit[keep]
            edge = None if edge is None else edge[keep]
        if not bool(torch.isfinite(conf).all()):  # NaN or +inf anywhere in a pixel's scores reaches its confidence
            raise ValueError("Expected `preds` to be finite, but it holds NaN or inf.")
        correct = hit.to(torch.float64)
        conf64 = conf.to(torch.float64)
        index = uniform_bin_index_torch(conf64, self.n_bins)
        self.top += self._sums(index, conf64, correct, self.n_bins)
        if edge is not None:
            self.boundary += self._sums(index[edge], conf64[edge], correct[edge], self.n_bins)
        cells = (conf64 * self.adaptive_cells).ceil().to(torch.int64).clamp_(1, self.adaptive_cells) - 1
        self.cells += self._sums(cells, conf64, correct, self.adaptive_cells)

    def _classwise(self, p: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> None:
        """Signed classwise sums of one slab's labelled pixels: ``p`` (K, n) probabilities, ``y`` (n,) labels."""
        if not bool(keep.all()):
            p, y = p[:, keep], y[keep]
        p = p.to(torch.float64)
        bins = uniform_bin_index_torch(p, self.n_bins)  # (K, n)
        flat = bins + torch.arange(self.num_classes, device=p.device).unsqueeze(1) * self.n_bins
        signed = torch.bincount(flat.reshape(-1), p.reshape(-1), self.num_classes * self.n_bins)
        p_true = p.gather(0, y.unsqueeze(0)).squeeze(0)
        signed -= torch.bincount(
            y * self.n_bins + uniform_bin_index_torch(p_true, self.n_bins), minlength=self.num_classes * self.n_bins
        )
        self.signed += signed.view(self.num_classes, self.n_bins).cpu()

    @staticmethod
    def _sums(index: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor, size: int) -> torch.Tensor:
        return torch.stack(
            [
                torch.bincount(index, minlength=size).to(torch.float64),
                torch.bincount(index, conf, size),
                torch.bincount(index, correct, size),
            ]
        ).cpu()

    # ------------------------------------------------------------------ output
    @staticmethod
    def _ece(sums: torch.Tensor) -> float:
        n = sums[0].sum()
        return float((sums[1] - sums[2]).abs().sum() / n) if n > 0 else float("nan")

    def _adaece(self) -> float:
        count, conf, correct = self.cells
        n = count.sum()
        cut = torch.ceil(torch.cumsum(count, 0) * self.n_bins / n - 1e-9).clamp(1, self.n_bins).to(torch.int64) - 1
        group = lambda v: torch.zeros(self.n_bins, dtype=torch.float64).index_add_(0, cut, v)  # noqa: E731
        return float((group(conf) - group(correct)).abs().sum() / n)

    def compute(self) -> dict[str, float]:
        """``pixels``, ``accuracy``, ``ece``, ``adaece``, and ``classwise_ece`` / ``boundary_ece`` /
        ``boundary_pixels`` where kept (fractions, not percent)."""
        n = float(self.top[0].sum())
        if n == 0:
            raise ValueError(
                "Expected at least one labelled pixel (not `ignore_index`) before `compute`, but there are none."
            )
        out = {
            "pixels": n,
            "accuracy": float(self.top[2].sum()) / n,
            "ece": self._ece(self.top),
            "adaece": self._adaece(),
        }
        if self.classwise:
            out["classwise_ece"] = float(self.signed.abs().sum(1).mean() / n)
        if self.boundary_width:
            out["boundary_pixels"] = float(self.boundary[0].sum())
            out["boundary_ece"] = self._ece(self.boundary)
        return out


def pixel_calibration_report(preds: Any, target: Any, **kwargs: Any) -> dict[str, float]:
    """``PixelCalibrationAccumulator(K, **kwargs).update(preds, target).compute()`` for one batch (B, K, H, W)."""
    preds = _as_tensor(preds, "preds")
    if preds.ndim != 4:
        raise ValueError(f"Expected `preds` of shape (B, K, H, W), but got {tuple(preds.shape)}.")
    return PixelCalibrationAccumulator(preds.shape[1], **kwargs).update(preds, target).compute()
