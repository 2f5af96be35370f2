"""How good prediction sets are: empirical coverage and mean set size (Angelopoulos et al. 2021, Table 1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import IGNORE_INDEX, check_labels_in_range, to_numpy


def _check_sets(sets: Any, name: str = "sets") -> np.ndarray:
    sets = to_numpy(sets, name)
    if sets.ndim != 2:
        raise ValueError(f"Expected `{name}` to be an (N, K) boolean mask (rank 2), but got shape {tuple(sets.shape)}.")
    if sets.dtype != np.bool_:
        if sets.dtype.kind not in "iuf" or not np.isin(sets, (0, 1)).all():
            raise TypeError(f"Expected `{name}` to be a boolean (N, K) mask (or 0/1 values), but got {sets.dtype}.")
        sets = sets.astype(bool)
    if sets.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, but got shape {tuple(sets.shape)}.")
    return sets


def coverage(sets: Any, labels: Any, *, ignore_index: int | None = IGNORE_INDEX) -> float:
    """The fraction of samples whose label is in its set: ``mean_i [y_i in C(x_i)]``. Labels equal to ``ignore_index``
    (-100) are left out."""
    sets = _check_sets(sets)
    labels = to_numpy(labels, "labels")
    if labels.ndim != 1 or labels.shape[0] != sets.shape[0]:
        raise ValueError(
            f"Expected `labels` to have shape ({sets.shape[0]},) to match `sets`, but got {tuple(labels.shape)}."
        )
    if labels.dtype.kind not in "iu":
        raise TypeError(f"Expected `labels` to be integer class indices, but got {labels.dtype}.")
    check_labels_in_range(labels, sets.shape[1], "labels", ignore_index)
    keep = labels != ignore_index if ignore_index is not None else np.ones(labels.shape, bool)
    if not keep.any():
        raise ValueError(f"Expected at least one label in `labels` that is not ignore_index={ignore_index}.")
    return float(sets[keep, labels[keep]].mean())


def set_sizes(sets: Any) -> np.ndarray | torch.Tensor:
    """The size of each set, (N,) int64 (numpy for numpy, torch on the same device for torch)."""
    if isinstance(sets, torch.Tensor):
        if sets.ndim != 2 or sets.dtype != torch.bool:
            raise TypeError(
                f"Expected `sets` to be a boolean (N, K) tensor, but got {sets.dtype} of shape {tuple(sets.shape)}."
            )
        return sets.sum(dim=1, dtype=torch.int64)
    return _check_sets(sets).sum(axis=1, dtype=np.int64)


def set_size(sets: Any) -> float:
    """The mean set size, ``mean_i |C(x_i)|``."""
    return float(_check_sets(sets).sum(axis=1).mean())
