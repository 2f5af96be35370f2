"""Coverage and set size of prediction sets, by hand, with the same checks for numpy and torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration.conformal import coverage, set_size
from hf_calibration.conformal.metrics import set_sizes

SETS = np.array([[True, False, True], [False, False, False], [True, True, True], [False, True, False]])
LABELS = np.array([2, 0, 1, 0])


def test_by_hand():
    assert coverage(SETS, LABELS) == 0.5  # rows 0 and 2 hold their label
    assert set_size(SETS) == 1.5  # (2 + 0 + 3 + 1) / 4
    assert set_sizes(SETS).tolist() == [2, 0, 3, 1]


def test_torch_and_numpy_agree():
    assert coverage(torch.from_numpy(SETS), torch.from_numpy(LABELS)) == 0.5
    assert set_size(torch.from_numpy(SETS)) == 1.5
    assert set_sizes(torch.from_numpy(SETS)).tolist() == [2, 0, 3, 1]


def test_ignored_labels():
    assert coverage(SETS, np.array([2, -100, 1, -100])) == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"`labels`.*\[0, 3\)"):
        coverage(SETS, np.array([2, 0, 3, 0]))
    with pytest.raises(ValueError, match="`labels` to have shape"):
        coverage(SETS, LABELS[:3])
    with pytest.raises(TypeError, match="`sets`"):
        coverage(SETS * 0.5, LABELS)
    with pytest.raises(ValueError, match="`sets`"):
        set_size(SETS[0])
    with pytest.raises(TypeError, match="`labels`"):
        coverage(SETS, LABELS.astype(float))
