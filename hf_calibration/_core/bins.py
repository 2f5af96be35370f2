"""The equal-width bin rule, written once: every binned path (batch metrics, the top-label pass, the streaming
accumulator, the classwise pass and its bootstrap) calls these.

``n_bins`` equal-width bins on (0, 1]: bin ``b`` holds ``edges[b] < p <= edges[b + 1]`` with
``edges = linspace(0, 1, n_bins + 1)``; ``p <= 0`` goes to the first bin and ``p >= 1`` to the last (Guo et al. 2017;
no phantom bin for ``p = 1``, unlike torchmetrics).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from hf_calibration._core.numpy_twin import NumpyTwin

__all__ = ["in_lowest_bin", "uniform_bin", "uniform_bin_index", "uniform_bin_index_torch", "uniform_edges"]


def uniform_edges(n_bins: int) -> np.ndarray:
    """The ``n_bins + 1`` equal-width bin edges on [0, 1] (float64)."""
    return np.linspace(0.0, 1.0, n_bins + 1)


@numba.njit(cache=True, nogil=True)
def uniform_bin(p, edges):  # pragma: no cover - compiled
    """The equal-width bin of one value ``p``: ``b`` with ``edges[b] < p <= edges[b + 1]`` (``edges`` from
    ``uniform_edges``), ``p <= 0`` in the first bin and ``p >= 1`` in the last."""
    n_bins = edges.shape[0] - 1
    b = min(max(int(p * n_bins), 0), n_bins - 1)  # the right bin or its neighbour: floating rounding of p * n_bins
    while b > 0 and p <= edges[b]:
        b -= 1
    while b < n_bins - 1 and p > edges[b + 1]:
        b += 1
    return b


@numba.njit(cache=True, nogil=True, inline="always")
def in_lowest_bin(p, edges):  # pragma: no cover - compiled
    """Whether ``p`` is in the first bin (``p <= edges[1]``): ``uniform_bin(p, edges) == 0``, one comparison."""
    return p <= edges[1] or edges.shape[0] == 2


@numba.njit(cache=True, nogil=True)
def _uniform_bins(values, edges, out):  # pragma: no cover - compiled
    for i in range(values.shape[0]):
        out[i] = uniform_bin(values[i], edges)


_TWIN = NumpyTwin(_uniform_bins, compile_seconds=0.2, seconds_per_value=2e-8)


def uniform_bin_index(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each value under ``lo < p <= hi``; 0 → first bin, 1 → last bin (``uniform_bin``). Any shape."""
    values = np.ascontiguousarray(confidence, dtype=np.float64)
    if _TWIN.use(values.size):  # searchsorted's "left" side is the rule: edges[b] < p <= edges[b + 1]
        edges = uniform_edges(n_bins)
        return _TWIN.run(lambda: np.clip(np.searchsorted(edges, values, side="left") - 1, 0, n_bins - 1))
    out = np.empty(values.shape, dtype=np.int64)
    _uniform_bins(values.reshape(-1), uniform_edges(n_bins), out.reshape(-1))
    return out


def uniform_bin_index_torch(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """``uniform_bin_index`` for a tensor on its device: the same rule and the same float64 edges (``values`` compared
    in float64, so a float32 value just above an edge lands where the numpy path puts it)."""
    inner = torch.from_numpy(uniform_edges(n_bins)[1:-1]).to(values.device)
    return torch.bucketize(values.to(torch.float64), inner)  # "left": edges[b] < p <= edges[b + 1]; clipped ends
