"""The compiled conformal kernels (``conformal._kernels``) against the torch definitions of ``scores.py``: every label's
score and rank, and the sets, on peaked, flat and tied rows; the saturated-row empty set; large inputs in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration.conformal import ConformalPredictor
from hf_calibration.conformal._kernels import label_scores, set_rows
from hf_calibration.conformal.scores import conformity_scores, label_ranks, sets_from_scores

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


def _cases():
    rng = np.random.default_rng(0)
    peaked = 4 * rng.normal(size=(300, 50))
    flat = 0.05 * rng.normal(size=(300, 50))  # nearly uniform rows: the candidate buckets hold most classes
    tied = np.round(rng.normal(size=(300, 50)), 0)  # many exactly equal probabilities: ties ranked by class index
    return [peaked, flat, tied]


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
@pytest.mark.parametrize("randomized", [False, True])
def test_label_scores_and_ranks_equal_the_torch_definitions(method, randomized):
    for case, z in enumerate(_cases()):
        y = np.random.default_rng(case).integers(0, z.shape[1], z.shape[0])
        u = np.random.default_rng(10 + case).random(z.shape[0]) if randomized and method != "thr" else None
        probs = torch.softmax(torch.from_numpy(z), 1)
        reference = conformity_scores(probs, method, None if u is None else torch.from_numpy(u), k_reg=3, penalty=0.05)
        scores, ranks = label_scores(z, y, method, u=u, k_reg=3, penalty=0.05)
        np.testing.assert_allclose(
            scores, reference[torch.arange(len(y)), torch.from_numpy(y)].numpy(), rtol=0, atol=1e-13
        )
        np.testing.assert_array_equal(ranks, label_ranks(probs, torch.from_numpy(y)).numpy())


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
@pytest.mark.parametrize("allow_empty", [False, True])
def test_sets_equal_the_torch_definitions_away_from_the_threshold(method, allow_empty):
    for case, z in enumerate(_cases()):
        u = np.random.default_rng(20 + case).random(z.shape[0]) if method != "thr" else None
        probs = torch.softmax(torch.from_numpy(z), 1)
        scores = conformity_scores(probs, method, None if u is None else torch.from_numpy(u), k_reg=3, penalty=0.05)
        for q_hat in (0.3, 0.8, 0.95, float(scores.median())):
            reference = sets_from_scores(scores, q_hat, allow_empty=allow_empty).numpy()
            sets, sizes, _ = set_rows(z, method, q_hat, u=u, k_reg=3, penalty=0.05, allow_empty=allow_empty)
            clear = (np.abs(scores.numpy() - q_hat) > 1e-12).all(axis=1)
            assert clear.mean() > 0.9
            np.testing.assert_array_equal(sets[clear], reference[clear])
            np.testing.assert_array_equal(sizes, sets.sum(axis=1))


def test_rows_are_read_in_place_and_labels_covered():
    rng = np.random.default_rng(5)
    z = (3 * rng.normal(size=(100, 20))).astype(np.float32)
    y = rng.integers(0, 20, 100)
    rows = np.array([3, 50, 7, 99])
    scores, _ = label_scores(z, y[rows], "aps", rows=rows)
    np.testing.assert_array_equal(scores, label_scores(np.ascontiguousarray(z[rows]), y[rows], "aps")[0])
    sets, sizes, covered = set_rows(z, "aps", 0.9, rows=rows, labels=y[rows])
    np.testing.assert_array_equal(covered, sets[np.arange(4), y[rows]])
    _, sizes_only, _ = set_rows(z, "aps", 0.9, rows=rows, masks=False)
    np.testing.assert_array_equal(sizes_only, sizes)


def test_an_empty_set_of_a_saturated_row_gets_the_most_probable_class():
    """Every APS score of a saturated row rounds to 1.0; above a threshold just below 1 the set is empty and gets the
    most probable class (the docstring's rule). It used to get class 0: the first of the tied scores."""
    z = np.zeros((40, 10))
    z[:, 7] = 60.0  # p = 1 - 9e-27: every cumulated score is 1.0 in float64
    z[:20, 3] = 1.0
    y = np.full(40, 7)
    predictor = ConformalPredictor("aps", randomized=False).fit(z, y, alpha=0.2)
    predictor.q_hat.fill_(1.0 - 1e-9)
    sets = predictor.predict_sets(z)
    assert sets.sum(axis=1).tolist() == [1] * 40 and sets[:, 7].all()


def test_predict_sets_refuses_bad_rows():
    predictor = ConformalPredictor("thr").fit(*_fit_data())
    z = np.random.default_rng(1).normal(size=(30, 8))
    z[12, 3] = -np.inf
    with pytest.raises(ValueError, match="row 12 contains NaN or inf"):
        predictor.predict_sets(z)
    probs = np.full((5, 8), 1 / 8)
    probs[2, 0] = 0.9
    with pytest.raises(ValueError, match="row 2 sums to"):
        predictor.predict_sets(probs, from_logits=False)


def _fit_data():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 8, 400)
    return 2 * rng.normal(size=(400, 8)) + 3 * np.eye(8)[y], y


# ------------------------------------------------------------------------------------------------ the numpy twins
@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("from_probs", [False, True])
def test_numpy_twins_are_the_kernels_bit_for_bit(method, dtype, from_probs):
    """``_core.numpy_twin``: before the kernels' compile has paid, their numpy twins give the same scores, ranks, sets,
    sizes and coverage to the bit (peaked, flat and tied rows; probabilities with exact zeros; a row subset; draws)."""
    from hf_calibration._core.parallel import serial_twin
    from hf_calibration.conformal import _kernels as kernels

    code = kernels.METHOD_CODES[method]
    for case, z in enumerate(_cases()):
        x = z.astype(dtype)
        if from_probs:
            x = torch.softmax(torch.from_numpy(z), 1).numpy().astype(dtype)
            x[:5, :3] = 0
        rng = np.random.default_rng(case)
        rows = rng.permutation(x.shape[0])[:200].astype(np.int64)
        y = rng.integers(0, x.shape[1], rows.shape[0])
        for u in (np.zeros(0), rng.random(rows.shape[0])):
            args = (x, rows, y, from_probs, code, u, 2.0, 0.1 if method == "raps" else 0.0)
            expected = (np.empty(200), np.empty(200, np.int64))
            got = (np.empty(200), np.empty(200, np.int64))
            serial_twin(kernels._label_scores)(*args, *expected)
            kernels._twin_label_scores(*args, *got)
            assert np.array_equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
            for q in (0.0, 0.5, float(np.quantile(expected[0], 0.9)), 0.99):
                for allow_empty in (False, True):
                    sets = [
                        (np.empty((200, x.shape[1]), bool), np.empty(200, np.int64), np.empty(200, bool)) for _ in "ab"
                    ]
                    serial_twin(kernels._sets)(*args, q, allow_empty, *sets[0])
                    kernels._twin_sets(*args, q, allow_empty, *sets[1])
                    assert all(np.array_equal(a, b) for a, b in zip(*sets))
