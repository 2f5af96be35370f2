"""Per-label piecewise maps of a probability (isotonic regression, histogram binning) for sigmoid heads, in plain torch.

Label ``l``'s map is known at ``counts[l]`` knots, stored in the first entries of row ``l`` of two ``(L, M)`` buffers
(``M`` the largest count; the rest padded with knots at 2, beyond every probability). The forward is torch alone
(``searchsorted`` on the rows, a gather and an interpolation), so the calibrator stays a logits-in / logits-out module.
A calibrated probability is kept in ``[floor_l, 1 - floor_l]``, ``floor_l = 1 / (2 (n_l + 1))`` for a label fitted on
``n_l`` samples (half a sample's worth: a bin or a run of the fit set that held no positive says the frequency is
below about ``1 / n_l``, not that it is 0), so that every calibrated logit, and every NLL, is finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import check_int
from hf_calibration.calibrators._machinery.sigmoid.base import SigmoidCalibrator

PAD = 2.0  # knot padding: beyond every probability


class PiecewiseSigmoidCalibrator(SigmoidCalibrator):
    """A sigmoid calibrator whose per-label maps are piecewise (linear, or step with ``step = True``) in the probability."""

    smooth = False  # binning's steps, isotonic regression's flat stretches

    step: bool = False
    objectives = ("nll",)

    def __init__(self, num_labels: int | None = None, task: str | None = None, num_knots: int | None = None):
        self.num_knots = None if num_knots is None else check_int(num_knots, "num_knots", minimum=1)
        super().__init__(num_labels, task)

    def _allocate(self, num_labels: int) -> None:
        m = self.num_knots or 1
        self.register_buffer("knots", torch.full((num_labels, m), PAD, dtype=torch.float64))
        self.register_buffer("values", torch.zeros((num_labels, m), dtype=torch.float64))
        self.register_buffer("counts", torch.zeros(num_labels, dtype=torch.int64))
        self.register_buffer("floor", torch.zeros(num_labels, dtype=torch.float64))

    def _set_maps(self, maps: Sequence[tuple[np.ndarray, np.ndarray]], fit_sizes: np.ndarray) -> None:
        """Store one ``(knots, values)`` pair per label (knots increasing, in [0, 1])."""
        m = max(1, max(len(k) for k, _ in maps))
        self.num_knots = m
        if isinstance(self._hub_mixin_config, dict):
            self._hub_mixin_config["num_knots"] = m
        self._allocate(len(maps))
        with torch.no_grad():
            for l, (k, v) in enumerate(maps):
                self.knots[l, : len(k)] = torch.from_numpy(np.asarray(k, np.float64))
                self.values[l, : len(v)] = torch.from_numpy(np.asarray(v, np.float64))
                self.counts[l] = len(k)
            self.floor.copy_(torch.from_numpy(0.5 / (np.asarray(fit_sizes, np.float64) + 1.0)))

    def _map_probability(self, p: torch.Tensor, graph: bool = False) -> torch.Tensor:
        """The calibrated probability of each ``(N, L)`` entry of ``p``, through its label's map. ``graph``: the knot
        positions by comparisons against each label's row of knots instead of ``searchsorted`` (which ONNX lacks), the
        same index (padding knots lie beyond every probability: never counted), ``O(M)`` per value."""
        knots, values = self.knots.to(p), self.values.to(p)
        counts = self.counts.to(p.device)
        x = p.t().contiguous()  # (L, N): searchsorted searches each row of knots with the same row of x
        if self.step:  # bin e_{b-1} < p <= e_b: the number of inner upper edges strictly below p
            if graph:
                inner = torch.arange(knots.shape[1], device=p.device)[None, :] < (counts - 1)[:, None]  # (L, M)
                index = ((knots[:, None, :] < x[:, :, None]) & inner[:, None, :]).sum(dim=2)
            else:
                index = (
                    torch.searchsorted(knots[:, :-1].contiguous(), x, right=False)
                    if knots.shape[1] > 1
                    else torch.zeros_like(x, dtype=torch.long)
                )
            index = torch.minimum(index, (counts - 1).clamp_min(0)[:, None])
            out = torch.gather(values, 1, index)
        else:  # linear between knots, constant beyond the first and last
            hi = (knots[:, None, :] <= x[:, :, None]).sum(dim=2) if graph else torch.searchsorted(knots, x, right=True)
            hi = torch.minimum(hi.clamp_min(1), (counts - 1).clamp_min(0)[:, None])
            lo = (hi - 1).clamp_min(0)
            k_lo, k_hi = torch.gather(knots, 1, lo), torch.gather(knots, 1, hi)
            v_lo, v_hi = torch.gather(values, 1, lo), torch.gather(values, 1, hi)
            width = k_hi - k_lo
            t = torch.where(
                width > 0, ((x - k_lo) / torch.where(width > 0, width, 1.0)).clamp(0.0, 1.0), torch.zeros_like(x)
            )
            out = torch.where(x <= k_lo, v_lo, v_lo + t * (v_hi - v_lo))
        floor = self.floor.to(p)[:, None]
        return torch.minimum(torch.maximum(out, floor), 1.0 - floor).t()

    def _calibrate_logits(self, z: torch.Tensor, graph: bool = False) -> torch.Tensor:
        q = self._map_probability(torch.sigmoid(z), graph)
        return torch.log(q) - torch.log1p(-q)

    def _calibrate_graph_logits(self, z: torch.Tensor) -> torch.Tensor:
        return self._calibrate_logits(z, graph=True)

    def _check_state(self, where: str) -> None:
        counts = self.counts
        m = self.knots.shape[1]
        if bool((counts < 1).any()) or bool((counts > m).any()):
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: each label's knot count must be in [1, {m}]."
            )
        for l in range(self.knots.shape[0]):
            k, v = self.knots[l, : int(counts[l])], self.values[l, : int(counts[l])]
            if (
                bool((k < 0).any())
                or bool((k > 1).any())
                or bool((k[1:] < k[:-1]).any())
                or bool((v < 0).any())
                or bool((v > 1).any())
            ):
                raise ValueError(
                    f"The calibrator weights {where!r} are corrupted: label {l}'s map has knots out of order or "
                    "knots / values outside [0, 1]."
                )
        if bool((self.floor <= 0).any()) or bool((self.floor >= 0.5).any()):
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: the probability floor must be in (0, 0.5)."
            )

    def _fit_labels(self, z: np.ndarray, y: np.ndarray, mask: np.ndarray, progress_bar: bool) -> dict[str, Any]:
        from scipy.special import expit

        p = expit(z)
        maps = [self._fit_one(p[mask[:, l], l], y[mask[:, l], l]) for l in range(z.shape[1])]
        self._set_maps(maps, mask.sum(axis=0))
        return {"knots_per_label": [len(k) for k, _ in maps]}

    def _fit_one(self, p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError
