"""Conformity scores against hand-worked rows and against the paper's prediction procedure, written from its pseudo-code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration.conformal.scores import (
    conformity_scores,
    conformity_scores_graph,
    label_ranks,
    sets_from_scores,
    sets_from_scores_graph,
)

ROW = torch.tensor([[0.15, 0.5, 0.05, 0.3]], dtype=torch.float64)  # ranks: class 1, 3, 0, 2


def test_thr_is_one_minus_the_probability():
    torch.testing.assert_close(
        conformity_scores(ROW, "thr"), torch.tensor([[0.85, 0.5, 0.95, 0.7]], dtype=torch.float64)
    )


def test_aps_by_hand():
    # cumulated mass up to and including each class, in decreasing order of probability: 0.5, 0.8, 0.95, 1.0
    torch.testing.assert_close(
        conformity_scores(ROW, "aps"), torch.tensor([[0.95, 0.5, 1.0, 0.8]], dtype=torch.float64)
    )
    # randomised, u = 0.25: minus a quarter of the class's own probability
    u = torch.tensor([0.25], dtype=torch.float64)
    expected = torch.tensor([[0.95 - 0.0375, 0.5 - 0.125, 1.0 - 0.0125, 0.8 - 0.075]], dtype=torch.float64)
    torch.testing.assert_close(conformity_scores(ROW, "aps", u), expected)


def test_raps_adds_lambda_per_rank_beyond_k_reg():
    # k_reg = 1, lambda = 0.1: ranks 1..4 pay 0, 0.1, 0.2, 0.3; the randomisation never scales the penalty
    u = torch.tensor([0.5], dtype=torch.float64)
    got = conformity_scores(ROW, "raps", u, k_reg=1, penalty=0.1)
    expected = torch.tensor(
        [[0.95 - 0.075 + 0.2, 0.5 - 0.25, 1.0 - 0.025 + 0.3, 0.8 - 0.15 + 0.1]], dtype=torch.float64
    )
    torch.testing.assert_close(got, expected)
    # k_reg = 0 penalises every rank, the first included; aps ignores the RAPS parameters
    torch.testing.assert_close(
        conformity_scores(ROW, "raps", k_reg=0, penalty=0.1) - conformity_scores(ROW, "aps"),
        torch.tensor([[0.3, 0.1, 0.4, 0.2]], dtype=torch.float64),
    )
    torch.testing.assert_close(conformity_scores(ROW, "aps", k_reg=0, penalty=0.1), conformity_scores(ROW, "aps"))


def test_tied_probabilities_are_ranked_by_class_index():
    probs = torch.tensor([[0.2, 0.4, 0.4]], dtype=torch.float64)
    torch.testing.assert_close(conformity_scores(probs, "aps"), torch.tensor([[1.0, 0.4, 0.8]], dtype=torch.float64))
    assert label_ranks(probs, torch.tensor([2])).tolist() == [2]
    assert label_ranks(probs, torch.tensor([1])).tolist() == [1]


def test_unknown_method():
    with pytest.raises(ValueError, match="`method`"):
        conformity_scores(ROW, "saps")


def test_empty_sets_get_the_lowest_score_only_when_asked():
    scores = torch.tensor([[0.9, 0.7, 0.95], [0.1, 0.3, 0.6]], dtype=torch.float64)
    assert sets_from_scores(scores, 0.5, allow_empty=True).tolist() == [[False, False, False], [True, True, False]]
    assert sets_from_scores(scores, 0.5, allow_empty=False).tolist() == [[False, True, False], [True, True, False]]


def _paper_algorithm_3(probs: np.ndarray, tau: float, k_reg: int, lam: float, U: float, rand: bool) -> set[int]:
    """Angelopoulos et al. 2021, Algorithm 3 (RAPS prediction sets), line by line, for one row."""
    pi = np.argsort(-probs, kind="stable")  # classes by decreasing probability
    K = len(probs)
    cum = [probs[pi[:j]].sum() + lam * max(j - k_reg, 0) for j in range(1, K + 1)]
    L = min(sum(c <= tau for c in cum) + 1, K)
    V = (tau - probs[pi[: L - 1]].sum() - lam * max(L - k_reg, 0)) / probs[pi[L - 1]]
    if rand and V <= U:
        L -= 1
    return set(pi[:L].tolist())


@pytest.mark.parametrize("k_reg,lam", [(0, 0.0), (2, 0.05), (1, 0.2)])
def test_randomised_sets_are_the_papers_algorithm_3(k_reg, lam):
    # the paper keeps the L-th class when U < V; {y : s(x, y; u) <= tau} is that set with U = 1 - u
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.full(8, 0.4), size=300)
    u = rng.uniform(size=300)
    method = "raps" if lam else "aps"
    scores = conformity_scores(torch.from_numpy(probs), method, torch.from_numpy(u), k_reg=k_reg, penalty=lam)
    for tau in (0.3, 0.7, 0.95, 1.2):
        sets = sets_from_scores(scores, tau, allow_empty=True).numpy()
        for i in range(300):
            assert set(np.flatnonzero(sets[i]).tolist()) == _paper_algorithm_3(
                probs[i], tau, k_reg, lam, 1 - u[i], rand=True
            )


def test_non_randomised_sets_drop_the_papers_crossing_class():
    # the paper's non-randomised Algorithm 3 keeps the class at which the mass crosses tau; ours is the split-conformal
    # set {y : s(x, y) <= tau} of the same score: exactly that class fewer, whenever the set is not all classes
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.full(6, 0.5), size=200)
    sets = sets_from_scores(conformity_scores(torch.from_numpy(probs), "aps"), 0.8, allow_empty=True).numpy()
    for i in range(200):
        paper = _paper_algorithm_3(probs[i], 0.8, 0, 0.0, 0.0, rand=False)
        ours = set(np.flatnonzero(sets[i]).tolist())
        assert ours < paper and len(paper - ours) == 1


def test_the_traced_scores_cap_the_cumulated_mass_as_the_eager_ones():
    """Issue 53 item 11: rows whose cumulated probabilities round above 1 (0.55 + 0.34 + 0.11 = 1 + 2^-52 in float64).
    APS scores are capped at 1, and exactly 1 at the last rank (the mass of a probability vector); the traced scores
    (ONNX, torch.export) did not cap, so with q_hat = 1 (a saturated predictor) the graph's sets lost the last class
    while predict_sets kept it."""
    probs = torch.tensor([[0.55, 0.34, 0.11], [0.11, 0.56, 0.33]], dtype=torch.float64)
    assert 0.55 + 0.34 + 0.11 > 1.0 and 0.56 + 0.33 + 0.11 > 1.0
    expected = torch.tensor([[0.55, 0.55 + 0.34, 1.0], [1.0, 0.56, 0.56 + 0.33]], dtype=torch.float64)
    assert torch.equal(conformity_scores(probs, "aps"), expected)
    assert torch.equal(conformity_scores_graph(probs, "aps"), expected)
    q_hat = torch.tensor(1.0, dtype=torch.float64)
    assert sets_from_scores_graph(conformity_scores_graph(probs, "aps"), q_hat).all()
    by_class = torch.tensor([[0.0, 0.0, 0.1], [0.1, 0.0, 0.0]], dtype=torch.float64)  # RAPS: 0.1 at rank 3 (k_reg 2)
    assert torch.equal(conformity_scores_graph(probs, "raps", k_reg=2, penalty=0.1), expected + by_class)


def test_an_empty_saturated_set_gets_the_most_probable_class():
    """Issue 53 item 11: a row whose top probability is 1.0 in float64 has every APS score at the cap, 1; below q_hat
    = 1 its set is empty and gets the most probable class (class 1 here, what the compiled kernels take), not the
    first of the tied lowest scores (class 0), in the eager and the traced sets alike."""
    probs = torch.tensor([[1e-20, 1.0, 1e-20]], dtype=torch.float64)
    scores = conformity_scores(probs, "aps")
    assert torch.equal(scores, torch.ones(1, 3, dtype=torch.float64))
    expected = torch.tensor([[False, True, False]])
    assert torch.equal(sets_from_scores(scores, 0.9, probs=probs), expected)
    graph_scores = conformity_scores_graph(probs, "aps")
    assert torch.equal(
        sets_from_scores_graph(graph_scores, torch.tensor(0.9, dtype=torch.float64), probs=probs), expected
    )
