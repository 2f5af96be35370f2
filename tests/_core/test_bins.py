"""The equal-width bin rule, ``lo < p <= hi`` (0 in the first bin, 1 in the last), written once in
``hf_calibration._core.bins`` and called by every binned path. Each path is fed values exactly on the edges (and one
ulp either side, 0, 1, float16 softmax outputs) and compared with a ``searchsorted`` brute force written here.

Paths: the batch index (``uniform_bin_index``), the top-label pass (ECE's fused bin sums), classwise ECE's probability
pass (its lowest-bin shortcut included) and its bootstrap resamples, the streaming accumulator's classwise sums (the
compiled CPU kernel and the torch path that serves CUDA tensors, run here on CPU tensors), CTS's binned search.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_calibration._core.bins import in_lowest_bin, uniform_bin_index, uniform_edges
from hf_calibration._core.inputs import read_multiclass
from hf_calibration.metrics import CalibrationAccumulator, classwise_ece, ece
from hf_calibration.metrics import accumulator as accumulator_module
from hf_calibration.metrics._probability_pass import probability_rows
from hf_calibration.metrics.bootstrap import Bootstrap, frame_position

pytestmark = pytest.mark.kernels


def _brute_bin(p: np.ndarray, n_bins: int) -> np.ndarray:
    """``lo < p <= hi`` by searchsorted on the inner edges: the number of inner edges strictly below p."""
    return np.searchsorted(np.linspace(0, 1, n_bins + 1)[1:-1], p, side="left")


def _edge_values(n_bins: int) -> np.ndarray:
    edges = uniform_edges(n_bins)
    values = np.concatenate([edges, np.nextafter(edges, 2), np.nextafter(edges, -1), [0.1, 0.2, 0.5, 0.8, 0.9]])
    half = (
        torch.softmax(torch.randn(300, 4, generator=torch.Generator().manual_seed(0)).half(), 1)
        .double()
        .numpy()
        .ravel()
    )
    return np.clip(np.concatenate([values, half]), 0.0, 1.0)


@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_the_batch_index_and_the_lowest_bin_shortcut(n_bins):
    values = _edge_values(n_bins)
    np.testing.assert_array_equal(uniform_bin_index(values, n_bins), _brute_bin(values, n_bins))
    edges = uniform_edges(n_bins)
    lowest = np.array([in_lowest_bin(v, edges) for v in values])
    np.testing.assert_array_equal(lowest, _brute_bin(values, n_bins) == 0)


def _rows_on_the_edges(n_bins: int, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Probability rows whose entries sit on, or one ulp beside, the bin edges (each row sums to 1)."""
    rng = np.random.default_rng(n_bins)
    edges = uniform_edges(n_bins)
    picks = np.concatenate([edges[1:-1], np.nextafter(edges[1:-1], 2), np.nextafter(edges[1:-1], -1), [0.0, 1.0]])
    rows = []
    for _ in range(400):
        a = rng.choice(picks[picks < 0.5])
        b = rng.choice(picks[picks <= 1 - a])
        rest = 1.0 - a - b
        row = np.array([a, b, rest * 0.5, rest * 0.5])
        rows.append(rng.permutation(row))
    p = np.array(rows)
    p[:, -1] = 1.0 - p[:, :-1].sum(axis=1)  # exact sums (the last entry absorbs the rounding)
    p = np.clip(p, 0.0, 1.0)
    return p, rng.integers(0, k, p.shape[0])


def _brute_classwise(p: np.ndarray, y: np.ndarray, n_bins: int) -> tuple[np.ndarray, float]:
    n, k = p.shape
    cells = np.zeros((k, n_bins))
    for c in range(k):
        b = _brute_bin(p[:, c], n_bins)
        np.add.at(cells[c], b, p[:, c] - (y == c))
    return cells, float(np.abs(cells).sum(axis=1).mean() / n)


@pytest.mark.parametrize("n_bins", [5, 10, 15])
def test_classwise_ece_and_its_probability_pass(n_bins):
    """The classwise pass takes a shortcut for the lowest bin (``p <= 1/n_bins``): with p = 0.1 at 10 bins exactly on
    that edge, a `<` for `<=` moved classwise ECE from 0.0448 to 0.0842 and no test saw it."""
    p, y = _rows_on_the_edges(n_bins)
    cells, expected = _brute_classwise(p, y, n_bins)
    rows = probability_rows(read_multiclass(p, y, from_logits=False), n_bins)
    np.testing.assert_allclose(rows.cells, cells, rtol=0, atol=1e-12)
    assert classwise_ece(p, y, n_bins, from_logits=False) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n_bins", [10, 15])
def test_classwise_bootstrap_resamples_bin_as_the_brute_force(n_bins):
    p, y = _rows_on_the_edges(n_bins)
    boot = Bootstrap(level=0.9, n_boot=20, seed=3)
    inputs = read_multiclass(p, y, from_logits=False)
    from hf_calibration._core.rowpass import top_label

    position = frame_position(top_label(inputs).confidence)
    replicates = probability_rows(inputs, n_bins, boot=boot, position=position, checked=True).replicates
    counts = next(boot._blocks(p.shape[0], 1 << 26))  # the resamples' counts, in frame order
    for r in range(5):
        weights = counts[r][position]  # row i drawn weights[i] times
        cells = np.zeros((p.shape[1], n_bins))
        for c in range(p.shape[1]):
            np.add.at(cells[c], _brute_bin(p[:, c], n_bins), weights * (p[:, c] - (y == c)))
        assert replicates[r] == pytest.approx(np.abs(cells).sum(axis=1).mean() / p.shape[0], abs=1e-12)


@pytest.mark.parametrize("n_bins", [10, 15])
def test_the_top_label_pass_bins_as_the_brute_force(n_bins):
    p, y = _rows_on_the_edges(n_bins)
    confidence, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
    b = _brute_bin(confidence, n_bins)
    expected = sum(abs((confidence[b == j] - correct[b == j]).sum()) for j in range(n_bins)) / len(y)
    assert ece(p, y, n_bins, from_logits=False) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n_bins", [10, 15])
@pytest.mark.parametrize("path", ["compiled", "torch (the CUDA path, on CPU tensors)"])
def test_the_streaming_classwise_sums(n_bins, path):
    p, y = _rows_on_the_edges(n_bins)
    cells, _ = _brute_classwise(p, y, n_bins)
    if path == "compiled":
        acc = CalibrationAccumulator(n_bins=n_bins, from_logits=False)
        acc.update(p, y)
        got = acc._classwise
    else:  # _rows_torch serves tensors on a GPU; its bucketize is the rule's third spelling
        rows, _ = accumulator_module._rows_torch(torch.from_numpy(p), torch.from_numpy(y), False, -100, n_bins, True)
        got = rows.classwise
    np.testing.assert_allclose(got, cells, rtol=0, atol=1e-12)


def test_cts_bins_its_confidences_by_the_rule():
    """CTS's grid search bins each candidate confidence with the one rule (it once had inline copies)."""
    from hf_calibration.calibrators._machinery.fitting import cts_search

    edges = uniform_edges(10)
    tot = 1.0 / np.clip(_edge_values(10), 1e-3, 1.0)  # a row's sum of exp(z - z_top): its confidence is 1 / tot
    conf = 1.0 / tot
    labels, j1 = np.ones(tot.shape[0], np.int64), np.zeros(tot.shape[0], np.int64)  # every prediction wrong
    gaps = np.zeros(10)
    np.add.at(gaps, _brute_bin(conf, 10), conf)
    total, correct = cts_search.current_bins(labels, j1, tot, edges)
    assert correct == 0 and total == pytest.approx(np.abs(gaps).sum(), abs=1e-12)
