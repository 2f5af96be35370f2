"""AdaECE: equal-count bins, every sample in one bin; the difference from the reference code's convention."""

import _metric_reference as ref
import numpy as np
import pytest

from hf_calibration.metrics import adaece, ece
from hf_calibration.metrics.binning import _adaptive_bin_index


def _probs(confidences, k=4):
    c = np.asarray(confidences, dtype=np.float64)[:, None]
    return np.hstack([c, np.repeat((1 - c) / (k - 1), k - 1, axis=1)])


def test_hand_worked_six_samples_and_the_reference_convention():
    # sorted confidences .35 .40 .45 .60 .70 .80, correct 1 0 0 1 1 1, 2 bins.
    # Ours (3 + 3 samples):
    #   {.35 .40 .45}: conf .40, acc 1/3 -> 3/6 * 1/15 = 1/30
    #   {.60 .70 .80}: conf .70, acc 1   -> 3/6 * .30  = .15           AdaECE = 1/30 + .15
    # Reference (focal_calibration AdaptiveECELoss): edges = interp([0, 3, 6], [0..5], sorted)
    #   = (.35, .60, .80); bins lo < p <= hi:
    #   (.35, .60] = {.40 .45 .60}: conf 29/60, acc 1/3 -> 3/6 * 9/60 = .075
    #   (.60, .80] = {.70 .80}:     conf .75,   acc 1   -> 2/6 * .25  = 1/12
    #   .35, the minimum, is in no bin                                   => .075 + 1/12
    conf = np.array([0.60, 0.35, 0.80, 0.45, 0.70, 0.40])
    correct = np.array([1, 1, 1, 0, 1, 0])
    target = np.where(correct == 1, 0, 1)  # top label is class 0
    ours = adaece(_probs(conf), target, 2, from_logits=False)
    assert ours == pytest.approx(1 / 30 + 0.15, abs=1e-12)
    reference, binned = ref.focal_calibration_adaece(conf, correct.astype(float), 2)
    assert reference == pytest.approx(0.075 + 1 / 12, abs=1e-12)
    assert binned == 5  # the reference drops the minimum-confidence sample
    assert _adaptive_bin_index(conf, 2).tolist() == [1, 0, 1, 0, 1, 0]  # every sample in a bin


@pytest.mark.parametrize("n,n_bins", [(1000, 15), (1001, 15), (37, 15), (10, 15), (500, 1), (999, 7)])
def test_equals_array_split_loop(n, n_bins):
    rng = np.random.default_rng(n + n_bins)
    logits = rng.normal(size=(n, 10)) * 2
    target = np.where(rng.random(n) < 0.6, logits.argmax(1), rng.integers(0, 10, n))
    conf, correct = ref.top_label(ref.softmax(logits), target)
    assert adaece(logits, target, n_bins) == pytest.approx(ref.split_adaece(conf, correct, n_bins), abs=1e-12)


@pytest.mark.parametrize("n,n_bins", [(1000, 15), (1007, 15), (5, 15)])
def test_bins_have_equal_counts_and_cover_everything(n, n_bins):
    conf = np.random.default_rng(n).random(n)
    counts = np.bincount(_adaptive_bin_index(conf, n_bins), minlength=n_bins)
    assert counts.sum() == n
    assert counts.max() - counts.min() <= 1
    assert (np.diff(counts) <= 0).all()  # the larger bins first, as np.array_split


def test_reference_differs_by_about_one_sample():
    # on a large sample the two conventions agree to O(1/N): the convention matters only for small N
    rng = np.random.default_rng(0)
    n = 20000
    conf = rng.uniform(0.3, 1.0, n)
    correct = (rng.random(n) < conf**1.3).astype(float)
    target = np.where(correct == 1, 0, 1)
    ours = adaece(_probs(conf), target, from_logits=False)
    reference, binned = ref.focal_calibration_adaece(conf, correct, 15)
    assert binned == n - 1
    assert abs(ours - reference) < 15 / n
    assert ours == pytest.approx(ref.split_adaece(conf, correct, 15), abs=1e-12)


def test_ties_do_not_make_it_order_dependent():
    # 8 samples at the same confidence, half right: one tie group, so one bin whatever the order
    conf = np.full(8, 0.6)
    target = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    probs = _probs(conf)
    values = {
        round(adaece(probs[p], target[p], 3), 15) for p in (np.random.default_rng(s).permutation(8) for s in range(10))
    }
    assert len(values) == 1
    # {8 x 0.6}, accuracy 1/2: |0.6 - 0.5| = 0.1 (ordering ties by correctness gave 0.35 here)
    assert values.pop() == pytest.approx(0.1, abs=1e-12)
    assert _adaptive_bin_index(conf, 3).tolist() == [0] * 8


def test_tie_group_straddling_a_cut_stays_in_one_bin():
    # sorted confidences .5 .6 .6 .6 .8 .9, correct 0 1 0 1 1 1, 2 bins.
    # The runs of 3 end at .6, so bin 1 = {p <= .6} = {.5 .6 .6 .6} (4 samples), bin 2 = {.8 .9}:
    #   bin 1: conf (.5 + 1.8) / 4 = .575, acc 2/4 -> 4/6 * .075 = .05
    #   bin 2: conf .85, acc 1               -> 2/6 * .15  = .05      AdaECE = .10
    # (splitting the .6 group by correctness, as a (confidence, correct) sort does, gives .2333)
    conf = np.array([0.6, 0.9, 0.5, 0.6, 0.8, 0.6])
    correct = np.array([0, 1, 0, 1, 1, 1])
    target = np.where(correct == 1, 0, 1)
    assert adaece(_probs(conf), target, 2) == pytest.approx(0.10, abs=1e-12)
    assert ref.split_adaece(conf, correct.astype(float), 2) == pytest.approx(0.10, abs=1e-12)
    assert np.bincount(_adaptive_bin_index(conf, 2)).tolist() == [4, 2]


@pytest.mark.parametrize("order", ["right first", "wrong first", "shuffled"])
def test_perfectly_calibrated_tied_sample_has_zero_adaece(order):
    # issue 11, case 2: p = [[0.6, 0.4]] * 1000, 600 labels 0 and 400 labels 1: calibrated (ECE 0);
    # a correctness-ordered split of the tie gave 0.478
    probs = np.tile([0.6, 0.4], (1000, 1))
    target = np.repeat([0, 1], [600, 400])
    if order == "wrong first":
        target = target[::-1].copy()
    elif order == "shuffled":
        target = np.random.default_rng(0).permutation(target)
    assert ece(probs, target) == pytest.approx(0.0, abs=1e-12)
    assert adaece(probs, target) == pytest.approx(0.0, abs=1e-12)
    assert adaece(np.log(probs), target) == pytest.approx(0.0, abs=1e-12)  # from logits: the same tie


@pytest.mark.parametrize("k,right", [(4, 250), (4, 400), (10, 37)])
def test_uniform_probabilities_adaece_equals_ece(k, right):
    # every row uniform: one confidence 1/k, argmax class 0, accuracy right / N -> both are |1/k - accuracy|
    n = 1000
    target = np.random.default_rng(k).permutation(np.r_[np.zeros(right, int), np.full(n - right, k - 1)])
    probs = np.full((n, k), 1 / k)
    expected = abs(1 / k - right / n)
    assert ece(probs, target) == pytest.approx(expected, abs=1e-12)
    assert adaece(probs, target) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n_bins", [2, 7, 15])
def test_rounded_confidences_match_the_literal_definition(n_bins):
    # many ties (confidences on a 0.05 grid): the loop reference of lo < p <= hi equal-mass bins
    rng = np.random.default_rng(n_bins)
    conf = np.round(rng.uniform(0.3, 1.0, 500) / 0.05) * 0.05
    correct = (rng.random(500) < conf).astype(float)
    target = np.where(correct == 1, 0, 1)
    assert adaece(_probs(conf), target, n_bins) == pytest.approx(ref.split_adaece(conf, correct, n_bins), abs=1e-12)
