"""Calibrators that divide each row of logits by a positive temperature: ``z_i -> z_i / T_i``.

One ``T`` for temperature scaling, ``T(m_i)`` of the logit margin for SMART. Dividing a row by a positive
number keeps its order, so these calibrators never change the argmax. Subclasses implement
``_temperature(z)`` (and, for speed on CPU, ``_forward_cpu`` through the fused kernels of ``_apply``).
"""

from __future__ import annotations

from typing import Any

import torch

from hf_calibration.calibrators._machinery.base import Calibrator
from hf_calibration.calibrators._machinery.forward import apply as _apply
from hf_calibration.calibrators.objectives import OBJECTIVES


class TemperatureCalibrator(Calibrator):
    """A ``Calibrator`` whose map is ``z_i / T_i``: adds ``temperature(logits)`` and the fused CPU forward."""

    objectives = tuple(OBJECTIVES)
    preserves_argmax = True
    shift_invariant = True  # (z + c) / T = z / T + c / T: the same softmax; SMART's margin ignores c

    def _temperature(self, z: torch.Tensor) -> torch.Tensor:
        """Temperatures for logits ``z`` (compute dtype): shape (N, 1) or (), positive, differentiable."""
        raise NotImplementedError

    def _forward_cpu(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """``z / T`` by the fused CPU kernel (``_apply.scale_rows``, into ``out`` when given); None sends the call to the
        torch path."""
        return None

    def _forward_fused(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        # CPU float32/64 without autograd: one pass does the finiteness check, the division and the argmax guard
        return self._forward_cpu(z, out) if _apply.supports(z) else None

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            temp = self._temperature(z)
        out = z / temp
        # one cheap full reduction (a per-row sum + isfinite costs ~100x more); NaN/inf (or a huge total) land here
        if not bool(torch.isfinite(out.sum())):
            # overflow: |z| / T beyond the compute dtype on finite rows (may be none; non-finite rows are the caller's)
            rows = ((~torch.isfinite(out).all(dim=1)) & torch.isfinite(z).all(dim=1)).nonzero()[:, 0]
            zr, tr = z[rows].double(), temp.double()
            shifted = (zr - zr.amax(dim=1, keepdim=True)) / (tr[rows] if tr.ndim else tr)
            out[rows] = shifted.clamp_min(torch.finfo(z.dtype).min).to(z.dtype)
        return out

    def _graph_temperature(self, z: torch.Tensor) -> torch.Tensor:
        """``_temperature`` with tensor operations only (see ``Calibrator._calibrate_graph``); the default is itself."""
        return self._temperature(z)

    def _calibrate_graph(self, z: torch.Tensor) -> torch.Tensor:
        temp = self._graph_temperature(z).detach()
        out = z / temp
        # rows whose |z| / T overflows: shifted by their maximum first, as _calibrate does (the softmax is the same)
        shifted = ((z.double() - z.double().amax(dim=1, keepdim=True)) / temp.double()).clamp_min(
            torch.finfo(z.dtype).min
        )
        return torch.where(torch.isfinite(out).all(dim=1, keepdim=True), out, shifted.to(z.dtype))

    def temperature(self, logits: Any, from_logits: bool | None = None) -> torch.Tensor:
        """Per-sample temperatures (N,) for these logits (all equal for temperature scaling); for probabilities
        (detected as in ``forward``), the temperatures of ``log(p)``."""
        self._check_fitted()
        z, zc = self._prepare(logits, from_logits)
        with torch.no_grad():
            t = self._temperature(zc)
        return t.reshape(-1).expand(z.shape[0]).clone() if t.numel() == 1 else t.reshape(-1)

    def _card_temperature(self) -> str:
        return "a temperature"

    def _card_description(self) -> str:
        return f"It divides the classifier's logits by {self._card_temperature()}."
