"""Piecewise maps of a probability, fitted per group: stored as flat knots, evaluated with numpy, saved at any size.

Histogram binning (a step function per bin), isotonic regression and the spline calibrator (piecewise linear
between knots) all calibrate a probability ``x`` in [0, 1] with a map that is known at a data-dependent number
of points, one map per group (one group for a top-label map; one per predicted class or per class for the
per-class variants). ``PiecewiseMaps`` keeps them in three buffers,

    knots   (total,)   float64   group g's knots are knots[offsets[g] : offsets[g + 1]], increasing, in [0, 1]
    values  (total,)   float64   the map's value at (linear) or on the bin ending at (step) each knot, in [0, 1]
    offsets (G + 1,)   int64

so that a checkpoint is three tensors whatever the fit set was. A group with no knots is the identity.
The maps are evaluated with numpy on the CPU: single-threaded, so that they stay fast on a busy machine
(torch's parallel kernels on small (N, K) arrays stall there).
Loading resizes the buffers to the checkpoint's shapes (a fitted calibrator's size is not known before).
The same maps are also kept as padded ``(G, L)`` tables (non-persistent buffers, rebuilt by ``set`` and by loading),
which ``forward/graph.py`` evaluates with tensor operations only, for ``torch.compile``, ``torch.export`` and ONNX.

``PiecewiseCalibrator`` is the base of the calibrators built from such maps. They have no fit objective to
choose: each fits its own criterion (bin frequencies, the isotonic least-squares fit, a least-squares spline),
named by ``default_objective`` and recorded in the card; ``fit(objective=None)`` (or that name) fits it and
any other objective is a ``ValueError``. A loaded checkpoint whose maps are inconsistent (offsets that do not
index the knots, knots out of order, knots or values outside [0, 1]) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hf_calibration.calibrators._machinery.base import Calibrator


def step_lookup(x: np.ndarray, upper_edges: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values[b]`` for the bin ``upper_edges[b - 1] < x <= upper_edges[b]`` (below the first edge: bin 0; above
    the last inner edge: the last bin, whatever ``upper_edges[-1]`` is)."""
    return values[np.searchsorted(upper_edges[:-1], x, side="left")]


def linear_interp(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Linear between increasing knots ``xp``, constant beyond the ends (``np.interp``)."""
    return np.interp(x, xp, fp)


def clip_linear_map(
    xp: np.ndarray, fp: np.ndarray, low: float = 0.0, high: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Knots of ``clip(interp(x, xp, fp), low, high)`` itself: the values clipped, and a knot added where a segment
    crosses ``low`` or ``high``, so that interpolating the result gives the clipped map at every ``x``."""
    xp, fp = np.asarray(xp, np.float64), np.asarray(fp, np.float64)
    x0, x1, v0, v1 = xp[:-1], xp[1:], fp[:-1], fp[1:]
    points = [(xp, fp)]
    for bound in (low, high):
        crossing = (v0 - bound) * (v1 - bound) < 0  # strictly on both sides
        t = (bound - v0[crossing]) / (v1[crossing] - v0[crossing])
        points.append((x0[crossing] + t * (x1[crossing] - x0[crossing]), np.full(int(crossing.sum()), bound)))
    x = np.concatenate([p[0] for p in points])
    v = np.concatenate([p[1] for p in points])
    order = np.argsort(x, kind="stable")
    return x[order], np.clip(v[order], low, high)


class PiecewiseMaps(nn.Module):
    """One piecewise map of [0, 1] per group, as step functions or piecewise-linear interpolants."""

    _SHAPED = ("knots", "values", "offsets")

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("knots", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("values", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("offsets", torch.zeros(1, dtype=torch.int64))
        # padded per-group tables for the traceable path (forward/graph.py): rebuilt from the three above, never saved
        self.register_buffer("graph_knots", torch.full((0, 1), float("inf"), dtype=torch.float64), persistent=False)
        self.register_buffer("graph_values", torch.zeros((0, 1), dtype=torch.float64), persistent=False)
        self.register_buffer("graph_sizes", torch.zeros(0, dtype=torch.int64), persistent=False)

    @property
    def num_groups(self) -> int:
        return self.offsets.numel() - 1

    def set(self, maps: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Store ``[(knots_g, values_g), ...]``, one pair of equal-length arrays per group (empty: identity)."""
        sizes = [len(k) for k, _ in maps]
        device = self.knots.device
        empty = np.zeros(0)
        self.knots = torch.from_numpy(np.concatenate([np.asarray(k, np.float64) for k, _ in maps] or [empty])).to(
            device
        )
        self.values = torch.from_numpy(np.concatenate([np.asarray(v, np.float64) for _, v in maps] or [empty])).to(
            device
        )
        self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)).to(device)
        self._build_graph_tables()

    def _build_graph_tables(self) -> None:
        """The padded ``(G, L)`` tables of the stored maps (knots padded with +inf, values with the group's last)."""
        offsets = self.offsets.detach().cpu().numpy()
        knots, values = self.knots.detach().cpu().numpy(), self.values.detach().cpu().numpy()
        sizes = np.diff(offsets) if offsets.size > 1 else np.zeros(0, np.int64)
        if (sizes < 0).any() or values.size != knots.size or (offsets.size and offsets[-1] != knots.size):
            return  # inconsistent maps: refused by _check_state on load; nothing to tabulate
        width = max(int(sizes.max(initial=0)), 1)
        table_knots = np.full((sizes.size, width), np.inf)
        table_values = np.zeros((sizes.size, width))
        for g, (lo, n) in enumerate(zip(offsets[:-1], sizes)):
            table_knots[g, :n] = knots[lo : lo + n]
            table_values[g, :n] = values[lo : lo + n]
            table_values[g, n:] = values[lo + n - 1] if n else 0.0
        device = self.knots.device
        self.graph_knots = torch.from_numpy(table_knots).to(device)
        self.graph_values = torch.from_numpy(table_values).to(device)
        self.graph_sizes = torch.from_numpy(sizes.astype(np.int64)).to(device)

    def graph_tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(knots (G, L), values (G, L), sizes (G,))``: the maps as ``_graph.step_lookup`` / ``linear_interp`` read them."""
        return self.graph_knots, self.graph_values, self.graph_sizes

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = int(self.offsets[g]), int(self.offsets[g + 1])
        return self.knots[lo:hi], self.values[lo:hi]

    def evaluate(self, x: np.ndarray, groups: np.ndarray | None = None, *, step: bool) -> np.ndarray:
        """The map of each sample's group at ``x`` (float64, shape (N,)); ``groups=None``: group 0 for all."""
        if groups is None:
            return self.evaluate_group(x, 0, step=step)
        out = x.copy()
        for g in np.unique(groups):
            rows = groups == g
            out[rows] = self.evaluate_group(x[rows], int(g), step=step)
        return out

    def evaluate_group(self, x: np.ndarray, g: int, *, step: bool) -> np.ndarray:
        """Group ``g``'s map at ``x`` (float64); the identity for an empty group or one past the last."""
        if g >= self.num_groups or int(self.offsets[g + 1]) == int(self.offsets[g]):
            return x.copy()
        knots, values = (t.detach().cpu().numpy() for t in self.group(g))
        return (step_lookup if step else linear_interp)(x, knots, values)

    def inconsistency(self) -> str | None:
        """What is wrong with the stored maps (offsets that do not index the knots, knots out of order), or None."""
        offsets, n = self.offsets, self.knots.numel()
        if self.values.numel() != n or offsets.numel() < 2 or int(offsets[0]) != 0 or int(offsets[-1]) != n:
            return f"offsets {offsets.tolist()[:4]}... do not index {n} knots and {self.values.numel()} values"
        if bool((offsets[1:] < offsets[:-1]).any()):
            return "offsets decrease"
        inside = torch.ones(max(n - 1, 0), dtype=torch.bool, device=self.knots.device)
        starts = offsets[1:-1]
        inside[(starts[(starts > 0) & (starts < n)] - 1)] = (
            False  # no order between one group's last knot and the next's first
        )
        if bool((self.knots[1:] < self.knots[:-1])[inside].any()):
            return "a group's knots are not increasing"
        for name, tensor in (("knots", self.knots), ("values", self.values)):  # probabilities, both
            outside = (tensor < 0) | (tensor > 1)
            if bool(outside.any()):
                return f"{name} hold {float(tensor[outside][0])!r}, outside [0, 1]"
        return None

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # a fitted map's size depends on its fit set: take the checkpoint's shapes, then load strictly as usual
        for name in self._SHAPED:
            incoming = state_dict.get(prefix + name)
            if isinstance(incoming, torch.Tensor) and incoming.ndim == 1:
                current = self._buffers[name]
                self._buffers[name] = torch.empty(incoming.shape, dtype=current.dtype, device=current.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._build_graph_tables()


class PiecewiseCalibrator(Calibrator):
    """A ``Calibrator`` made of ``PiecewiseMaps`` (in ``self.maps``), with no objective to choose (see the module
    docstring). Its maps read softmax probabilities, so it is ``shift_invariant``."""

    objectives: ClassVar[tuple[str, ...]] = ()
    shift_invariant = True
    criterion: ClassVar[str] = ""  # for the card and error messages: what the fit computes
    per_class_maps: bool = False  # one map per class index: logits with another K are refused

    def _check_logits(self, logits: Any) -> torch.Tensor:
        z = super()._check_logits(logits)
        if self.per_class_maps and self.is_fitted:
            k = self.fit_info_.get("num_classes", self.maps.num_groups)  # maps beyond K (a pooled one) are not classes
            if z.shape[1] != k:
                raise ValueError(
                    f"Expected `logits` to have K = {k} classes (one map per class), but got K = {z.shape[1]}."
                )
        return z

    def _resolve_objective(
        self, objective: str | None, objective_options: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        name = type(self).__name__
        if objective is not None and objective != self.default_objective:
            raise ValueError(
                f"Expected argument `objective` to be None for {name}: it has no objective to choose "
                f"(it fits {self.criterion}), but got {objective!r}."
            )
        if objective_options:
            raise TypeError(f"Unexpected keyword argument(s) for {name}.fit: {sorted(objective_options)}.")
        return self.default_objective, {}

    def _check_state(self, where: str) -> None:
        problem = self.maps.inconsistency()
        if problem is not None:
            raise ValueError(f"The calibrator weights {where!r} are corrupted: {problem}.")
