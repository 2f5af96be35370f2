"""Bad input: each case raises ValueError/TypeError whose message names the argument."""

import numpy as np
import pytest
import torch

from hf_calibration.metrics import (
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    ece,
    ece_split,
    mce,
    nll,
    reliability_diagram,
    reliability_table,
    smce,
    smece,
)

BINNED = [ece, mce, adaece, classwise_ece, ece_split, reliability_table, calibration_report]
ALL = BINNED + [brier, nll]


def _good(n=20, k=4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, k)), rng.integers(0, k, n)


@pytest.fixture(params=ALL, ids=lambda f: f.__name__)
def fn(request):
    return request.param


@pytest.fixture(params=BINNED, ids=lambda f: f.__name__)
def binned(request):
    return request.param


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_non_finite(fn, bad, dtype):
    z, y = _good()
    z = z.astype(dtype)
    z[7, 2] = bad
    with pytest.raises(ValueError, match=r"`preds` to be finite.*row 7"):
        fn(z, y)


def test_non_finite_probabilities(fn):
    z, y = _good()
    p = np.full_like(z, 0.25)
    p[3, 0] = np.nan
    with pytest.raises(ValueError, match="`preds` to be finite"):
        fn(p, y, from_logits=False)


def test_wrong_rank_preds(fn):
    z, y = _good()
    with pytest.raises(ValueError, match=r"`preds` to have shape \(N, K\)"):
        fn(z[:, 0], y)


def test_wrong_rank_target(fn):
    z, y = _good()
    with pytest.raises(ValueError, match=r"`target` to have shape \(N,\)"):
        fn(z, y[:, None])


def test_n_mismatch(fn):
    z, y = _good()
    with pytest.raises(ValueError, match="`preds` and `target` to have the same number of samples"):
        fn(z, y[:-1])


def test_empty(fn):
    with pytest.raises(ValueError, match="`preds` to be non-empty"):
        fn(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("label", [4, -1, -101])
def test_label_out_of_range(fn, label):
    z, y = _good()
    y[5] = label
    with pytest.raises(ValueError, match=rf"`target` to hold class indices in \[0, 4\).*found {label}"):
        fn(z, y)


def test_all_labels_ignored(fn):
    z, _ = _good()
    with pytest.raises(ValueError, match="`target`"):
        fn(z, np.full(20, -100))


def test_single_class(fn):
    """One score column is a binary (sigmoid) head where the function scores those (round 4: hf_calibration._core.tasks);
    read as a softmax it has K = 1, which says nothing."""
    import inspect

    kwargs = {"task": "multiclass"} if "task" in inspect.signature(fn).parameters else {}
    with pytest.raises(ValueError, match="`preds` to have (K >= 2|shape \\(N, K\\) with K >= 2)"):
        fn(np.zeros((5, 1)), np.zeros(5, dtype=np.int64), **kwargs)


@pytest.mark.parametrize("n_bins", [0, -3])
def test_n_bins_below_one(binned, n_bins):
    z, y = _good()
    with pytest.raises(ValueError, match="`n_bins` to be an integer >= 1"):
        binned(z, y, n_bins)


@pytest.mark.parametrize("n_bins", [15.0, "15", True, None])
def test_n_bins_not_an_integer(binned, n_bins):
    z, y = _good()
    with pytest.raises(TypeError, match="`n_bins` to be an integer"):
        binned(z, y, n_bins)


def test_probabilities_not_summing_to_one(fn):
    z, y = _good()
    p = np.full_like(z, 0.2)  # rows sum to 0.8
    with pytest.raises(ValueError, match="each row of `preds` to sum to 1"):
        fn(p, y, from_logits=False)


def test_probabilities_out_of_range(fn):
    z, y = _good()
    p = np.full_like(z, 0.25)
    p[0] = [1.5, -0.5, 0.0, 0.0]  # sums to 1 but is no distribution
    with pytest.raises(ValueError, match=r"`preds` to hold probabilities in \[0, 1\]"):
        fn(p, y, from_logits=False)


@pytest.mark.parametrize("as_torch", [False, True])
def test_float_labels(fn, as_torch):
    """Class indices stored as floats are read as the classes they name (2.0 is class 2); a fractional or NaN label is
    refused naming it, never truncated (1.7 is not class 1)."""
    z, y = _good()
    expected = fn(z, y)
    yf = y.astype(np.float64)
    if as_torch:
        z, yf = torch.from_numpy(z), torch.from_numpy(yf)
    assert str(fn(z, yf)) == str(expected)
    for bad in (1.7, float("nan")):
        yb = yf.clone() if as_torch else yf.copy()
        yb[3] = bad
        with pytest.raises(ValueError, match=rf"`target` to hold class indices.*found {bad}"):
            fn(z, yb)


def test_integer_preds(fn):
    z, y = _good()
    with pytest.raises(TypeError, match="`preds` to be a floating"):
        fn(z.astype(np.int64), y)


def test_preds_not_an_array(fn):
    _, y = _good()
    with pytest.raises(TypeError, match="`preds`"):
        fn("logits", y)


def test_from_logits_not_bool(fn):
    z, y = _good()
    with pytest.raises(TypeError, match="`from_logits`"):
        fn(z, y, from_logits="yes")


def test_reliability_diagram_bad_input():
    z, y = _good()
    with pytest.raises(ValueError, match="`n_bins`"):
        reliability_diagram(z, y, 0)
    with pytest.raises(ValueError, match="`preds` to be finite"):
        reliability_diagram(np.where(z > 1, np.nan, z), y)


# ----------------------------------------------------------------------------- issue 11 (cases 9, 10, 11)

WITH_IGNORE_INDEX = ALL + [smce, smece, reliability_diagram]


@pytest.mark.parametrize("fn", WITH_IGNORE_INDEX, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [2.5, -100.0, "-100", True])
def test_ignore_index_not_an_integer(fn, bad):
    z, y = _good()
    with pytest.raises(TypeError, match=r"argument `ignore_index` to be an integer or None, but got"):
        fn(z, y, ignore_index=bad)


def test_ignore_index_numpy_integer_and_none():
    z, y = _good()
    y_ignored = y.copy()
    y_ignored[:5] = -100
    assert ece(z, y_ignored, ignore_index=np.int64(-100)) == ece(z[5:], y[5:])
    with pytest.raises(ValueError, match="class indices"):
        ece(z, y_ignored, ignore_index=None)  # nothing ignored: -100 is out of range


@pytest.mark.parametrize("n_bins", [10_001, 10**6, 10**12])
def test_n_bins_bounded(binned, n_bins):
    z, y = _good()
    with pytest.raises(ValueError, match=r"`n_bins` to be an integer in \[1, 10000\], but got"):
        binned(z, y, n_bins)


def test_n_bins_bounded_in_the_diagram():
    z, y = _good()
    with pytest.raises(ValueError, match=r"`n_bins` to be an integer in \[1, 10000\]"):
        reliability_diagram(z, y, n_bins=10**12)


def test_n_bins_at_the_bound_works():
    z, y = _good(n=50)
    table = reliability_table(z, y, 10_000)
    assert table.count.sum() == 50 and table.ece == pytest.approx(ece(z, y, 10_000), abs=1e-12)


def _huge_logits():
    """Finite float64 logits near 1e308 whose row sums overflow; no two in a row closer than 1e306."""
    rng = np.random.default_rng(3)
    z = np.stack([rng.permutation([1.7e308, 1.2e308, 0.9e308, 0.4e308]) for _ in range(30)])
    z[::3] *= -1  # some rows negative: their sums overflow to -inf
    return z, rng.integers(0, 4, 30)


def test_huge_finite_logits_are_accepted_everywhere():
    # issue 11 case 11: `ece` accepted these while `brier` / `nll` / `classwise_ece` called them "NaN or inf"
    z, y = _huge_logits()
    with np.errstate(over="ignore"):
        assert np.isfinite(z).all() and not np.isfinite(z.sum(axis=1)).any()
    # the softmax of a row whose gaps are ~1e307 is one-hot at its argmax
    onehot = np.eye(4)[z.argmax(1)]
    correct = z.argmax(1) == y
    assert ece(z, y) == ece(onehot, y, from_logits=False)
    assert classwise_ece(z, y) == pytest.approx(classwise_ece(onehot, y, from_logits=False), abs=1e-15)
    assert brier(z, y) == pytest.approx(2.0 * (1 - correct.mean()), abs=1e-15)
    # NLL = z_max - z_y per row (the log-sum-exp term is log 1 = 0); their mean is finite, their sum is not
    losses = z.max(1) - z[np.arange(30), y]
    assert np.isfinite(losses).all() and losses.max() > 1e308
    expected = (losses / 30).sum()  # the mean without overflowing
    assert np.isfinite(nll(z, y)) and nll(z, y) == pytest.approx(expected, rel=1e-14)
    report = calibration_report(z, y)
    assert report.brier == brier(z, y) and report.nll == nll(z, y) and report.ece == ece(z, y)


def test_non_finite_still_rejected_next_to_huge_values():
    z, y = _huge_logits()
    z[4, 2] = np.inf
    for fn in (ece, brier, nll, classwise_ece):
        with pytest.raises(ValueError, match=r"`preds` to be finite, but row 4"):
            fn(z, y)


def test_calibrated_input_of_the_pair_is_checked():
    z, y = _good()
    with pytest.raises(ValueError, match="`calibrated` to have the shape of `preds`"):  # issue 29 item 11: not `target`
        reliability_diagram(z, y, calibrated=z[:-1])
    with pytest.raises(ValueError, match="`calibrated` to be finite"):
        reliability_diagram(z, y, calibrated=np.where(z > 1, np.inf, z))
    with pytest.raises(ValueError, match="`names`"):
        reliability_diagram(z, y, calibrated=z / 2, names=("only one",))
    with pytest.raises(TypeError, match="`counts`"):
        reliability_diagram(z, y, counts="yes")


def test_big_endian_float64_logits_are_computed_in_float64():
    """'>f8' logits took the float32 exp path (dtype '>f8' != np.float64): ECE 2.3e-9 off. The reference is a
    numpy ECE on the float64 softmax (bins lo < p <= hi)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 600)
    z = 3.0 * (rng.normal(size=(600, 5)) + 2.0 * np.eye(5)[y]) + rng.normal(scale=4.0, size=(600, 1))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    index = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    expected = np.abs(np.bincount(index, conf, 15) - np.bincount(index, hit, 15)).sum() / 600
    for preds in (z, z.astype(">f8"), z.astype(np.longdouble)):
        assert ece(preds, y) == pytest.approx(expected, abs=1e-12)
