"""The calibrators' maps as pure tensor programs: what ``torch.compile``, ``torch.export`` and the ONNX exporter trace.

``Calibrator.forward`` checks its input (finite, right shape) and takes fast paths (fused numba kernels, numpy for the
piecewise maps) that a tracer cannot follow: a data-dependent ``if`` breaks a ``torch.compile`` graph and stops
``torch.export``. ``Calibrator.graph_forward`` computes the same calibrated logits with tensor operations only, no
branch on values, no host synchronisation. The piecewise maps (histogram binning, isotonic regression, splines) are
evaluated here from padded per-group tables (``PiecewiseMaps.graph_tables``): ``(G, L)`` knots padded with ``+inf``,
values padded with the group's last value, and each group's size. A lookup compares a value with its group's row of
knots, so it costs ``O(L)`` per value and exports to ONNX as comparisons, a sum and gathers (ONNX has no
``searchsorted``).

Everything here is float64 where the eager maps are (the piecewise maps and the top-label adaptor): the results agree
with the eager path to rounding (~1e-16 relative), never by a branch taken differently, except where a value sits
exactly on a knot, where both take the same side by construction (``<`` / ``<=`` as ``np.searchsorted`` and
``np.interp`` do).
"""

from __future__ import annotations

import torch

MAX_CONFIDENCE = 1.0 - 1e-12  # a top-label map never reaches 1 (the other K - 1 classes keep a share)


def next_up(x: torch.Tensor) -> torch.Tensor:
    """The next float above ``x``: ``torch.nextafter`` where the tracer supports it; in an ONNX graph (no such operator)
    ``x + max(|x| eps, tiny)``, which is above ``x`` by one or two ulps (the argmax guard only needs it strictly above)."""
    if not torch.onnx.is_in_onnx_export():
        return torch.nextafter(x, torch.full_like(x, float("inf")))
    info = torch.finfo(x.dtype)
    return x + torch.clamp_min(x.abs() * info.eps, info.tiny)


def constant(x: torch.Tensor, value: float) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``x``'s dtype and device. The ONNX exporter writes a Python float that meets a
    float64 tensor (``clamp_max(p, 1 - 1e-12)``, ``t + 0.1``, also ``new_full``) as a float32 constant: 1 - 1e-12
    became 1.0, and 0.1 0.10000000149; a tensor constant keeps its dtype."""
    return torch.tensor(value, dtype=x.dtype, device=x.device)


def one_hot_of(index: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, K) boolean mask of ``index`` (N, 1) (a comparison, which every tracer and ONNX follow)."""
    return torch.arange(num_classes, device=index.device) == index


# ------------------------------------------------------------------------------------------------ the top-label adaptor
def top_label(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top (N, 1), is_top (N, K), confidence (N,), floor (N,), rest (N, K))`` of float64 logits, as
    ``_toplabel.top_label`` computes them with numpy."""
    top = z.argmax(dim=1, keepdim=True)
    is_top = one_hot_of(top, z.shape[1])
    z_top = z.gather(1, top)
    others = z.masked_fill(is_top, float("-inf"))
    second = others.amax(dim=1, keepdim=True)
    lse_rest = second + torch.log(torch.exp(others - second).sum(dim=1, keepdim=True))
    confidence = torch.sigmoid(z_top - lse_rest)[:, 0]
    floor = torch.sigmoid(second - lse_rest)[:, 0]
    return top, is_top, confidence, floor, others - lse_rest


def rescale_top_label(
    is_top: torch.Tensor, floor: torch.Tensor, rest: torch.Tensor, new_confidence: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities with top probability ``new_confidence`` (clamped as ``_toplabel.rescale_top_label`` does)."""

    p = torch.maximum(torch.minimum(new_confidence, constant(new_confidence, MAX_CONFIDENCE)), floor)
    out = rest + torch.log1p(-p)[:, None]
    top_value = torch.maximum(torch.log(p), out.amax(dim=1))  # the top entry of `out` is -inf: the others' max
    return torch.where(is_top, top_value[:, None], out)


# ------------------------------------------------------------------------------------------------ piecewise maps
def _rows(tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor], groups: torch.Tensor):
    knots, values, sizes = tables
    return knots[groups], values[groups], sizes[groups]  # (..., L), (..., L), (...)


def step_lookup(x: torch.Tensor, groups: torch.Tensor, tables) -> torch.Tensor:
    """Each ``x``'s group's step map: ``values[b]`` for ``upper_edges[b - 1] < x <= upper_edges[b]`` (the last bin
    beyond the last inner edge), as ``_piecewise.step_lookup``; the identity for an empty group."""
    knots, values, sizes = _rows(tables, groups)
    inner = torch.arange(knots.shape[-1], device=x.device) < (sizes - 1).unsqueeze(-1)  # edges[:-1]
    index = ((knots < x.unsqueeze(-1)) & inner).sum(dim=-1, keepdim=True)  # np.searchsorted(edges[:-1], x, "left")
    return torch.where(sizes > 0, values.gather(-1, index).squeeze(-1), x)


def linear_interp(x: torch.Tensor, groups: torch.Tensor, tables) -> torch.Tensor:
    """Each ``x``'s group's piecewise-linear map, constant beyond its end knots (``np.interp``'s formula); the identity
    for an empty group."""
    knots, values, sizes = _rows(tables, groups)
    last = knots.shape[-1] - 1
    # index of the last knot <= x (padding is +inf: never counted), -1 below the first
    i = (knots <= x.unsqueeze(-1)).sum(dim=-1, keepdim=True) - 1
    i0, i1 = i.clamp(0, last), (i + 1).clamp(0, last)
    x0, x1 = knots.gather(-1, i0), knots.gather(-1, i1)
    f0, f1 = values.gather(-1, i0), values.gather(-1, i1)
    inside = ((f1 - f0) / (x1 - x0)) * (x.unsqueeze(-1) - x0) + f0  # np.interp: slope * (x - xp[j]) + fp[j]
    first = values[..., :1]
    final = values.gather(-1, (sizes - 1).clamp_min(0).unsqueeze(-1))
    size = sizes.unsqueeze(-1)
    out = torch.where(i < 0, first, torch.where(i >= size - 1, final, inside)).squeeze(-1)
    return torch.where(sizes > 0, out, x)
