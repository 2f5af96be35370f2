"""MaC-Cal's masked bottleneck head, its mask-aware SGD and the autograd-free head trainer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from hf_calibration.maccal import MaskedBottleneckHead
from hf_calibration.maccal.head import FlatHeadTrainer, MaskedSGD

torch.set_num_threads(1)


def test_masked_forward_uses_w_times_m_and_gradient_is_masked():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    m1, m2 = head.draw_masks(0.5, torch.Generator().manual_seed(1))
    assert 0 < m1.sum() < m1.numel() and 0 < m2.sum() < m2.numel()
    x = torch.randn(4, 6)
    w1, b1, w2, b2 = (p.detach().clone() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))
    expected = torch.relu(x @ (w1 * m1).T + b1) @ (w2 * m2).T + b2  # by hand
    out = head(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    for weight, mask in ((head.fc1.weight, m1), (head.fc2.weight, m2)):
        assert torch.all(weight.grad[mask == 0] == 0)
        assert torch.count_nonzero(weight.grad[mask == 1]) > 0
    # inference: full weights, no mask, deterministic
    head.eval()
    torch.testing.assert_close(head(x), torch.relu(x @ w1.T + b1) @ w2.T + b2)
    head.train()
    head.clear_masks()
    torch.testing.assert_close(head(x), torch.relu(x @ w1.T + b1) @ w2.T + b2)


def test_init_from_linear_is_exactly_the_linear_head():
    torch.manual_seed(0)
    linear = torch.nn.Linear(7, 4)
    head = MaskedBottleneckHead(7, 11, 4)  # 3 hidden units past 2K: random fc1 rows, zero output weights
    head.init_from_linear(linear)
    x = torch.randn(50, 7) * 5
    torch.testing.assert_close(head.eval()(x), linear(x), atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(head.fc1.weight[8:]) > 0 and torch.count_nonzero(head.fc2.weight[:, 8:]) == 0
    with pytest.raises(ValueError, match="hidden"):
        MaskedBottleneckHead(7, 7, 4).init_from_linear(linear)
    with pytest.raises(ValueError, match="Linear"):
        MaskedBottleneckHead(6, 11, 4).init_from_linear(linear)


def test_masks_follow_the_retention_probability():
    head = MaskedBottleneckHead(64, 64, 10)
    m1, _ = head.draw_masks(0.3, torch.Generator().manual_seed(0))
    # 4096 Bernoulli(0.3) draws: mean within 4 standard deviations
    assert abs(m1.mean().item() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / m1.numel())


def test_masked_sgd_equals_torch_sgd_without_masks():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
    b.load_state_dict(a.state_dict())
    ours = MaskedSGD(a.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for step in range(4):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_masked_entries_do_not_move_even_with_momentum_and_weight_decay():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    opt = MaskedSGD(head.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    # first epoch: everything kept, so every momentum buffer is non-zero
    head.draw_masks(1.0)
    opt.set_masks(dict(zip(head.masked_weights, head.masks)))
    opt.zero_grad()
    F.cross_entropy(head(x), y).backward()
    opt.step()
    # next epoch: a real mask; masked entries must keep their value and their momentum buffer
    masks = head.draw_masks(0.5, torch.Generator().manual_seed(3))
    opt.set_masks(dict(zip(head.masked_weights, masks)))
    before = [w.detach().clone() for w in head.masked_weights]
    bufs = [opt.state[w]["momentum_buffer"].clone() for w in head.masked_weights]
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(head(x), y).backward()
        opt.step()
    for w, w0, buf0, m in zip(head.masked_weights, before, bufs, masks):
        keep = m.bool()
        assert torch.equal(w.detach()[~keep], w0[~keep])
        assert torch.equal(opt.state[w]["momentum_buffer"][~keep], buf0[~keep])
        assert torch.all(w.detach()[keep] != w0[keep])


def test_masked_sgd_rejects_bad_hyperparameters():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="lr"):
        MaskedSGD(params, lr=0.0)
    with pytest.raises(ValueError, match="momentum"):
        MaskedSGD(params, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        MaskedSGD(params, lr=0.1, weight_decay=-1.0)


def test_rescaled_masks_multiply_kept_weights_by_one_over_rho():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    m1, m2 = head.draw_masks(0.25, torch.Generator().manual_seed(2), rescale=True)
    x = torch.randn(4, 6)
    w1, b1, w2, b2 = (p.detach() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))
    expected = torch.relu(x @ (w1 * m1 * 4.0).T + b1) @ (w2 * m2 * 4.0).T + b2
    torch.testing.assert_close(head(x), expected)


def test_flat_trainer_forward_and_gradients_equal_autograd_through_the_module():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(7, 6, 4).double().train()
    masks = head.draw_masks(0.5, torch.Generator().manual_seed(4), rescale=True)
    trainer = FlatHeadTrainer(head, lr=0.1)
    trainer.set_masks(masks, head.mask_scale)
    x, y = torch.randn(9, 7, dtype=torch.float64), torch.randint(0, 4, (9,))
    with torch.no_grad():
        logits, saved = trainer.forward(x)
    out = head(x)  # autograd through W ⊙ M / ρ
    torch.testing.assert_close(logits, out.detach(), rtol=0, atol=1e-12)
    loss = F.cross_entropy(out, y)
    expected = torch.autograd.grad(loss, [head.fc1.weight, head.fc2.weight, head.fc1.bias, head.fc2.bias])
    # ∂(mean CE)/∂logits = (softmax − onehot) / n, passed as its numerator with grad_scale = 1/n
    numerator = torch.softmax(logits, 1) - F.one_hot(y, 4).double()
    with torch.no_grad():
        grad = trainer.backward(saved, numerator, grad_scale=1 / 9)
    for got, want in zip(trainer.grad_views, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.all(grad[: masks[0].numel()][masks[0].flatten() == 0] == 0)


def test_flat_trainer_rejects_bad_arguments():
    head = MaskedBottleneckHead(4, 3, 2)
    with pytest.raises(TypeError, match="`head`"):
        FlatHeadTrainer(torch.nn.Linear(4, 2), lr=0.1)
    with pytest.raises(ValueError, match="`lr`"):
        FlatHeadTrainer(head, lr=0.0)
    with pytest.raises(ValueError, match="`momentum`"):
        FlatHeadTrainer(head, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="`weight_decay`"):
        FlatHeadTrainer(head, lr=0.1, weight_decay=-0.1)
