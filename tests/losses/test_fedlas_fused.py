"""FeDLaSLoss's fused autograd node against the paper's equations written out with plain autograd.

The reference below builds the loss from Eqs. 4 and 7-10 with ordinary torch operations: the gate's
two probabilities from a softmax (not the fused node's sign of o1 - o0), the straight-through sign as
``sign(t) + t - sg[t]`` (forward the sign, backward the identity), the smoothing term per variant, and
a boolean-indexed mean over kept rows. Autograd then gives the reference gradients for the logits and
for every gate parameter.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from hf_calibration.losses import FeDLaSLoss
from hf_calibration.losses.fedlas import BidirectionalCalibrationGate


def _reference(loss, logits, labels, features, num_items=None):
    g = loss.gate
    x = logits.detach().to(g.fc_in.weight.dtype)
    hidden = F.leaky_relu(x @ g.fc_in.weight.T + g.fc_in.bias, negative_slope=0.01)
    p = torch.softmax(hidden @ g.fc_out.weight.T + g.fc_out.bias, dim=-1)
    t = p[:, 1] - p[:, 0]
    # straight-through: forward the sign, backward ±identity (the gate descends the loss, or climbs it)
    step = (t - t.detach()) if loss.gate_update == "descent" else (t.detach() - t)
    psi = torch.where(t > 0, 1.0, -1.0).to(t.dtype) + step
    norms = features.detach().abs().flatten(1).sum(dim=1)
    gamma = (norms - loss.nci_mean) / (loss.nci_std + 1e-3)
    r = (loss.base * 2 * torch.sigmoid(loss.beta * psi * gamma)).to(logits.dtype)

    kept = labels != -100
    z, y = logits[kept], labels[kept]
    log_p = F.log_softmax(z, dim=-1)
    nll = -log_p[torch.arange(len(y)), y]
    if loss.variant == "ls":
        smooth = -log_p.mean(dim=-1)
    else:
        smooth = F.relu(z.max(dim=-1, keepdim=True).values - z - loss.margin).mean(dim=-1)
    per_sample = (1 - r[kept]) * nll + r[kept] * smooth
    return per_sample.sum() / (kept.sum() if num_items is None else num_items)


def _case(n=14, k=6, d=10, seed=0, ignored=(1, 8), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, k, generator=g, dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, k, (n,), generator=g)
    labels[list(ignored)] = -100
    features = torch.randn(n, d, generator=g) * torch.rand(n, 1, generator=g) * 4
    return logits, labels, features


def _loss(variant, dtype, seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs = {"beta": 2.0, "margin": 1.5, **kwargs}
    loss = FeDLaSLoss(6, variant, **kwargs).to(dtype).eval()
    # statistics near the features' L1 norms, so γ spreads over (-2, 2) and both signs of ψ·γ occur
    loss.nci_mean.fill_(12.0)
    loss.nci_std.fill_(8.0)
    return loss


def _grads(loss, logits, fn):
    loss.zero_grad()
    z = logits.clone().requires_grad_(True)
    value = fn(z)
    value.backward()
    return value.detach(), z.grad, [p.grad.clone() for p in loss.gate.parameters()]


@pytest.mark.parametrize("variant", ["ls", "mbls"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_items", [None, 17])
@pytest.mark.parametrize("gate_update", ["ascent", "descent"])
def test_values_and_gradients_match_the_reference(variant, dtype, num_items, gate_update):
    loss = _loss(variant, dtype, seed=1, gate_update=gate_update)
    logits, labels, features = _case(seed=2, dtype=dtype)
    features = features.to(dtype)
    fused = _grads(loss, logits, lambda z: loss(z, labels, features=features, num_items_in_batch=num_items))
    expected = _grads(loss, logits, lambda z: _reference(loss, z, labels, features, num_items))
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {"rtol": 2e-6, "atol": 1e-7}
    torch.testing.assert_close(fused[0], expected[0], **tol)
    torch.testing.assert_close(fused[1], expected[1], **tol)
    assert torch.all(fused[1][labels == -100] == 0)  # ignored rows get no gradient
    for got, want in zip(fused[2], expected[2]):
        assert want.abs().sum() > 0  # the straight-through sign lets the gate learn
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_training_mode_matches_the_reference_with_the_updated_statistics(variant):
    loss = _loss(variant, torch.float32, seed=3).train()
    logits, labels, features = _case(seed=4)
    fused = _grads(loss, logits, lambda z: loss(z, labels, features=features))
    # the forward above folded the batch into μ, σ first; the reference reads the updated buffers
    kept_norms = features.abs().sum(dim=1)[labels != -100].double()
    assert loss.nci_mean.item() == pytest.approx(0.95 * kept_norms.mean().item() + 0.05 * 12.0, rel=1e-6)
    assert loss.nci_std.item() == pytest.approx(0.95 * kept_norms.std().item() + 0.05 * 8.0, rel=1e-6)
    loss.eval()
    expected = _grads(loss, logits, lambda z: _reference(loss, z, labels, features))
    for got, want in zip([fused[0], fused[1], *fused[2]], [expected[0], expected[1], *expected[2]]):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_gradcheck_float64_with_active_margins(variant):
    loss = _loss(variant, torch.float64, seed=5, margin=1.0)
    logits, labels, features = _case(n=7, seed=6, ignored=(3,), dtype=torch.float64)
    features = features.double()
    z = logits.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: loss(x, labels, features=features), (z,))
    assert torch.autograd.gradcheck(lambda x: loss(x, labels, features=features, num_items_in_batch=11), (z,))


@pytest.mark.parametrize("variant", ["ls", "mbls"])
@pytest.mark.parametrize("gate_update", ["ascent", "descent"])
def test_fused_and_generic_autograd_paths_agree(variant, gate_update):
    """A gate of another class takes the base class's autograd path (per_sample_loss): same numbers."""

    class PlainGate(BidirectionalCalibrationGate):
        pass

    fused = _loss(variant, torch.float32, seed=7, gate_update=gate_update).train()
    generic = _loss(variant, torch.float32, seed=7, gate_update=gate_update).train()
    state = generic.gate.state_dict()
    generic.gate = PlainGate(6)
    generic.gate.load_state_dict(state)
    for step in range(2):
        logits, labels, features = _case(seed=8 + step)
        a = _grads(fused, logits, lambda z: fused(z, labels, features=features))
        b = _grads(generic, logits, lambda z: generic(z, labels, features=features))
        assert a[0].grad_fn is None and torch.equal(a[0], b[0])  # same operations in the same order
        torch.testing.assert_close(a[1], b[1])
        for got, want in zip(a[2], b[2]):
            torch.testing.assert_close(got, want)
        assert torch.equal(fused.nci_mean, generic.nci_mean) and torch.equal(fused.nci_std, generic.nci_std)
        assert torch.equal(fused.last_weights, generic.last_weights)
        assert torch.equal(fused.last_psi, generic.last_psi) and torch.equal(fused.last_nci, generic.last_nci)


def test_one_autograd_node_and_no_gradient_on_the_recorded_weights():
    loss = _loss("ls", torch.float32).train()
    logits, labels, features = _case(seed=10)
    value = loss(logits.requires_grad_(True), labels, features=features)
    assert type(value.grad_fn).__name__ == "FeDLaSFunctionBackward"
    assert not loss.last_weights.requires_grad and loss.last_weights.dtype == torch.float32
    assert loss.last_psi.dtype == torch.float32 and set(loss.last_psi.tolist()) <= {-1.0, 1.0}


def test_float64_gate_gives_float64_psi():
    loss = _loss("ls", torch.float64).train()
    logits, labels, features = _case(seed=11, dtype=torch.float64)
    loss(logits, labels, features=features.double())
    assert loss.last_psi.dtype == torch.float64 and loss.last_weights.dtype == torch.float64


def test_no_grad_forward_builds_no_graph():
    loss = _loss("mbls", torch.float32)
    logits, labels, features = _case(seed=12)
    with torch.no_grad():
        value = loss(logits.requires_grad_(True), labels, features=features)
    assert value.grad_fn is None
    torch.testing.assert_close(value, _reference(loss, logits.detach(), labels, features))


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_bf16_autocast(variant):
    """Under autocast the logits come in bfloat16 and the loss is computed in float32, like the other losses."""
    loss = _loss(variant, torch.float32, seed=13)
    logits, labels, features = _case(seed=14)
    layer = torch.nn.Linear(6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(logits)
        assert out.dtype == torch.bfloat16
        value = loss(out, labels, features=features)
    assert value.dtype == torch.float32
    value.backward()
    gate_grads = [p.grad.clone() for p in loss.gate.parameters()]
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in gate_grads)
    # reference on the same bfloat16 logits, with the gate in float32 (autocast runs it in bfloat16, so
    # the gate's outputs and its gradients agree to bfloat16 precision only)
    loss.zero_grad()
    z = out.detach().float().requires_grad_(True)
    expected = _reference(loss, z, labels, features)
    expected.backward()
    torch.testing.assert_close(value, expected.detach(), rtol=1e-5, atol=1e-6)
    # bias gradients are sums that cancel: tolerance on the scale of the largest gate gradient
    scale = max(p.grad.abs().max().item() for p in loss.gate.parameters())
    for got, want in zip(gate_grads, [p.grad for p in loss.gate.parameters()]):
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * scale)


def test_all_ignored_batch_gives_zero_and_zero_gradients():
    loss = _loss("ls", torch.float32).train()
    logits, _, features = _case(seed=15)
    labels = torch.full((logits.shape[0],), -100)
    value, grad, gate_grads = _grads(loss, logits, lambda z: loss(z, labels, features=features))
    assert value.item() == 0.0 and torch.all(grad == 0)
    assert all(torch.all(g == 0) for g in gate_grads)
    assert loss.nci_mean.item() == 12.0 and loss.nci_std.item() == 8.0  # nothing kept: EMA unchanged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_cuda_matches_cpu(variant):
    logits, labels, features = _case(seed=16)
    cpu = _loss(variant, torch.float32, seed=17)
    cuda = _loss(variant, torch.float32, seed=17).cuda()
    a = _grads(cpu, logits, lambda z: cpu(z, labels, features=features))
    b = _grads(cuda, logits.cuda(), lambda z: cuda(z, labels.cuda(), features=features.cuda()))
    for got, want in zip([b[0], b[1], *b[2]], [a[0], a[1], *a[2]]):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    assert math.isfinite(b[0].item())


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_ascent_negates_the_gates_gradient_and_nothing_else(variant):
    logits, labels, features = _case(seed=12)
    up, down = (_loss(variant, torch.float32, seed=9, gate_update=g) for g in ("ascent", "descent"))
    a = _grads(up, logits, lambda z: up(z, labels, features=features))
    d = _grads(down, logits, lambda z: down(z, labels, features=features))
    assert torch.equal(a[0], d[0]) and torch.equal(a[1], d[1])  # same loss, same gradient for the model
    for got, want in zip(a[2], d[2]):
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, -want, rtol=0, atol=0)
