"""Losses of sigmoid heads against torch, torchvision and the asymmetric loss's reference formula written out."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_calibration.losses import (
    AsymmetricLoss,
    BinaryCrossEntropyLoss,
    BinaryLabelSmoothingLoss,
    CrossEntropyLoss,
    FeDLaSLoss,
    FocalLoss,
    MbLSLoss,
    SigmoidFocalLoss,
    get_loss,
)


def _batch(n=64, labels=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, labels, generator=g) < 0.3).float()
    z = 3 * torch.randn(n, labels, generator=g, dtype=torch.float64)
    return z, y


def test_bce_equals_torch():
    z, y = _batch()
    assert float(BinaryCrossEntropyLoss()(z, y)) == pytest.approx(
        float(F.binary_cross_entropy_with_logits(z, y.double())), rel=1e-12
    )
    # ignored elements leave the mean, element by element
    masked = y.clone()
    masked[::3, 1] = -100
    keep = masked != -100
    expected = F.binary_cross_entropy_with_logits(z[keep], y[keep].double())
    assert float(BinaryCrossEntropyLoss()(z, masked)) == pytest.approx(float(expected), rel=1e-12)


def test_binary_head_shapes():
    z, y = _batch(labels=1)
    expected = float(F.binary_cross_entropy_with_logits(z[:, 0], y[:, 0].double()))
    assert float(BinaryCrossEntropyLoss()(z[:, 0], y[:, 0].long())) == pytest.approx(expected, rel=1e-12)
    assert float(BinaryCrossEntropyLoss()(z, y[:, 0].long())) == pytest.approx(expected, rel=1e-12)  # (N, 1) logits


@pytest.mark.parametrize("alpha", [None, 0.25])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_sigmoid_focal_equals_torchvision(gamma, alpha):
    from torchvision.ops import sigmoid_focal_loss

    z, y = _batch(seed=1)
    expected = sigmoid_focal_loss(z, y.double(), alpha=-1 if alpha is None else alpha, gamma=gamma, reduction="mean")
    got = SigmoidFocalLoss(gamma=gamma, alpha=alpha)(z, y)
    assert float(got) == pytest.approx(float(expected), rel=1e-10)
    zz = z.clone().requires_grad_(True)
    SigmoidFocalLoss(gamma=gamma, alpha=alpha)(zz, y).backward()
    zr = z.clone().requires_grad_(True)
    sigmoid_focal_loss(zr, y.double(), alpha=-1 if alpha is None else alpha, gamma=gamma, reduction="mean").backward()
    assert torch.allclose(zz.grad, zr.grad, rtol=1e-8, atol=1e-12)


def test_binary_label_smoothing():
    z, y = _batch(seed=2)
    expected = F.binary_cross_entropy_with_logits(z, y.double() * 0.8 + 0.1)
    assert float(BinaryLabelSmoothingLoss(alpha=0.2)(z, y)) == pytest.approx(float(expected), rel=1e-12)
    assert float(BinaryLabelSmoothingLoss(alpha=0.0)(z, y)) == pytest.approx(
        float(BinaryCrossEntropyLoss()(z, y)), rel=1e-12
    )


def _asl_reference(x, y, gamma_neg=4.0, gamma_pos=1.0, clip=0.05, eps=1e-8):
    """Ridnik et al.'s AsymmetricLoss.forward (their repository, losses.py), written out from the paper's eqs. 4-6:
    sigmoid, the negatives' probability shift clip, the logs clamped at eps, the one-sided focusing weight; summed."""
    xs_pos = torch.sigmoid(x)
    xs_neg = 1 - xs_pos
    if clip is not None and clip > 0:
        xs_neg = (xs_neg + clip).clamp(max=1)
    los_pos = y * torch.log(xs_pos.clamp(min=eps))
    los_neg = (1 - y) * torch.log(xs_neg.clamp(min=eps))
    loss = los_pos + los_neg
    pt = xs_pos * y + xs_neg * (1 - y)
    one_sided_gamma = gamma_pos * y + gamma_neg * (1 - y)
    loss = loss * torch.pow(1 - pt, one_sided_gamma)
    return -loss.sum()


@pytest.mark.parametrize("gammas", [(4.0, 0.0, 0.05), (4.0, 1.0, 0.05), (2.0, 0.0, 0.0)])
def test_asymmetric_loss_equals_reference_formula(gammas):
    gamma_neg, gamma_pos, clip = gammas
    z, y = _batch(seed=3)
    expected = _asl_reference(z, y.double(), gamma_neg, gamma_pos, clip) / y.numel()  # ours: the mean over elements
    loss = AsymmetricLoss(gamma_pos=gamma_pos, gamma_neg=gamma_neg, clip=clip)
    assert float(loss(z, y)) == pytest.approx(float(expected), rel=1e-12)
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    loss(za, y).backward()
    (_asl_reference(zb, y.double(), gamma_neg, gamma_pos, clip) / y.numel()).backward()
    assert torch.allclose(za.grad, zb.grad, rtol=1e-9, atol=1e-14)


def test_asymmetric_loss_by_hand():
    # z = 0: p = 0.5; a positive costs log 2, a negative 0.45^4 * -log(0.55) (shifted by m = 0.05)
    got = AsymmetricLoss()(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]))
    assert float(got) == pytest.approx((np.log(2) + 0.45**4 * -np.log(0.55)) / 2, rel=1e-6)


@pytest.mark.parametrize("make", [BinaryCrossEntropyLoss, SigmoidFocalLoss, AsymmetricLoss, BinaryLabelSmoothingLoss])
def test_gradient_accumulation_with_num_items_in_batch(make):
    z, y = _batch(seed=4)
    y[5, 2] = -100
    loss = make()
    count = int((y != -100).sum())
    za = z.clone().requires_grad_(True)
    loss(za, y).backward()
    zb = z.clone().requires_grad_(True)
    (loss(zb[:32], y[:32], num_items_in_batch=count) + loss(zb[32:], y[32:], num_items_in_batch=count)).backward()
    assert torch.allclose(za.grad, zb.grad, rtol=1e-10, atol=1e-15)


def test_trainer_call_convention_and_registry():
    from transformers.modeling_outputs import ImageClassifierOutput

    z, y = _batch()
    assert float(get_loss("asl")(ImageClassifierOutput(logits=z), y)) == pytest.approx(float(AsymmetricLoss()(z, y)))
    assert {"bce", "binary_ls", "sigmoid_focal", "asl"} <= set(__import__("hf_calibration").losses.list_losses())


def test_bad_targets_are_named():
    z, y = _batch()
    with pytest.raises(ValueError, match=r"targets in \[0, 1\]"):
        BinaryCrossEntropyLoss()(z, 2 * y)
    with pytest.raises(ValueError, match="softmax head"):
        AsymmetricLoss()(z, torch.zeros(64, dtype=torch.long))  # class indices: a multi-class head
    for softmax in (CrossEntropyLoss(), FocalLoss(), MbLSLoss()):
        with pytest.raises(ValueError, match=r"multi_label_classification.*BinaryCrossEntropyLoss"):
            softmax(z, y)
    with pytest.raises(ValueError, match="multi_label_classification"):
        FeDLaSLoss(num_classes=5)(z, y, features=torch.randn(64, 8))


@pytest.mark.parametrize("name", ["bce", "focal", "asymmetric", "label_smoothing"])
def test_a_nan_label_is_refused_not_a_nan_loss(name):
    """The sigmoid losses returned NaN for a NaN label (issue 40): refused, naming it, as an out-of-range one is."""
    from hf_calibration.losses import AsymmetricLoss, BinaryCrossEntropyLoss, BinaryLabelSmoothingLoss, SigmoidFocalLoss

    loss = {"bce": BinaryCrossEntropyLoss, "focal": SigmoidFocalLoss, "asymmetric": AsymmetricLoss,
            "label_smoothing": BinaryLabelSmoothingLoss}[name]()  # fmt: skip
    z = torch.randn(6, 3)
    y = (torch.rand(6, 3) < 0.5).float()
    assert torch.isfinite(loss(z, y))
    y[2, 1] = float("nan")
    with pytest.raises(ValueError, match="found nan"):
        loss(z, y)
