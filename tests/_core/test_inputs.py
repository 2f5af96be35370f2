"""``_core.inputs``: what decides logits or probabilities for a sigmoid head. The kept entries decide, never an ignored
one (which may hold anything finite), and ``from_logits=False`` on two softmax columns means rows summing to 1: every
entry point refuses rows that do not, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration._core.inputs import read_inputs
from hf_calibration.calibrators import PlattScaling
from hf_calibration.metrics import CalibrationAccumulator, ece


def _multilabel_probabilities(n=600, labels=3, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < 0.4).astype(np.int64)
    p = 1 / (1 + np.exp(-(2.0 * (2 * y - 1) + 2.0 * rng.normal(size=(n, labels)))))
    hide = rng.random((n, labels)) < 0.1
    return p, y, hide


def _torchmetrics_binary_ece(p, y):
    from torchmetrics.functional.classification import binary_calibration_error

    return float(binary_calibration_error(torch.from_numpy(p).double(), torch.from_numpy(y), n_bins=15, norm="l1"))


@pytest.mark.parametrize("outside", [7.0, -3.0])
def test_ignored_multilabel_entries_do_not_decide_the_kind(outside):
    """Probabilities whose ignored entries hold a value outside [0, 1] are still probabilities: the metric equals
    torchmetrics' binary ECE over the kept entries (read as logits instead, every confidence would move)."""
    p, y, hide = _multilabel_probabilities()
    p_given = np.where(hide, outside, p)
    y_given = np.where(hide, -100, y)
    assert read_inputs(p_given, y_given, task="multilabel").from_logits is False
    expected = _torchmetrics_binary_ece(p[~hide], y[~hide])
    assert ece(p_given, y_given, task="multilabel", average="micro") == pytest.approx(expected, abs=1e-6)


def _two_columns_summing_to_half(n=40, seed=2):
    rng = np.random.default_rng(seed)
    p1 = 0.5 * rng.random(n)
    return np.stack([0.5 - p1, p1], axis=1), rng.integers(0, 2, n)


def _accumulate(preds, target, task):
    CalibrationAccumulator(task=task, from_logits=False).update(preds, target)


@pytest.mark.parametrize(
    "call",
    [
        lambda q, y: read_inputs(q, y, task="binary", from_logits=False),
        lambda q, y: ece(q, y, task="binary", from_logits=False),
        lambda q, y: ece(q, y, from_logits=False),
        lambda q, y: _accumulate(q, y, "binary"),
        lambda q, y: _accumulate(q, y, None),
        lambda q, y: PlattScaling().fit(q, y, from_logits=False, progress_bar=False),
    ],
    ids=["read_inputs", "ece-binary", "ece-multiclass", "accumulator-binary", "accumulator", "platt"],
)
def test_two_columns_not_summing_to_one_are_refused_with_from_logits_false(call):
    """Two columns in [0, 1] summing to 0.5 are neither softmax probabilities nor (with from_logits=False) logits."""
    q, y = _two_columns_summing_to_half()
    with pytest.raises(ValueError, match=r"sum to 1 within 0\.01 \(from_logits=False\).*sums to 0\.5"):
        call(q, y)
