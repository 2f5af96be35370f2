"""``from_logits=None``: probabilities are detected, logits and their softmax give the same numbers.

The rule (one for detection and for ``from_logits=False``): every value in [0, 1] and rows summing
to 1 within 1e-2 are probabilities; anything else is logits. An explicit bool wins.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import softmax

from hf_calibration.metrics import (
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    ece,
    ece_split,
    mce,
    nll,
    reliability_table,
    smce,
    smece,
)

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)

SHARED_LOGITS = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits"
DENSENET_C100 = SHARED_LOGITS / "netcal_densenet-bc-100-cifar-100.npz"

METRICS = [ece, mce, adaece, classwise_ece, ece_split, smce, smece, brier, nll, calibration_report, reliability_table]


def _values(result) -> np.ndarray:
    """Every number a metric returns, flattened (a float, a NamedTuple, a report, a table)."""
    if isinstance(result, float):
        return np.array([result])
    if hasattr(result, "to_dict"):
        result = result.to_dict()
        return np.concatenate([np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel() for v in result.values()])
    return np.asarray(result, dtype=np.float64).ravel()


def _case(seed: int, n: int, k: int, scale: float):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * scale
    target = np.where(rng.random(n) < 0.7, logits.argmax(1), rng.integers(0, k, n))
    return logits, target


# seeded sweep: sizes, class counts and logit scales from near-uniform to sharp (no underflow to 0)
SWEEP = [
    (seed, n, k, scale)
    for seed, (n, k, scale) in enumerate(
        [
            (1, 2, 1.0),
            (7, 3, 0.05),
            (50, 2, 3.0),
            (200, 10, 1.0),
            (300, 5, 4.0),
            (500, 20, 2.0),
            (1000, 100, 0.5),
            (400, 7, 6.0),
            (2000, 3, 0.3),
            (64, 50, 1.5),
        ]
    )
]


@pytest.mark.parametrize("fn", METRICS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed,n,k,scale", SWEEP)
def test_logits_softmax_detected_and_softmax_declared_agree(fn, seed, n, k, scale):
    logits, target = _case(seed, n, k, scale)
    probs = softmax(logits, axis=1)  # scipy's float64 softmax, independent of ours
    from_z = _values(fn(logits, target))
    np.testing.assert_allclose(_values(fn(probs, target)), from_z, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_values(fn(probs, target, from_logits=False)), from_z, rtol=0, atol=1e-9)
    # torch inputs follow the same rule
    np.testing.assert_allclose(
        _values(fn(torch.from_numpy(probs), torch.from_numpy(target))), from_z, rtol=0, atol=1e-9
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_softmax_is_detected_and_accepted(dtype):
    # softmax computed in float16 / bfloat16 and stored as float32: rows sum to 1 only within ~1e-3
    logits, target = _case(11, 2000, 10, 2.0)
    probs = torch.softmax(torch.from_numpy(logits).to(dtype), dim=1).float()
    off = (probs.double().sum(1) - 1).abs().max().item()
    assert 1e-4 < off < 1e-2  # beyond a float32 tolerance: the case a dtype-based check rejected
    detected = ece(probs, torch.from_numpy(target))
    assert detected == ece(probs, torch.from_numpy(target), from_logits=False)  # detection and validation agree
    assert detected == pytest.approx(ece(logits, target), abs=5e-3)  # half-precision rounding of the confidences
    assert brier(probs, torch.from_numpy(target)) == pytest.approx(brier(logits, target), abs=1e-2)


def test_one_rule_for_detection_and_validation():
    logits, target = _case(12, 100, 4, 1.0)
    probs = softmax(logits, axis=1)
    near = probs * 1.008  # rows sum to 1.008, values still in [0, 1]: probabilities under the rule
    assert ece(near, target) == ece(near, target, from_logits=False)
    with pytest.warns(UserWarning, match="looks like probabilities"):
        assert ece(near, target) != ece(near, target, from_logits=True)
    far = probs * 1.02  # rows sum to 1.02: not probabilities; None takes them for logits, False refuses
    assert ece(far, target) == ece(far, target, from_logits=True)
    with pytest.raises(ValueError, match=r"each row of `preds` to sum to 1 within 0.01 \(from_logits=False\)"):
        ece(far, target, from_logits=False)
    outside = probs.copy()
    outside[:, 0] += 1.0  # a value above 1
    assert ece(outside, target) == ece(outside, target, from_logits=True)
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        ece(outside, target, from_logits=False)


def test_from_logits_true_on_probabilities_warns():
    logits, target = _case(13, 50, 3, 1.0)
    with pytest.warns(UserWarning, match="looks like probabilities"):
        ece(softmax(logits, axis=1), target, from_logits=True)


def test_rows_that_are_neither_raise():
    logits, target = _case(14, 6000, 3, 1.0)
    mixed = softmax(logits, axis=1)
    mixed[5000] = [3.0, -1.0, 0.5]  # the first rows are probabilities, a later one is logits
    with pytest.raises(ValueError, match="from_logits=True` or `False` explicitly"):
        ece(mixed, target)
    with pytest.raises(ValueError, match=r"`preds` to hold probabilities in \[0, 1\]"):
        ece(mixed, target, from_logits=False)


def test_ignored_rows_do_not_take_part_in_detection():
    logits, target = _case(15, 200, 5, 1.0)
    probs = softmax(logits, axis=1)
    padded = np.vstack([probs, np.zeros((10, 5))])  # padding rows, labelled -100
    labels = np.r_[target, np.full(10, -100)]
    assert ece(padded, labels) == pytest.approx(ece(logits, target), abs=1e-12)


@pytest.mark.skipif(not DENSENET_C100.is_file(), reason="the shared logits folder (../shared) is absent")
def test_cifar100_probabilities_give_the_torchmetrics_ece():
    """Issue 11 case 1: ece(probs, labels) on real CIFAR-100 logits gave 0.727 instead of 0.144.

    DenseNet-BC-100 of Kull et al. 2019 (netcal's example logits). torchmetrics, which detects
    probabilities itself, is the reference for both inputs.
    """
    from torchmetrics.functional.classification import multiclass_calibration_error

    with np.load(DENSENET_C100) as data:
        logits, target = data["logits_test"], data["labels_test"]
    z, y = torch.from_numpy(logits), torch.from_numpy(target)
    probs = torch.softmax(z, dim=1)  # float32 probabilities, as a user computes them
    reference = multiclass_calibration_error(probs.double(), y, 100, n_bins=15).item()
    assert reference == pytest.approx(multiclass_calibration_error(z.double(), y, 100, n_bins=15).item(), abs=1e-6)
    assert reference == pytest.approx(0.1440, abs=5e-5)
    assert ece(probs, y) == pytest.approx(reference, abs=1e-6)
    assert ece(probs.numpy(), target) == pytest.approx(ece(logits, target), abs=1e-6)
    # the old default: softmax of the probabilities (about 0.727), now a warning when asked for explicitly
    resoftmaxed = multiclass_calibration_error(torch.softmax(probs.double(), dim=1), y, 100, n_bins=15).item()
    assert resoftmaxed > 0.7
    with pytest.warns(UserWarning, match="looks like probabilities"):
        assert ece(probs, y, from_logits=True) == pytest.approx(resoftmaxed, abs=1e-6)


# ----------------------------------------------------------------------------- every row decides (issue 23, item 1)


def _softmax_case(n=5000, k=5, seed=0):
    """The issue's example: softmax of N(0, 3) logits (scipy's softmax), labels = argmax."""
    z = np.random.default_rng(seed).normal(size=(n, k)) * 3
    return softmax(z, axis=1), z.argmax(1)


DEFECTS = {
    "row x 1.02": lambda row: row * 1.02,
    "a value -1e-9": lambda row: np.r_[-1e-9, row[1:]],
    "a value 1 + 1e-7": lambda row: np.r_[1 + 1e-7, row[1:]],
}


@pytest.mark.parametrize("defect", list(DEFECTS))
@pytest.mark.parametrize("row", [0, 5, 4095, 4096, 4500, 4999])
def test_a_malformed_probability_row_raises_wherever_it_is(defect, row):
    # issue 23 item 1: a defect in the first 4,096 rows silently turned the array into "logits" (ECE 0.2568 -> 0.6685)
    probs, target = _softmax_case()
    bad = probs.copy()
    bad[row] = DEFECTS[defect](bad[row])
    message = rf"4999 of its 5000 rows are probability vectors .* row {row} is not"
    for preds in (bad, torch.from_numpy(bad)):
        with pytest.raises(ValueError, match=message):
            ece(preds, target)
    with pytest.raises(ValueError, match=message):
        calibration_report(bad, target)
    assert ece(probs, target) == pytest.approx(0.2568, abs=5e-5)  # the clean array: the number


@pytest.mark.parametrize("order", ["probabilities first", "logits first"])
def test_probability_rows_and_logit_rows_mixed_raise(order):
    probs, target = _softmax_case()
    logits = np.log(probs) + 2.0  # the same predictions as logits (softmax(log p + c) = p)
    head, tail = (probs, logits) if order == "probabilities first" else (logits, probs)
    mixed = np.vstack([head[:100], tail[100:]])
    with pytest.raises(ValueError, match="either logits or probabilities"):
        ece(mixed, target)
    np.testing.assert_allclose(ece(logits, target), ece(probs, target), atol=1e-12)  # each half alone is fine


def test_small_logits_that_look_like_probabilities_by_chance_stay_logits():
    # K = 2 logits near 0.5: some rows fall in the simplex by chance (|z0 + z1 - 1| <= 1e-2), a few percent of the
    # rows inside [0, 1]^2, below the 1 + 1/5 of them the rule allows, so the array is logits, as it was
    rng = np.random.default_rng(5)
    z = rng.uniform(0.0, 1.0, size=(4000, 2))
    target = rng.integers(0, 2, 4000)
    chance = np.abs(z.sum(1) - 1) <= 1e-2
    assert 10 <= chance.sum() <= 400  # rows that alone would read as probabilities
    assert ece(z, target) == ece(z, target, from_logits=True)
    probs = softmax(z, axis=1)
    assert ece(z, target) == pytest.approx(ece(probs, target, from_logits=False), abs=1e-12)


def test_coarse_rows_read_as_logits_beside_logit_rows():
    # exact quarters (one-hot, [0.5, 0.5]) are probability vectors and plausible hand-written or rounded logits:
    # beside logit rows they are logits
    logits, target = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5], [0.5, 0.5]]), np.array([0, 1, 1, 0])
    assert ece(logits, target) == ece(logits, target, from_logits=True)
    rounded = np.round(np.random.default_rng(8).normal(size=(200, 2)) / 0.5) * 0.5  # many [0.5, 0.5] and [1, 0] rows
    y = np.arange(200) % 2
    assert ece(rounded, y) == ece(rounded, y, from_logits=True)
    hard = np.eye(3)[[0, 2, 1, 1]]  # one-hot rows alone: probabilities (confidence 1)
    assert ece(hard, np.array([0, 2, 0, 1])) == pytest.approx(0.25, abs=1e-15)
    probs = softmax(_case(16, 300, 3, 2.0)[0], axis=1)
    mixed = np.vstack([probs, np.eye(3)[[0, 1]], [[3.0, -1.0, 0.5]]])  # probabilities, one-hot, then a logit row
    with pytest.raises(ValueError, match=r"302 of its 303 rows are probability vectors .* row 302 is not"):
        ece(mixed, np.zeros(303, dtype=np.int64))


def test_one_probability_row_among_few_small_logits_is_chance():
    # hypothesis found it: 13 rows of N(0, 1) logits, K = 2, one of them [0.903, 0.094] sums to 0.997
    z = np.array(
        [
            [0.1257, -0.1321],
            [0.6404, 0.1049],
            [-0.5357, 0.3616],
            [1.3040, 0.9471],
            [-0.7037, -1.2654],
            [-0.6233, 0.0413],
            [-2.3250, -0.2188],
            [-1.2459, -0.7323],
            [-0.5443, -0.3163],
            [0.4116, 1.0425],
            [-0.1285, 1.3665],
            [-0.6652, 0.3515],
            [0.9035, 0.0940],
        ]
    )
    target = np.array([0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1])
    assert ece(z, target) == ece(z, target, from_logits=True)
    pair = np.array([[0.9035, 0.0940], [0.6404, 0.1049]])  # but a half of probability rows is not chance
    with pytest.raises(ValueError, match="either logits or probabilities"):
        ece(pair, np.array([0, 1]))
