"""Scores as tensors: what a calibrator or a conformal predictor accepts (torch or numpy), and the one form a map sees.

Which of logits or probabilities the scores are is decided once (:func:`hf_calibration._core.inputs.scores_kind`): rows all in
[0, 1] and summing to 1 (within 1e-2) are probabilities, anything else is logits; an explicit bool wins.
Probabilities are taken as ``log(p)``, logits whose softmax is ``p`` (a zero probability becomes the log of the
dtype's smallest normal number, so every value stays finite). Logits are defined up to a per-row constant,
so a calibrator whose map is not invariant to such shifts sees ``z - max_k z_k`` (``canonical``), which is the
same for ``z`` and for ``log softmax(z)``: a calibrator gives the same probabilities for logits and for their
softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import PROBABILITY_DETECTION_TOLERANCE

_TORCH_FLOATS = (np.float16, np.float32, np.float64)


def native_array(x: np.ndarray, name: str = "logits") -> np.ndarray:
    """``x`` as an array torch can wrap (native byte order, no negative strides), copied only when needed."""
    if x.dtype.kind == "f" and x.dtype.type not in _TORCH_FLOATS:
        raise TypeError(f"Expected `{name}` to be float16, float32 or float64, but got {x.dtype}.")
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    if any(stride < 0 for stride in x.strides):
        x = x.copy()
    return x


def as_tensor(x: Any, name: str = "logits") -> torch.Tensor:
    """A torch tensor (unchanged) or a numpy array (wrapped without a copy where torch can), else ``TypeError``."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiub":  # complex, object, strings: not numbers torch takes as logits
            raise TypeError(f"Expected `{name}` to be a floating array, but got {x.dtype}.")
        return torch.from_numpy(native_array(x, name))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a torch.Tensor or numpy array, but got {type(x).__name__}.")
    return x


def log_probabilities(p: torch.Tensor, dtype: torch.dtype, name: str = "logits") -> torch.Tensor:
    """``log(p)`` in ``dtype`` for (N, K) probabilities, checked: finite, in [0, 1], rows summing to 1 (within 1e-2)."""
    finite = torch.isfinite(p).all(dim=1)
    if not bool(finite.all()):
        raise ValueError(f"Expected `{name}` to be finite, but row {int((~finite).nonzero()[0])} contains NaN or inf.")
    low, high = float(p.min()), float(p.max())
    if low < 0 or high > 1:
        raise ValueError(
            f"Expected `{name}` to hold probabilities in [0, 1] (from_logits=False), but found values in [{low:.4g}, {high:.4g}]."
        )
    sums = p.sum(dim=1, dtype=torch.float64)
    off = (sums - 1).abs()
    if float(off.max()) > PROBABILITY_DETECTION_TOLERANCE:
        row = int(off.argmax())
        raise ValueError(
            f"Expected each row of `{name}` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} (from_logits=False), "
            f"but row {row} sums to {float(sums[row]):.6g}."
        )
    return torch.log(p.to(dtype).clamp_min(torch.finfo(dtype).tiny))


def canonical(z: torch.Tensor) -> torch.Tensor:
    """``z - max_k z_k`` per row (a new tensor): the same for logits and for log-probabilities of one prediction."""
    return z - z.amax(dim=1, keepdim=True)


def logit(p: torch.Tensor) -> torch.Tensor:
    """``log p - log(1 - p)`` of sigmoid probabilities, with ``p`` clipped to ``[eps, 1 - eps]``, ``eps`` the dtype's
    resolution at 1 (2^-53 for float64, 2^-24 below): a probability stored as 1.0 says only that it is within that of 1,
    so its logit is at most ``log((1 - eps) / eps)`` (36.7 in float64, as betacal reads it), not the 708 that the
    smallest normal number would give; one confidently wrong sample then no longer dominates a fit's loss."""
    eps = 2.0**-53 if p.dtype == torch.float64 else 2.0**-24
    q = p.clamp(eps, 1.0 - eps)
    return torch.log(q) - torch.log1p(-q)
