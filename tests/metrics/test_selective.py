"""Risk–coverage, AURC and E-AURC against a direct loop over coverages (Geifman et al.'s definition),
hand-worked examples with ties, and torch-uncertainty's AURC (a trapezoid rule) within its O(1/N) gap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import softmax

from hf_calibration.metrics import aurc, eaurc, risk_coverage_curve, risk_coverage_plot


def geifman_aurc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """mean over k = 1..n of the error rate of the k most confident samples (no ties in `confidence`)."""
    order = np.argsort(-confidence)
    errors = 1 - correct[order]
    return float(np.mean([errors[:k].mean() for k in range(1, len(errors) + 1)]))


def make(seed: int, n: int = 300, k: int = 5):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (n, k))
    labels = np.where(rng.random(n) < 0.7, logits.argmax(1), rng.integers(0, k, n))
    return logits, labels


@pytest.mark.parametrize("seed", range(10))
def test_aurc_equals_the_mean_risk_over_coverages(seed):
    logits, labels = make(seed)
    p = softmax(logits, axis=1)
    conf, correct = p.max(1), (p.argmax(1) == labels).astype(float)
    expected = geifman_aurc(conf, correct)
    assert abs(aurc(logits, labels) - expected) < 1e-12
    errors = 1 - correct
    # exact optimum: all correct first
    ideal = geifman_aurc(np.r_[np.arange(len(conf), 0, -1.0)], np.sort(correct)[::-1])
    assert abs(eaurc(logits, labels) - (expected - ideal)) < 1e-12
    r = errors.mean()
    assert abs(eaurc(logits, labels, closed_form=True) - (expected - (r + (1 - r) * np.log(1 - r)))) < 1e-12


def test_hand_worked_with_ties():
    # confidences 0.9, 0.8, 0.8, 0.6 with errors 0, 1, 0, 1: the tie {0.8, 0.8} enters as one block
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.6, 0.4]])
    labels = np.array([0, 1, 1, 1])
    curve = risk_coverage_curve(probs, labels)
    np.testing.assert_allclose(curve.coverage, [0.25, 0.75, 1.0])
    np.testing.assert_allclose(curve.risk, [0.0, 1 / 3, 0.5])
    np.testing.assert_allclose(curve.threshold, [0.9, 0.8, 0.6])
    assert aurc(probs, labels) == pytest.approx(0.25 * 0 + 0.5 * (1 / 3) + 0.25 * 0.5, abs=1e-15)
    # ideal ranking of 2 errors in 4: risks 0, 0, 1/3, 1/2
    assert eaurc(probs, labels) == pytest.approx(aurc(probs, labels) - (1 / 3 + 1 / 2) / 4, abs=1e-15)
    # the order of tied rows does not matter
    assert aurc(probs[[0, 2, 1, 3]], labels[[0, 2, 1, 3]]) == aurc(probs, labels)


def test_perfect_and_worst_rankings():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    assert eaurc(probs, np.array([0, 0, 1, 1])) == pytest.approx(0.0, abs=1e-15)  # errors last: optimal
    assert aurc(probs, np.array([0, 0, 0, 0])) == 0.0
    assert aurc(probs, np.array([1, 1, 1, 1])) == 1.0 and eaurc(probs, np.array([1, 1, 1, 1])) == 0.0
    assert eaurc(probs, np.array([1, 1, 1, 1]), closed_form=True) == 0.0


def test_probabilities_torch_and_ignore_index():
    logits, labels = make(3, n=100)
    p = softmax(logits, axis=1)
    assert aurc(p, labels) == pytest.approx(aurc(logits, labels), abs=1e-12)  # detected as probabilities
    assert aurc(torch.tensor(logits), torch.tensor(labels)) == aurc(logits, labels)
    masked = labels.copy()
    masked[:10] = -100
    assert aurc(logits, masked) == aurc(logits[10:], labels[10:])


def test_close_to_torch_uncertainty():
    tu = pytest.importorskip("torch_uncertainty.metrics.classification")
    logits, labels = make(4, n=2000)
    metric = tu.AURC()
    metric.update(torch.softmax(torch.tensor(logits), 1), torch.tensor(labels))
    # torch-uncertainty: trapezoid from coverage 1/N to 1, divided by (1 - 1/N); ours: steps from 0 to 1
    assert abs(float(metric.compute()) - aurc(logits, labels)) < 2 / len(labels)


def test_bad_input():
    with pytest.raises(ValueError, match="`preds`"):
        aurc(np.zeros(3), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="same number of samples"):
        aurc(np.zeros((3, 2)), np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="class indices"):
        eaurc(np.zeros((2, 2)), np.array([0, 5]))
    with pytest.raises(TypeError, match="`closed_form`"):
        eaurc(np.zeros((2, 2)), np.array([0, 1]), closed_form=1)
    with pytest.raises(ValueError, match="finite"):
        aurc(np.array([[0.0, np.nan], [1.0, 0.0]]), np.array([0, 1]))


def test_plot(tmp_path):
    logits, labels = make(5)
    fig = risk_coverage_plot(logits, labels, label="model A")
    ax = fig.axes[0]
    risk_coverage_plot(logits[:, ::-1], labels, label="model B", ax=ax)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[0].startswith("model A: AURC") and f"{100 * aurc(logits, labels):.2f} %" in texts[0]
    assert any(t.startswith("model B") for t in texts)
    fig.savefig(tmp_path / "rc.png")
    assert (tmp_path / "rc.png").stat().st_size > 0


def test_docstring_examples():
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module("hf_calibration.metrics.selective"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
