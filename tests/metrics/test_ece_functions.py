"""ECE, MCE, O-/U-ECE and classwise ECE against torchmetrics, netcal, loop references and hand-worked cases."""

import _metric_reference as ref
import numpy as np
import pytest
import torch
from netcal.metrics import ECE as NetcalECE
from netcal.metrics import MCE as NetcalMCE
from torchmetrics.classification import MulticlassCalibrationError
from torchmetrics.functional.classification.calibration_error import _ce_compute

from hf_calibration.metrics import ECESplit, classwise_ece, ece, ece_split, mce


def _random_case(seed: int, n: int, k: int, scale: float = 1.5):
    """float64 logits and labels; labels agree with the argmax ~70% of the time."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * scale
    target = np.where(rng.random(n) < 0.7, logits.argmax(axis=1), rng.integers(0, k, n))
    probs = ref.softmax(logits)
    assert (
        probs.max() < 1.0 - 1e-6
    )  # even in float32 (torchmetrics casts) away from torchmetrics' p = 1.0 bug (tested separately below)
    return logits, target, probs


def _torchmetrics(probs, target, n_bins, norm):
    """torchmetrics' public metric (it casts confidences to float32 internally)."""
    metric = MulticlassCalibrationError(num_classes=probs.shape[1], n_bins=n_bins, norm=norm)
    metric.update(torch.from_numpy(probs), torch.from_numpy(target))
    return metric.compute().item()


def _torchmetrics_float64(probs, target, n_bins, norm):
    """torchmetrics' binning and reduction (``_ce_compute``) fed float64 top-label arrays."""
    conf, correct = ref.top_label(probs, target)
    return _ce_compute(torch.from_numpy(conf), torch.from_numpy(correct), n_bins, norm=norm).item()


CASES = [(0, 2), (1, 3), (2, 10), (3, 100)]


@pytest.mark.parametrize("n_bins", [1, 7, 15, 30])
@pytest.mark.parametrize("seed,k", CASES)
def test_ece_mce_equal_torchmetrics(seed, k, n_bins):
    logits, target, probs = _random_case(seed, 1000, k)
    assert ece(logits, target, n_bins) == pytest.approx(_torchmetrics(probs, target, n_bins, "l1"), abs=1e-6)
    assert mce(logits, target, n_bins) == pytest.approx(_torchmetrics(probs, target, n_bins, "max"), abs=1e-6)
    # probabilities in, same answer
    assert ece(probs, target, n_bins, from_logits=False) == pytest.approx(
        _torchmetrics(probs, target, n_bins, "l1"), abs=1e-6
    )


@pytest.mark.parametrize("n_bins", [1, 15])
@pytest.mark.parametrize("seed,k", CASES)
def test_ece_mce_equal_torchmetrics_binning_in_float64(seed, k, n_bins):
    logits, target, probs = _random_case(seed + 40, 5000, k)
    assert ece(logits, target, n_bins) == pytest.approx(_torchmetrics_float64(probs, target, n_bins, "l1"), abs=1e-12)
    assert mce(logits, target, n_bins) == pytest.approx(_torchmetrics_float64(probs, target, n_bins, "max"), abs=1e-12)


@pytest.mark.parametrize("n_bins", [10, 15])
@pytest.mark.parametrize("seed,k", CASES[1:])  # netcal reads a 2-column input as binary (class-1) calibration
def test_ece_mce_equal_netcal(seed, k, n_bins):
    _, target, probs = _random_case(seed + 10, 2000, k)
    assert ece(probs, target, n_bins, from_logits=False) == pytest.approx(
        NetcalECE(bins=n_bins).measure(probs, target), abs=1e-9
    )
    assert mce(probs, target, n_bins, from_logits=False) == pytest.approx(
        NetcalMCE(bins=n_bins).measure(probs, target), abs=1e-9
    )


@pytest.mark.parametrize("seed,k", CASES)
def test_ece_mce_equal_loop_reference(seed, k):
    logits, target, probs = _random_case(seed + 20, 1500, k)
    conf, correct = ref.top_label(probs, target)
    assert ece(logits, target) == pytest.approx(ref.loop_ece(conf, correct, 15), abs=1e-12)
    assert mce(logits, target) == pytest.approx(ref.loop_mce(conf, correct, 15), abs=1e-12)


def _rows(confidences, k=4):
    """Probability rows whose top label is class 0 with the given confidence."""
    c = np.asarray(confidences, dtype=np.float64)[:, None]
    return np.hstack([c, np.repeat((1 - c) / (k - 1), k - 1, axis=1)])


def test_hand_worked_ece_mce_split():
    # 5 bins (edges .2 .4 .6 .8 1); confidences .30 .35 .55 .90 .95, correct 0 1 1 1 0.
    # bin (.2,.4]: conf (.30+.35)/2 = .325, acc 1/2 -> 2/5 * .175 = .07  (under-confident)
    # bin (.4,.6]: conf .55, acc 1            -> 1/5 * .45  = .09  (under-confident)
    # bin (.8, 1]: conf .925, acc 1/2         -> 2/5 * .425 = .17  (over-confident)
    # ECE = .07 + .09 + .17 = .33;  MCE = max(.175, .45, .425) = .45;  O = .17, U = .16
    probs = _rows([0.30, 0.35, 0.55, 0.90, 0.95])
    target = np.array([1, 0, 0, 0, 2])
    assert ece(probs, target, 5, from_logits=False) == pytest.approx(0.33, abs=1e-12)
    assert mce(probs, target, 5, from_logits=False) == pytest.approx(0.45, abs=1e-12)
    split = ece_split(probs, target, 5, from_logits=False)
    assert isinstance(split, ECESplit)
    assert split.over == pytest.approx(0.17, abs=1e-12)
    assert split.under == pytest.approx(0.16, abs=1e-12)


def test_confidence_one_goes_to_last_bin_unlike_torchmetrics():
    # conf 1.0 (wrong) and 0.95 (right), 15 bins. Guo: both in (14/15, 1]:
    #   conf (1 + .95)/2 = .975, acc 1/2 -> ECE = |.5 - .975| = .475, MCE = .475.
    # torchmetrics (issue #3510) puts 1.0 in a phantom 16th bin:
    #   1/2 * |0 - 1| + 1/2 * |1 - .95| = .5 + .025 = .525, MCE = 1.
    probs = np.array([[1.0, 0.0], [0.95, 0.05]])
    target = np.array([1, 0])
    assert ece(probs, target, from_logits=False) == pytest.approx(0.475, abs=1e-12)
    assert mce(probs, target, from_logits=False) == pytest.approx(0.475, abs=1e-12)
    assert _torchmetrics(probs, target, 15, "l1") == pytest.approx(0.525, abs=1e-6)
    assert _torchmetrics(probs, target, 15, "max") == pytest.approx(1.0, abs=1e-6)


def test_confidence_on_an_edge_goes_to_the_lower_bin():
    # 2 bins (0, .5], (.5, 1]; conf .5 (right) lands in the first bin, .75 (wrong) in the second:
    # ECE = 1/2 * |1 - .5| + 1/2 * |0 - .75| = .625. (torchmetrics' lo <= p < hi would pool them:
    # conf .625, acc .5 -> .125.)
    probs = np.array([[0.5, 0.5], [0.75, 0.25]])
    target = np.array([0, 1])
    assert ece(probs, target, 2, from_logits=False) == pytest.approx(0.625, abs=1e-12)
    assert _torchmetrics(probs, target, 2, "l1") == pytest.approx(0.125, abs=1e-6)


def test_classwise_hand_worked_with_zero_probabilities():
    # rows (1, 0), (0, 1), (.3, .7), labels 0, 0, 1; 15 bins.
    # class 0: p = (1, 0, .3) vs y = (1, 1, 0)
    #   p=1 last bin: acc 1, conf 1 -> 0;  p=0 FIRST bin: acc 1, conf 0 -> 1/3;
    #   p=.3 bin (4/15, 5/15]: acc 0, conf .3 -> .3/3 = .1            => 1/3 + .1
    # class 1: p = (0, 1, .7) vs y = (0, 0, 1)
    #   p=0 first bin: 0;  p=1 last bin: acc 0 -> 1/3;  p=.7 bin (10/15, 11/15]: acc 1 -> .3/3 = .1
    # classwise ECE = mean = 1/3 + .1
    probs = np.array([[1.0, 0.0], [0.0, 1.0], [0.3, 0.7]])
    expected = 1 / 3 + 0.1
    assert classwise_ece(probs, np.array([0, 0, 1]), from_logits=False) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n_bins", [5, 15])
@pytest.mark.parametrize("seed,k", CASES)
def test_classwise_equals_per_class_loop(seed, k, n_bins):
    logits, target, probs = _random_case(seed + 30, 800, k)
    expected = ref.loop_classwise_ece(probs, target, n_bins)
    assert classwise_ece(logits, target, n_bins) == pytest.approx(expected, abs=1e-12)
    assert classwise_ece(probs, target, n_bins, from_logits=False) == pytest.approx(expected, abs=1e-12)


def test_split_adds_up_to_ece():
    logits, target, _ = _random_case(7, 2000, 10, scale=1.5)
    split = ece_split(logits, target)
    assert split.over + split.under == pytest.approx(ece(logits, target), abs=1e-15)
    assert split.over > 0 and split.under > 0


def test_ignore_index_rows_are_dropped():
    logits, target, _ = _random_case(8, 500, 5)
    rng = np.random.default_rng(0)
    junk = rng.normal(size=(50, 5)) * 10
    padded = np.vstack([logits, junk])
    padded_target = np.concatenate([target, np.full(50, -100)])
    perm = rng.permutation(550)
    for fn in (ece, mce, classwise_ece):
        assert fn(padded[perm], padded_target[perm]) == pytest.approx(fn(logits, target), abs=1e-12)
    # a custom ignore_index works the same way
    padded_target[500:] = 7
    assert ece(padded, padded_target.clip(max=7), ignore_index=7) == pytest.approx(ece(logits, target), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fn", [ece, mce, classwise_ece, lambda z, y: sum(ece_split(z, y))])
def test_low_precision_torch_inputs_match_float64(dtype, fn):
    logits, target, _ = _random_case(9, 2000, 10, scale=2.0)
    y = torch.from_numpy(target)
    low = torch.from_numpy(logits).to(dtype)
    # the low-precision numbers, upcast to float64 first, give the same value: no precision is lost
    # in our computation (float32 exp with float64 sums)
    assert fn(low, y) == pytest.approx(fn(low.double(), y), abs=1e-6)
    if dtype != torch.bfloat16:  # bf16's 8-bit mantissa moves the logits themselves by ~1%
        assert fn(low, y) == pytest.approx(fn(torch.from_numpy(logits), y), abs=1e-3)


def test_classwise_ties_are_not_split_by_correctness():
    # issue 11, case 2: [[0.6, 0.4]] * 1000 with 600 labels 0 is calibrated for both classes
    probs = np.tile([0.6, 0.4], (1000, 1))
    target = np.repeat([0, 1], [600, 400])
    assert classwise_ece(probs, target) == pytest.approx(0.0, abs=1e-12)
    # uniform rows, 400 labels 0 / 600 labels 3: classes 0 and 3 are off by .15 and .35, classes 1, 2 by .25
    uniform, labels = np.full((1000, 4), 0.25), np.repeat([0, 3], [400, 600])
    assert classwise_ece(uniform, labels) == pytest.approx((0.15 + 0.25 + 0.25 + 0.35) / 4, abs=1e-12)
    assert classwise_ece(uniform, labels) == pytest.approx(ref.loop_classwise_ece(uniform, labels, 15), abs=1e-12)
    shuffled = np.random.default_rng(0).permutation(1000)
    assert classwise_ece(uniform[shuffled], labels[shuffled]) == pytest.approx(
        classwise_ece(uniform, labels), abs=1e-12
    )
