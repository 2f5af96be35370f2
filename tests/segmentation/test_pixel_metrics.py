"""Streamed pixel calibration metrics against torchmetrics on the flattened, ignore-masked pixels: its public metric
casts confidences to float32 (1e-6), its binning and reduction ``_ce_compute`` fed float64 arrays to 1e-12."""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error
from torchmetrics.functional.classification.calibration_error import _ce_compute

from hf_calibration.segmentation import PixelCalibrationAccumulator, pixel_calibration_report
from hf_calibration.segmentation.metrics import boundary_mask

K = 5


@pytest.fixture(scope="module")
def batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(2):
        logits = torch.randn(2, K, 12, 10, generator=g, dtype=torch.float64) * 2
        target = torch.randint(0, K, (2, 12, 10), generator=g)
        target[torch.rand(2, 12, 10, generator=g) < 0.2] = 255
        out.append((logits, target))
    return out


def _flat(batches):
    probs = torch.cat([torch.softmax(z, 1).permute(0, 2, 3, 1).reshape(-1, K) for z, _ in batches])
    labels = torch.cat([t.reshape(-1) for _, t in batches])
    return probs, labels


def test_equals_torchmetrics(batches):
    acc = PixelCalibrationAccumulator(K, n_bins=10)
    for logits, target in batches:
        acc.update(logits, target)
    got = acc.compute()
    probs, labels = _flat(batches)
    keep = labels != 255
    assert got["pixels"] == keep.sum().item()
    public = multiclass_calibration_error(probs, labels, K, n_bins=10, norm="l1", ignore_index=255)  # float32 inside
    assert got["ece"] == pytest.approx(public.item(), abs=1e-6)
    conf, pred = probs[keep].max(1)
    expected = _ce_compute(conf, (pred == labels[keep]).double(), 10, norm="l1")  # its binning and sums in float64
    assert got["ece"] == pytest.approx(expected.item(), abs=1e-12)
    per_class = [_ce_compute(probs[keep, k], (labels[keep] == k).double(), 10, norm="l1").item() for k in range(K)]
    assert got["classwise_ece"] == pytest.approx(np.mean(per_class), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_top_label_pass_with_tied_logits_equals_torchmetrics(dtype):
    """The top-label-only pass (``classwise=False``) reads correctness off the label's logit: integer logits tie at
    the maximum on many pixels, where argmax's first index decides, as torchmetrics' ``max`` does."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randint(-1, 2, (2, K, 9, 11), generator=g).to(dtype)
    target = torch.randint(0, K, (2, 9, 11), generator=g)
    target[:, 0] = 255
    got = pixel_calibration_report(logits, target, n_bins=7, classwise=False)  # 7: no tied confidence on an edge
    probs = torch.softmax(logits.double(), 1).permute(0, 2, 3, 1).reshape(-1, K)
    labels = target.reshape(-1)
    keep = labels != 255
    conf, pred = probs[keep].max(1)
    assert ((probs[keep] == conf[:, None]).sum(1) > 1).sum() > 20  # ties at the top, some of them on the label
    expected = _ce_compute(conf, (pred == labels[keep]).double(), 7, norm="l1").item()
    assert got["ece"] == pytest.approx(expected, abs=1e-12 if dtype == torch.float64 else 1e-6)
    assert got["accuracy"] == (pred == labels[keep]).double().mean().item()


def test_a_float32_confidence_at_an_edge_is_binned_as_the_package_bins_it():
    """float32(0.2) is just above the float64 edge 0.2, so it shares the bin (0.2, 0.4] with 0.3: hand-worked ECE
    |1 - (0.2 + 0.3)| / 2 = 0.25 (apart, the bins would give (0.8 + 0.3) / 2 = 0.55)."""
    probs = torch.tensor([[0.2] * 5, [0.3, 0.3, 0.2, 0.1, 0.1]], dtype=torch.float32).T.reshape(1, 5, 1, 2)
    got = pixel_calibration_report(probs, torch.tensor([[[0, 1]]]), n_bins=5, from_logits=False)
    assert got["accuracy"] == 0.5
    assert got["ece"] == pytest.approx(abs(1 - (float(np.float32(0.2)) + float(np.float32(0.3)))) / 2, abs=1e-9)


def test_probabilities_in_float64_are_detected(batches):
    (logits, target), _ = batches
    got = pixel_calibration_report(torch.softmax(logits, 1), target, n_bins=10)
    assert got["ece"] == pytest.approx(pixel_calibration_report(logits, target, n_bins=10)["ece"], abs=1e-15)


def test_adaece_equals_exact_when_no_cell_straddles_a_cut():
    g = torch.Generator().manual_seed(3)
    logits, target = (
        torch.randn(2, K, 10, 15, generator=g, dtype=torch.float64) * 2,
        torch.randint(0, K, (2, 10, 15), generator=g),
    )
    probs = torch.softmax(logits, 1).permute(0, 2, 3, 1).reshape(-1, K).numpy()
    conf = np.sort(probs.max(1))
    cells = np.searchsorted(np.linspace(0, 1, (1 << 14) + 1), conf, side="left")
    assert (cells[19::20][:-1] != cells[20::20]).all()  # every cut (20 pixels a bin) falls between two cells
    order = np.argsort(probs.max(1), kind="stable")
    conf, correct = probs.max(1)[order], (probs.argmax(1) == target.reshape(-1).numpy())[order]
    expected = sum(abs(conf[i : i + 20].mean() - correct[i : i + 20].mean()) * 20 / 300 for i in range(0, 300, 20))
    got = pixel_calibration_report(logits, target, n_bins=15)
    assert got["adaece"] == pytest.approx(expected, abs=1e-12)


def test_boundary_pixels_by_hand():
    target = torch.zeros(1, 5, 6, dtype=torch.int64)
    target[0, :, 3:] = 1  # a vertical edge between columns 2 and 3
    np.testing.assert_array_equal(boundary_mask(target, 1)[0, 0].numpy(), [0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(boundary_mask(target, 2)[0, 0].numpy(), [0, 1, 1, 1, 1, 0])
    logits = torch.zeros(1, 2, 5, 6, dtype=torch.float64)
    logits[0, 0] = 2.0  # every pixel says class 0 at confidence sigmoid(2); boundary pixels are half wrong
    got = pixel_calibration_report(logits, target, n_bins=10, boundary_width=1, classwise=False)
    p = 1 / (1 + np.exp(-2.0))
    assert got["boundary_pixels"] == 10 and got["boundary_ece"] == pytest.approx(abs(p - 0.5), abs=1e-12)
    assert got["ece"] == pytest.approx(abs(p - 0.5), abs=1e-12)


@pytest.mark.parametrize(
    ("preds", "target", "error", "message"),
    [
        (torch.zeros(1, K, 2, 2), torch.full((1, 2, 2), K), ValueError, "labels in"),
        (torch.zeros(1, K, 2, 2), torch.full((1, 2, 2), -1), ValueError, "labels in"),
        (torch.full((1, K, 2, 2), float("nan")), torch.zeros(1, 2, 2, dtype=torch.int64), ValueError, "finite"),
        (torch.zeros(1, K, 4, 4), torch.zeros(1, 2, 2, dtype=torch.int64), ValueError, "upsample"),
        (torch.zeros(1, K, 2, 2), torch.zeros(1, 2, 2), TypeError, "integer"),
        (torch.zeros(K, 2, 2), torch.zeros(1, 2, 2, dtype=torch.int64), ValueError, "shape"),
    ],
)
def test_bad_input(preds, target, error, message):
    with pytest.raises(error, match=message):
        PixelCalibrationAccumulator(K).update(preds, target)


def test_all_ignored_and_bad_arguments():
    acc = PixelCalibrationAccumulator(K).update(torch.zeros(1, K, 2, 2), torch.full((1, 2, 2), 255))
    with pytest.raises(ValueError, match="labelled pixel"):
        acc.compute()
    with pytest.raises(ValueError, match="`ignore_index`"):
        PixelCalibrationAccumulator(K, ignore_index=3)
    with pytest.raises(ValueError, match="`boundary_width`"):
        PixelCalibrationAccumulator(K, boundary_width=0)


@pytest.mark.parametrize("shape", [(0, K, 4, 4), (1, K, 0, 5), (1, K, 5, 0)])
def test_an_empty_batch_adds_nothing(shape):
    acc = PixelCalibrationAccumulator(K)
    acc.update(torch.randn(*shape), torch.zeros(shape[0], *shape[2:], dtype=torch.long))
    with pytest.raises(ValueError, match="at least one labelled pixel"):
        acc.compute()
    logits = torch.randn(1, K, 2, 2, dtype=torch.float64)
    target = torch.tensor([[[0, 1], [2, 3]]])
    acc.update(logits, target)  # then a real batch counts as if it came first
    assert acc.compute()["ece"] == pixel_calibration_report(logits, target)["ece"]
