"""smCE against scipy's LP optimum and hand-worked cases; smECE against relplot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import relplot
import torch
from scipy import sparse
from scipy.optimize import linprog
from scipy.special import softmax

from hf_calibration.metrics import smce, smece
from hf_calibration.metrics.smooth import _smce_sum, _smce_sweep, smce_from_confidence, smece_from_confidence

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
LOGITS = SHARED / "data" / "logits"


def _lp_smce(p: np.ndarray, a: np.ndarray) -> float:
    """Primal LP of DESIGN.md solved by HiGHS: max (1/N) sum w_i r_i, |w_i| <= 1, |w_{i+1}-w_i| <= gap."""
    order = np.argsort(p, kind="stable")
    p, r = p[order], a[order] - p[order]
    n = len(p)
    if n == 1:
        return abs(r[0])
    gaps = np.diff(p)
    diff = sparse.diags([-np.ones(n - 1), np.ones(n - 1)], [0, 1], shape=(n - 1, n))
    res = linprog(
        -r,
        A_ub=sparse.vstack([diff, -diff]).tocsr(),
        b_ub=np.concatenate([gaps, gaps]),
        bounds=(-1, 1),
        method="highs",
    )
    assert res.status == 0, res.message
    return -res.fun / n


def _sample(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    p = rng.uniform(0.05, 1.0, n)
    if kind == "ties":  # few distinct confidences: many zero gaps
        p = rng.choice(np.array([0.1, 0.25, 0.5, 0.5000001, 0.9, 1.0]), n)
    a = (rng.uniform(size=n) < p**2).astype(np.float64)  # overconfident on average
    if kind == "all_correct":
        a[:] = 1.0
    elif kind == "all_wrong":
        a[:] = 0.0
    elif kind == "alternating":  # a cluster of tiny residuals, then residuals of alternating sign
        half = n // 2
        p[:half] = 1e-3 + 1e-9 * np.arange(half)
        a[:half] = 0.0
        p[half:] = 0.5 + 1e-7 * np.arange(n - half)
        a[half:] = 1.0 - np.arange(n - half) % 2
    return p, a


@pytest.mark.parametrize("kind", ["uniform", "ties", "all_correct", "all_wrong", "alternating"])
@pytest.mark.parametrize("n", [1, 2, 3, 17, 250, 2000])
def test_smce_equals_lp_optimum(kind: str, n: int) -> None:
    rng = np.random.default_rng(1000 * n + len(kind))
    p, a = _sample(kind, n, rng)
    expected = _lp_smce(p, a)
    assert smce_from_confidence(p, a) == pytest.approx(expected, abs=1e-9)
    # both sweeps on their own: stacks (no move budget) and balanced trees (budget 0)
    order = np.argsort(p)
    p, r = p[order], a[order] - p[order]
    assert _smce_sum(p, r, max_moves=10**12) / n == pytest.approx(expected, abs=1e-9)
    assert _smce_sum(p, r, max_moves=0) / n == pytest.approx(expected, abs=1e-9)


def test_smce_adversarial_input_takes_the_tree_sweep() -> None:
    # A cluster of tiny residuals followed by residuals of alternating sign makes the stack sweep
    # move the same block of points back and forth (quadratic in n); past its move budget the
    # balanced-tree sweep takes over. Both must give the same optimum.
    n = 20_000
    half = n // 2
    p = np.concatenate([1e-5 + 1e-13 * np.arange(half), 0.5 + 1e-12 * np.arange(half)])
    a = np.concatenate([np.zeros(half), 1.0 - np.arange(half) % 2])
    _, moves = _smce_sweep(p, a - p, 10**12)
    assert moves > 32 * n + 100_000  # so the default path really falls back
    stack = _smce_sum(p, a - p, max_moves=10**12) / n
    assert smce_from_confidence(p, a) == pytest.approx(stack, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_smce_from_logits_equals_lp_on_top_label(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = 400, 5
    logits = rng.normal(scale=3.0, size=(n, k))
    labels = rng.integers(0, k, n)
    probs = softmax(logits, axis=1)  # independent softmax / argmax path
    p, a = probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)
    expected = _lp_smce(p, a)
    assert smce(logits, labels) == pytest.approx(expected, abs=1e-9)
    assert smce(torch.from_numpy(logits).float(), torch.from_numpy(labels)) == pytest.approx(expected, abs=1e-6)
    assert smce(probs, labels, from_logits=False) == pytest.approx(expected, abs=1e-9)


def test_smce_all_correct_is_mean_underconfidence() -> None:
    # every prediction correct: r_i = 1 - p_i >= 0, so w = 1 is optimal and smCE = mean(1 - p)
    p = np.array([0.35, 0.5, 0.8, 0.8, 0.99])
    assert smce_from_confidence(p, np.ones(5)) == pytest.approx(np.mean(1 - p), abs=1e-15)
    assert smce_from_confidence(p, np.zeros(5)) == pytest.approx(np.mean(p), abs=1e-15)  # and all wrong: mean(p)


def test_smce_two_point_hand_worked() -> None:
    # p = (0.2, 0.6), a = (1, 0): r = (0.8, -0.6).  Maximise 0.8 w1 - 0.6 w2 with |w1|, |w2| <= 1 and
    # |w1 - w2| <= 0.4.  For fixed w1 the best w2 is w1 - 0.4 (as small as allowed), giving
    # 0.8 w1 - 0.6 (w1 - 0.4) = 0.2 w1 + 0.24, largest at w1 = 1: value 0.44, w = (1, 0.6).
    # (The other sign, w = (-0.6, -1), only reaches 0.12.)  smCE = 0.44 / 2 = 0.22.
    assert smce_from_confidence([0.2, 0.6], [1, 0]) == pytest.approx(0.22, abs=1e-15)
    # Through logits: rows with top-label confidences 0.8 (class 1, label 1: correct) and 0.6
    # (class 0, label 1: wrong).  Sorted p = (0.6, 0.8), a = (0, 1): r = (-0.6, 0.2), gap 0.2.
    # Best w2 for fixed w1 is w1 + 0.2: -0.6 w1 + 0.2 (w1 + 0.2) = -0.4 w1 + 0.04, largest at
    # w1 = -1: 0.44 with w = (-1, -0.8).  smCE = 0.22 again.
    logits = np.log([[0.2, 0.8], [0.6, 0.4]])
    assert smce(logits, np.array([1, 1])) == pytest.approx(0.22, abs=1e-12)


def test_smce_single_point_and_order_invariance() -> None:
    assert smce_from_confidence([0.7], [0]) == pytest.approx(0.7)
    rng = np.random.default_rng(3)
    p, a = _sample("uniform", 1000, rng)
    perm = rng.permutation(1000)
    assert smce_from_confidence(p[perm], a[perm]) == pytest.approx(smce_from_confidence(p, a), abs=1e-12)


def test_smce_ignore_index() -> None:
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    labels = np.array([0, -100, 1])
    assert smce(logits, labels) == pytest.approx(smce(logits[[0, 2]], labels[[0, 2]]), abs=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [50, 3000, 40000])
def test_smece_equals_relplot(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed + n)
    p = rng.beta(5, 1 + seed, n)  # mass near 1, like a trained classifier
    a = (rng.uniform(size=n) < p ** (1 + 0.3 * seed)).astype(np.float64)
    value, sigma = smece_from_confidence(p, a, return_sigma=True)
    ref, ref_sigma = relplot.smECE(p, a, return_width=True)
    assert sigma == ref_sigma
    assert value == pytest.approx(ref, abs=1e-6)


@pytest.mark.parametrize(
    "p, a",
    [
        ([0.7], [0.0]),  # a single point
        ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),  # confidence exactly 1, perfectly calibrated
        ([0.0, 0.5, 1.0], [0.0, 1.0, 1.0]),  # both ends of [0, 1]
        ([0.5] * 10, [1.0] * 5 + [0.0] * 5),  # all tied
    ],
)
def test_smece_edge_cases_equal_relplot(p, a) -> None:
    p, a = np.array(p), np.array(a)
    assert smece_from_confidence(p, a) == pytest.approx(relplot.smECE(p, a), abs=1e-9)


@pytest.mark.parametrize("sigma", [1.0, 0.2, 0.05, 0.004])
def test_smece_at_fixed_bandwidth_equals_relplot(sigma: float) -> None:
    from hf_calibration.metrics.smooth import _SmoothECE

    rng = np.random.default_rng(7)
    p = rng.uniform(size=5000)
    a = (rng.uniform(size=5000) < p).astype(np.float64)
    assert _SmoothECE(p, a)(np.array([sigma]), np.array([0]))[0] == pytest.approx(
        relplot.smECE_sigma(p, a, sigma), abs=1e-9
    )


def test_smece_from_logits_equals_relplot() -> None:
    rng = np.random.default_rng(11)
    logits = rng.normal(scale=2.5, size=(3000, 10))
    labels = rng.integers(0, 10, 3000)
    f, y = relplot.multiclass_logits_to_confidences(logits, labels)
    assert smece(logits, labels) == pytest.approx(relplot.smECE(f, y), abs=1e-6)


@pytest.mark.skipif(not LOGITS.is_dir(), reason="shared real logits not available")
@pytest.mark.parametrize("name", ["cifar10_resnet50_cross_entropy_calibench", "netcal_lenet-5-cifar-100"])
def test_real_logits(name: str) -> None:
    data = np.load(LOGITS / f"{name}.npz")
    logits, labels = data["logits_test"], data["labels_test"]
    f, y = relplot.multiclass_logits_to_confidences(logits.astype(np.float64), labels)
    assert smece(logits, labels) == pytest.approx(relplot.smECE(f, y), abs=1e-6)
    sub = slice(0, 2000)  # the LP reference stays quick at this size
    assert smce(logits[sub], labels[sub]) == pytest.approx(_lp_smce(f[sub], y[sub]), abs=1e-9)


@pytest.mark.parametrize("fn", [smce, smece])
def test_bad_input_through_logits(fn) -> None:
    good = np.array([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="finite"):
        fn(np.array([[np.nan, 0.0], [0.0, 1.0]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="preds"):
        fn(np.array([1.0, 0.0]), np.array([0, 1]))  # wrong rank
    with pytest.raises(ValueError, match="target"):
        fn(good, np.array([0, 1, 1]))  # N mismatch
    with pytest.raises(ValueError, match="target"):
        fn(good, np.array([0, 2]))  # label out of range
    with pytest.raises(ValueError, match="sum to 1"):
        fn(np.array([[0.5, 0.6], [0.2, 0.8]]), np.array([0, 1]), from_logits=False)
    with pytest.raises(TypeError, match="from_logits"):
        fn(good, np.array([0, 1]), from_logits="yes")


@pytest.mark.parametrize("fn", [smce_from_confidence, smece_from_confidence])
def test_bad_input_from_confidence(fn) -> None:
    with pytest.raises(ValueError, match="same length"):
        fn([0.5, 0.6], [1])
    with pytest.raises(ValueError, match="`confidence` to be 1-D"):
        fn([[0.5, 0.6]], [[1, 0]])
    with pytest.raises(ValueError, match="`confidence` to be non-empty"):
        fn([], [])
    with pytest.raises(ValueError, match=r"`confidence` to lie in \[0, 1\]"):
        fn([1.5, 0.5], [1, 0])
    with pytest.raises(ValueError, match=r"`correct` to lie in \[0, 1\]"):
        fn([0.5, 0.5], [2, 0])
    with pytest.raises(ValueError, match="`correct` to be finite"):
        fn([0.5, 0.5], [np.nan, 0])
    with pytest.raises(TypeError, match="`confidence` to be a torch.Tensor"):
        fn("0.5", [1])


# ----------------------------------------------------------------------------- ties (issue 11, case 2)


def _tied_cases():
    """(probs, target) pairs where every confidence is tied, in label-sorted order (the trap's worst case)."""
    yield "0.6/0.4, calibrated", np.tile([0.6, 0.4], (1000, 1)), np.repeat([0, 1], [600, 400])
    yield "uniform K=4, 40% right", np.full((1000, 4), 0.25), np.repeat([0, 3], [400, 600])
    yield (
        "two tie groups",
        np.repeat([[0.7, 0.3], [0.55, 0.45]], [500, 500], axis=0),
        np.r_[np.repeat([0, 1], [400, 100]), np.repeat([1, 0], [300, 200])],
    )


@pytest.mark.parametrize("case", list(_tied_cases()), ids=lambda c: c[0])
def test_smooth_metrics_on_ties_ignore_order_and_correctness_order(case):
    _, probs, target = case
    conf, correct = probs.max(1), (probs.argmax(1) == target).astype(float)
    shuffled = np.random.default_rng(0).permutation(len(target))
    # smCE: the LP (HiGHS) on the same points is the reference; the value is order-free
    assert smce(probs, target) == pytest.approx(_lp_smce(conf, correct), abs=1e-9)
    assert smce(probs[shuffled], target[shuffled]) == pytest.approx(smce(probs, target), abs=1e-12)
    # smECE: relplot on the same points, and order-free
    assert smece(probs, target) == pytest.approx(relplot.smECE(conf, correct), abs=1e-6)
    assert smece(probs[shuffled], target[shuffled]) == pytest.approx(smece(probs, target), abs=1e-12)


def test_smce_of_one_tie_group_is_its_calibration_gap():
    # one distinct confidence p: w is constant, so smCE = |mean(a) - p| (= ECE)
    probs, target = np.full((1000, 4), 0.25), np.repeat([0, 3], [400, 600])
    assert smce(probs, target) == pytest.approx(0.15, abs=1e-12)
    assert smce(np.tile([0.6, 0.4], (1000, 1)), np.repeat([0, 1], [600, 400])) == pytest.approx(0.0, abs=1e-12)
