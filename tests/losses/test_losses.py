"""CE, LS, MbLS, focal and FLSD-53: hand-worked values, float64 reference loops, gradients, reductions."""

import math

import _loss_reference as ref
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import ImageClassifierOutput

from hf_calibration.losses import (
    CrossEntropyLoss,
    FLSD53Loss,
    FocalLoss,
    LabelSmoothingLoss,
    MbLSLoss,
)

LN2, LN3 = math.log(2), math.log(3)

# Three samples, K = 3, chosen so the softmax is a simple fraction:
#   z1 = (0, 0, 0)           p = (1/3, 1/3, 1/3)
#   z2 = (ln 2, 0, 0)        p = (2/4, 1/4, 1/4)
#   z3 = (ln 6, ln 3, 0)     p = (6/10, 3/10, 1/10)
HAND_LOGITS = torch.tensor([[0.0, 0.0, 0.0], [LN2, 0.0, 0.0], [math.log(6), LN3, 0.0]], dtype=torch.float64)
HAND_LABELS = torch.tensor([0, 1, 0])
# CE_i = -log p_{i,y_i} = (ln 3, ln 4, ln(10/6))
HAND_CE = [LN3, math.log(4), math.log(10 / 6)]
# mean_k(-log p_ik) = (ln 3, (ln 2 + 2 ln 4)/3, (ln(10/6) + ln(10/3) + ln 10)/3)
HAND_UNIFORM = [LN3, 5 * LN2 / 3, (math.log(10 / 6) + math.log(10 / 3) + math.log(10)) / 3]


def _random_case(n=24, k=7, seed=0, ignored=(3, 11)):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, k, generator=g, dtype=torch.float64)
    labels = torch.randint(0, k, (n,), generator=g)
    labels[list(ignored)] = -100
    return logits, labels


# -- hand-worked 3-sample values ---------------------------------------------------------------
def test_cross_entropy_hand():
    # (ln 3 + ln 4 + ln(5/3)) / 3 = ln(20) / 3
    assert CrossEntropyLoss()(HAND_LOGITS, HAND_LABELS).item() == pytest.approx(math.log(20) / 3, abs=1e-12)


def test_label_smoothing_hand():
    # α = 0.1: mean_i [0.9·CE_i + 0.1·mean_k(-log p_ik)]
    expected = sum(0.9 * c + 0.1 * u for c, u in zip(HAND_CE, HAND_UNIFORM)) / 3
    assert LabelSmoothingLoss(alpha=0.1)(HAND_LOGITS, HAND_LABELS).item() == pytest.approx(expected, abs=1e-12)


def test_mbls_hand():
    # m = 0.5: gaps max_j z_j - z_k are (0,0,0), (0, ln2, ln2), (0, ln2, ln6);
    # mean_k relu(gap - 0.5) = 0, 2(ln2 - 0.5)/3, (ln2 - 0.5 + ln6 - 0.5)/3
    penalties = [0.0, 2 * (LN2 - 0.5) / 3, (LN2 + math.log(6) - 1.0) / 3]
    expected = sum(c + 0.1 * r for c, r in zip(HAND_CE, penalties)) / 3
    assert MbLSLoss(margin=0.5, lam=0.1)(HAND_LOGITS, HAND_LABELS).item() == pytest.approx(expected, abs=1e-12)


def test_focal_hand():
    # γ = 2: (1 - p_y)^2 · CE_i with p_y = 1/3, 1/4, 6/10
    expected = ((2 / 3) ** 2 * HAND_CE[0] + (3 / 4) ** 2 * HAND_CE[1] + 0.4**2 * HAND_CE[2]) / 3
    assert FocalLoss(gamma=2.0)(HAND_LOGITS, HAND_LABELS).item() == pytest.approx(expected, abs=1e-12)


def test_flsd53_hand():
    # labels (0, 1, 2): p_y = 1/3 (γ 3), 1/4 (γ 3), 1/10 < 0.2 (γ 5)
    expected = ((2 / 3) ** 3 * LN3 + (3 / 4) ** 3 * math.log(4) + 0.9**5 * math.log(10)) / 3
    got = FLSD53Loss()(HAND_LOGITS, torch.tensor([0, 1, 2])).item()
    assert got == pytest.approx(expected, abs=1e-12)


def test_flsd53_threshold_is_strict_at_0_2():
    # p_y exactly 0.2 (K = 5, uniform) takes γ = 3: 0.8^3 · ln 5
    got = FLSD53Loss()(torch.zeros(1, 5, dtype=torch.float64), torch.tensor([0])).item()
    assert got == pytest.approx(0.8**3 * math.log(5), abs=1e-12)


# -- independent float64 loops on random inputs ------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "loss, reference",
    [
        (CrossEntropyLoss(), ref.ce),
        (LabelSmoothingLoss(alpha=0.05), lambda z, y: ref.ls(z, y, 0.05)),
        (LabelSmoothingLoss(alpha=0.3), lambda z, y: ref.ls(z, y, 0.3)),
        (MbLSLoss(), lambda z, y: ref.mbls(z, y, 10.0, 0.1)),
        (MbLSLoss(margin=2.0, lam=0.2), lambda z, y: ref.mbls(z, y, 2.0, 0.2)),
        (FocalLoss(), lambda z, y: ref.focal(z, y, 3.0)),
        (FocalLoss(gamma=1.5), lambda z, y: ref.focal(z, y, 1.5)),
        (FLSD53Loss(), lambda z, y: ref.focal(z, y, flsd53=True)),
    ],
    ids=["ce", "ls0.05", "ls0.3", "mbls", "mbls-m2", "focal3", "focal1.5", "flsd53"],
)
def test_against_reference_loop(loss, reference, seed):
    logits, labels = _random_case(seed=seed)
    expected = reference(logits.tolist(), labels.tolist())
    assert loss(logits, labels).item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # float32 input: same value to float32 precision
    assert loss(logits.float(), labels).item() == pytest.approx(expected, rel=1e-5)


def test_ce_matches_torch():
    logits, labels = _random_case()
    torch.testing.assert_close(CrossEntropyLoss()(logits, labels), F.cross_entropy(logits, labels), rtol=1e-13, atol=0)


# -- exact reductions -----------------------------------------------------------------------------
def test_label_smoothing_alpha_zero_is_cross_entropy_exactly():
    logits, labels = _random_case(seed=3)
    logits = logits.float()
    ls = LabelSmoothingLoss(alpha=0.0)
    per_sample = ls.per_sample_loss(logits, labels.clamp_min(0), labels != -100, None)
    expected = F.cross_entropy(logits, labels.clamp_min(0), reduction="none")
    assert torch.equal(per_sample, expected)  # bit for bit, sample by sample
    assert torch.equal(ls(logits, labels), CrossEntropyLoss()(logits, labels))
    # torch's own mean sums in another order: equal to the last bit or two
    torch.testing.assert_close(ls(logits, labels), F.cross_entropy(logits, labels), rtol=2e-7, atol=0)


def test_focal_gamma_zero_is_cross_entropy():
    logits, labels = _random_case(seed=4)
    torch.testing.assert_close(FocalLoss(gamma=0.0)(logits, labels), F.cross_entropy(logits, labels))


def test_mbls_large_margin_is_cross_entropy():
    logits, labels = _random_case(seed=5)
    assert torch.equal(MbLSLoss(margin=1e6)(logits, labels), CrossEntropyLoss()(logits, labels))


# -- gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "loss", [CrossEntropyLoss(), LabelSmoothingLoss(0.1), FocalLoss(3.0), FocalLoss(1.0), FLSD53Loss()], ids=str
)
def test_gradcheck_smooth_losses(loss):
    logits, labels = _random_case(n=6, k=4, seed=6, ignored=(2,))
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: loss(z, labels), (logits,))
    assert torch.autograd.gradcheck(lambda z: loss(z, labels, num_items_in_batch=9), (logits,))


def test_mbls_gradient_matches_closed_form():
    # d/dz_ik of λ·mean_k relu(z_max - z_k - m) for a single sample, away from kinks
    z = torch.tensor([[5.0, 0.0, 3.0, -4.0]], dtype=torch.float64, requires_grad=True)
    MbLSLoss(margin=2.0, lam=0.5)(z, torch.tensor([2])).backward()
    p = torch.softmax(z.detach(), -1)[0]
    onehot = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    # active gaps: k = 1 (5 - 0 > 2), k = 3 (9 > 2); k = 2 gap 2 is not > 2
    penalty_grad = 0.5 / 4 * torch.tensor([2.0, -1.0, 0.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(z.grad[0], p - onehot + penalty_grad)


# -- num_items_in_batch and masking ------------------------------------------------------------
@pytest.mark.parametrize(
    "loss", [CrossEntropyLoss(), LabelSmoothingLoss(0.1), MbLSLoss(2.0, 0.1), FocalLoss(3.0), FLSD53Loss()], ids=str
)
def test_gradient_accumulation_invariance(loss):
    logits, labels = _random_case(n=16, seed=7, ignored=(1, 2, 12))
    count = int((labels != -100).sum())
    full_logits = logits.clone().requires_grad_(True)
    full = loss(full_logits, labels)
    full.backward()
    halves = logits.clone().requires_grad_(True)
    total = loss(halves[:8], labels[:8], num_items_in_batch=count) + loss(
        halves[8:], labels[8:], num_items_in_batch=torch.tensor(count)
    )
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-12, atol=0)
    torch.testing.assert_close(halves.grad, full_logits.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "loss", [CrossEntropyLoss(), LabelSmoothingLoss(0.1), MbLSLoss(2.0, 0.1), FLSD53Loss()], ids=str
)
def test_ignored_rows_have_no_effect(loss):
    logits, labels = _random_case(n=10, seed=8, ignored=(4, 7))
    kept = labels != -100
    z = logits.clone().requires_grad_(True)
    value = loss(z, labels)
    value.backward()
    torch.testing.assert_close(value, loss(logits[kept], labels[kept]), rtol=1e-13, atol=0)
    assert torch.all(z.grad[~kept] == 0)
    # garbage (inf) in ignored rows does not leak into the loss
    poisoned = logits.clone()
    poisoned[~kept] = float("inf")
    torch.testing.assert_close(loss(poisoned, labels), value.detach(), rtol=1e-13, atol=0)


def test_all_ignored_gives_zero():
    assert CrossEntropyLoss()(torch.randn(3, 4), torch.full((3,), -100)).item() == 0.0


# -- calling conventions and dtypes ----------------------------------------------------------------
def test_compute_loss_func_contract():
    logits, labels = _random_case()
    loss = LabelSmoothingLoss(0.1)
    expected = loss(logits, labels)
    outputs = ImageClassifierOutput(logits=logits)
    assert torch.equal(loss(outputs, labels), expected)
    assert torch.equal(loss({"logits": logits}, labels), expected)
    assert torch.equal(loss((logits,), labels), expected)
    count = int((labels != -100).sum())
    assert torch.equal(loss(outputs, labels, num_items_in_batch=count * 2), expected * count / (count * 2))
    assert torch.equal(loss(outputs, labels, count * 2), expected * count / (count * 2))  # positional, Trainer-style
    with pytest.raises(TypeError, match="outputs"):
        loss(object(), labels)


def test_bf16_autocast_upcasts_to_float32():
    logits, labels = _random_case()
    for loss in (LabelSmoothingLoss(0.1), FocalLoss(), MbLSLoss()):
        out = loss(logits.bfloat16(), labels.int())
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, loss(logits.bfloat16().float(), labels))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer = torch.nn.Linear(4, 7)
        out = LabelSmoothingLoss(0.1)(layer(torch.randn(5, 4)), torch.arange(5))
    assert out.dtype == torch.float32


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: LabelSmoothingLoss(alpha=-0.1), "alpha"),
        (lambda: LabelSmoothingLoss(alpha=1.5), "alpha"),
        (lambda: MbLSLoss(margin=-1.0), "margin"),
        (lambda: MbLSLoss(lam=-0.1), "lam"),
        (lambda: FocalLoss(gamma=-1.0), "gamma"),
        (lambda: FocalLoss(gamma=float("nan")), "gamma"),
    ],
)
def test_bad_hyperparameters(make, arg):
    with pytest.raises(ValueError, match=f"`{arg}`"):
        make()


@pytest.mark.parametrize("make", [lambda: LabelSmoothingLoss(alpha="0.1"), lambda: FocalLoss(gamma=None)])
def test_hyperparameter_types(make):
    with pytest.raises(TypeError):
        make()


def test_bad_tensors():
    loss = LabelSmoothingLoss()
    logits = torch.randn(4, 3)
    with pytest.raises(TypeError, match="`labels`"):
        loss(logits, torch.tensor([0.0, 1.0, 2.0, 0.0]))
    with pytest.raises(TypeError, match="`labels`"):
        loss(logits, [0, 1, 2, 0])
    with pytest.raises(ValueError, match="`labels`.*\\[0, 3\\).*found 3"):
        loss(logits, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="found -2"):
        loss(logits, torch.tensor([0, -2, 1, 0]))
    with pytest.raises(ValueError, match="same number of samples"):
        loss(logits, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="rank 2"):
        loss(torch.randn(4), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="`logits`"):
        loss(torch.ones(4, 3, dtype=torch.long), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="num_items_in_batch"):
        loss(logits, torch.tensor([0, 1, 2, 0]), num_items_in_batch="4")


def test_validate_args_off_skips_range_check_only():
    loss = LabelSmoothingLoss(validate_args=False)
    with pytest.raises(ValueError, match="same number of samples"):
        loss(torch.randn(4, 3), torch.tensor([0, 1, 2]))
    assert np.isfinite(loss(torch.randn(4, 3), torch.tensor([0, 1, 2, -100])).item())


# -- num_items_in_batch is a count --------------------------------------------------------------------
ALL_LOSSES = [CrossEntropyLoss(), LabelSmoothingLoss(0.1), MbLSLoss(2.0, 0.1), FocalLoss(0.5), FLSD53Loss()]


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=str)
@pytest.mark.parametrize(
    "count",
    [
        0,
        -3,
        float("nan"),
        float("inf"),
        0.0,
        torch.tensor(0),
        torch.tensor(-2.0),
        torch.tensor(float("nan")),
        torch.tensor(float("inf")),
        torch.tensor([-1, -1]),
    ],
    ids=repr,
)
def test_num_items_in_batch_must_be_a_positive_finite_count(loss, count):
    # before: 0 gave inf, a negative count turned training into gradient ascent
    logits, labels = _random_case(n=6, ignored=())
    with pytest.raises(ValueError, match="`num_items_in_batch`"):
        loss(logits, labels, num_items_in_batch=count)
    with pytest.raises(ValueError, match="`num_items_in_batch`"):
        loss(ImageClassifierOutput(logits=logits), labels, count)  # Trainer's positional call


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=str)
def test_a_count_of_zero_with_every_label_ignored_is_a_zero_loss(loss):
    # a step whose labels are all -100: the Trainer counts 0 items; 0 / 0 would be NaN
    z = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    for count in (0, torch.tensor(0)):
        value = loss(z, torch.full((4,), -100), num_items_in_batch=count)
        assert value.item() == 0.0
        (grad,) = torch.autograd.grad(value, z)
        assert torch.equal(grad, torch.zeros_like(grad))


def test_a_positive_count_divides_the_sum():
    logits, labels = _random_case(n=6, ignored=())
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    for count in (4, 2.5, torch.tensor(4), torch.tensor([4, 4])):  # DataParallel repeats the count per replica
        expected = per_sample.sum() / float(count if not isinstance(count, torch.Tensor) else count.reshape(-1)[0])
        torch.testing.assert_close(CrossEntropyLoss()(logits, labels, num_items_in_batch=count), expected)


def test_validate_args_off_trusts_a_tensor_count():
    loss = CrossEntropyLoss(validate_args=False)  # no host synchronisation: a tensor count is not read
    logits, labels = _random_case(n=6, ignored=())
    assert torch.isfinite(loss(logits, labels, num_items_in_batch=torch.tensor(3)))
    with pytest.raises(ValueError, match="`num_items_in_batch`"):  # a Python number costs nothing to check
        loss(logits, labels, num_items_in_batch=-1)


# -- focal gradients on confident rows ---------------------------------------------------------------
def _focal_gradient_mp(logits: list[float], label: int, gamma: float) -> list[float]:
    """d/dz of -(1 - p_y)^γ log p_y at 60 significant digits (mpmath), the independent reference."""
    import mpmath

    mpmath.mp.dps = 60
    z = [mpmath.mpf(v) for v in logits]
    total = mpmath.fsum(mpmath.exp(v) for v in z)
    p = [mpmath.exp(v) / total for v in z]
    q, log_py = 1 - p[label], mpmath.log(p[label])
    out = []
    for k in range(len(z)):
        d_log_py = (1 if k == label else 0) - p[k]  # ∂ log p_y / ∂z_k
        d_q = -p[label] * d_log_py  # ∂(1 - p_y) / ∂z_k
        out.append(float(-(gamma * q ** (gamma - 1) * d_q * log_py + q**gamma * d_log_py)))
    return out


@pytest.mark.parametrize("gamma", [0.25, 0.5, 0.999, 1.0, 2.0])
def test_focal_gradient_is_finite_and_exact_on_confident_float32_rows(gamma):
    # row 0: p_y rounds to 1 in float32 (before: NaN gradient for 0 < γ < 1); rows 1-2: confident, representable
    rows = [[30.0, 0.0, -2.0], [6.0, 0.0, 1.0], [0.5, 2.0, 9.0]]
    labels = [0, 0, 2]
    z = torch.tensor(rows, dtype=torch.float32, requires_grad=True)
    FocalLoss(gamma)(z, torch.tensor(labels), num_items_in_batch=1).backward()
    assert torch.isfinite(z.grad).all()
    for i, (row, label) in enumerate(zip(rows, labels)):
        expected = _focal_gradient_mp(row, label, gamma)
        # row 0's true gradient is ~1e-7 (γ = 0.25) or smaller: float32 gives 0 there
        np.testing.assert_allclose(z.grad[i].numpy(), expected, rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("loss", [FLSD53Loss(), FocalLoss(0.5), LabelSmoothingLoss(0.1), MbLSLoss(2.0, 0.1)], ids=str)
def test_confident_rows_give_finite_gradients(loss):
    z = torch.tensor([[80.0, 0.0, -5.0], [0.0, 120.0, 3.0]], requires_grad=True)
    loss(z, torch.tensor([0, 1])).backward()
    assert torch.isfinite(z.grad).all()


# -- a loss class is not a loss ----------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CrossEntropyLoss, LabelSmoothingLoss, MbLSLoss, FocalLoss, FLSD53Loss])
def test_a_loss_class_called_as_compute_loss_func_says_to_pass_an_instance(cls):
    logits, labels = _random_case(n=4, ignored=())
    outputs = ImageClassifierOutput(logits=logits)
    for call in (
        lambda: cls(outputs, labels, num_items_in_batch=4),
        lambda: cls(outputs, labels),
        lambda: cls(logits, labels),
    ):
        with pytest.raises(
            TypeError,
            match=rf"^{cls.__name__} is a loss class.*pass an instance, e\.g\. `compute_loss_func={cls.__name__}\(\)`\.$",
        ):
            call()
    assert isinstance(cls(), cls)  # building one with its defaults is untouched
