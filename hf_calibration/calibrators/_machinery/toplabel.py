"""The top-label adaptor: calibrate only the top probability, rescale the rest, return log-probabilities.

A top-label method (histogram binning, isotonic regression, spline) learns a map ``p -> p'`` of the top-label
confidence ``p_1 = max_k softmax(z)_k``. The full calibrated distribution is

    q_top = p',     q_k = p_k (1 - p') / (1 - p_1)   for every other class k

(the other K - 1 probabilities rescaled in proportion), returned as log-probabilities, so ``attach`` and
pipelines see logits as usual. Computed in float64 from the logits: ``log q_k = z_k - logsumexp_{j != top} z_j
+ log(1 - p')``, exact even where ``1 - p_1`` underflows.

Two clamps keep the result a valid prediction of the same class:

* ``p' >= p_2 / (1 - p_1 + p_2)``, where the runner-up ``p_2 (1 - p') / (1 - p_1)`` would tie with the top.
  A map may return a small ``p'`` (a bin where the model was mostly wrong), and rescaling would then
  promote another class: ``p = [0.5, 0.4, 0.1]`` with ``p' = 0.3`` gives ``[0.3, 0.56, 0.14]``. At the
  floor the two tie; the base class's argmax guard then keeps the original top strictly on top. The floor
  is at least 1/K, and 1/2 for K = 2.
* ``p' <= 1 - 1e-12``, so every class keeps a non-zero probability and the NLL stays finite when a bin of
  the fit set was all correct (a wrong prediction there then costs about 27.6 nats and more).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from hf_calibration.calibrators._machinery.forward.graph import MAX_CONFIDENCE
from hf_calibration.calibrators._machinery.piecewise import PiecewiseCalibrator


class TopLabel(NamedTuple):
    """The top-label view of float64 logits (all (N,) but ``rest``)."""

    top: np.ndarray  # int64, argmax
    confidence: np.ndarray  # p_1
    floor: np.ndarray  # p_2 / (1 - p_1 + p_2): the smallest p' that keeps the top on top
    rest: np.ndarray  # (N, K): z_k - logsumexp_{j != top} z_j, -inf at the top (log of p_k / (1 - p_1))


def top_label(z: np.ndarray) -> TopLabel:
    """``TopLabel`` of logits ``z`` (numpy, computed in float64)."""
    from scipy.special import expit

    z = np.asarray(z, dtype=np.float64)
    rows = np.arange(z.shape[0])
    top = z.argmax(axis=1)
    z_top = z[rows, top]
    others = z.copy()
    others[rows, top] = -np.inf
    second = others.max(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN rows stay NaN (the caller reports them)
        lse_rest = second + np.log(np.exp(others - second[:, None]).sum(axis=1))
    rest = others - lse_rest[:, None]
    confidence = expit(z_top - lse_rest)  # 1 / (1 + sum_{k != top} exp(z_k - z_top))
    floor = expit(second - lse_rest)  # r / (1 + r) with r = p_2 / (1 - p_1)
    return TopLabel(top, confidence, floor, rest)


def rescale_top_label(parts: TopLabel, new_confidence: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) with top probability ``new_confidence`` (clamped as the module says)."""
    rows = np.arange(parts.top.shape[0])
    p = np.maximum(np.minimum(np.asarray(new_confidence, dtype=np.float64), MAX_CONFIDENCE), parts.floor)
    out = parts.rest + np.log1p(-p)[:, None]
    out[rows, parts.top] = np.maximum(np.log(p), out.max(axis=1))  # at the floor: a tie, never rounded below
    return out


class TopLabelCalibrator(PiecewiseCalibrator):
    """A calibrator that maps the top-label confidence only (``_map_confidence``) and keeps the argmax.

    Subclasses implement ``_fit_confidence`` and ``_map_confidence``.
    """

    preserves_argmax = True

    def _fit_confidence(
        self, confidence: np.ndarray, correct: np.ndarray, top: np.ndarray, num_classes: int
    ) -> dict[str, Any]:
        """Fit the map from top-label confidences (float64), their correctness (bool) and predicted classes."""
        raise NotImplementedError

    def _map_confidence(self, confidence: np.ndarray, top: np.ndarray) -> np.ndarray:
        """Calibrated top-label confidences (float64, (N,)) for confidences and predicted classes."""
        raise NotImplementedError

    def _map_confidence_graph(self, confidence: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """``_map_confidence`` in tensor operations (float64 (N,) confidences, (N,) predicted classes), for tracers."""
        raise NotImplementedError

    def _calibrate_graph(self, z: torch.Tensor) -> torch.Tensor:
        from hf_calibration.calibrators._machinery.forward import graph as _graph

        top, is_top, confidence, floor, rest = _graph.top_label(z.double())
        out = _graph.rescale_top_label(is_top, floor, rest, self._map_confidence_graph(confidence, top[:, 0]))
        return out.to(z.dtype)

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        # numpy on the CPU (see _piecewise.py): single-threaded, steady on a busy machine, any input device
        parts = top_label(z.detach().cpu().numpy())
        out = rescale_top_label(parts, self._map_confidence(parts.confidence, parts.top))
        return torch.from_numpy(out).to(device=z.device, dtype=z.dtype)

    fits_in_blocks = True

    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict:
        """The map is fitted on the (N,) top-label confidences and predicted classes alone, gathered a block of rows at a
        time (``top_label`` of each block: the same numbers as of the whole array)."""
        n, k = rows.shape
        confidence, top = np.empty(n), np.empty(n, dtype=np.int64)
        for start, block in rows.blocks():
            parts = top_label(block)
            confidence[start : start + block.shape[0]], top[start : start + block.shape[0]] = (
                parts.confidence,
                parts.top,
            )
        return self._fit_confidence(confidence, top == labels, top, k)

    def _card_description(self) -> str:
        return (
            f"It recalibrates the top-label confidence ({self.criterion}) and rescales the other classes' "
            "probabilities in proportion."
        )
