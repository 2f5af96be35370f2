"""FeDLaS: NCI statistics, BCG gate with straight-through sign, per-sample weights, reductions, multi-process sync."""

import math

import _loss_reference as ref
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_calibration.losses import FeDLaSLoss, LabelSmoothingLoss, get_loss
from hf_calibration.losses.cross_entropy import nll_per_sample
from hf_calibration.losses.label_smoothing import label_smoothing_per_sample
from hf_calibration.losses.margin import margin_penalty_per_sample

LN2, LN3 = math.log(2), math.log(3)
HAND_LOGITS = torch.tensor([[0.0, 0.0, 0.0], [LN2, 0.0, 0.0], [math.log(6), LN3, 0.0]], dtype=torch.float64)
HAND_LABELS = torch.tensor([0, 1, 0])
HAND_CE = [LN3, math.log(4), math.log(10 / 6)]  # -log p_y with p = (1/3,1/3,1/3), (2,1,1)/4, (6,3,1)/10
HAND_UNIFORM = [LN3, 5 * LN2 / 3, (math.log(10 / 6) + math.log(10 / 3) + math.log(10)) / 3]
HAND_FEATURES = torch.tensor([[1.0, -1.0], [3.0, 0.0], [0.0, -4.0]])  # L1 norms 2, 3, 4: mean 3, unbiased std 1


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def _hand_gate(loss):
    """Gate with ψ_i = sign(z_i0 - 0.5): fc_in picks z_0 (hidden size K//2 = 1), fc_out gives o1 - o0 = h - 0.5."""
    with torch.no_grad():
        loss.gate.fc_in.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        loss.gate.fc_in.bias.zero_()
        loss.gate.fc_out.weight.copy_(torch.tensor([[0.0], [1.0]]))
        loss.gate.fc_out.bias.copy_(torch.tensor([0.0, -0.5]))
    return loss  # on HAND_LOGITS: z_0 = 0, ln 2, ln 6 → ψ = (-1, +1, +1)


def _gate_weights(loss):
    g = loss.gate
    return tuple(p.detach().double().numpy() for p in (g.fc_in.weight, g.fc_in.bias, g.fc_out.weight, g.fc_out.bias))


def _random_case(n=20, k=6, d=12, seed=0, ignored=(2, 9)):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, k, generator=g, dtype=torch.float64)
    labels = torch.randint(0, k, (n,), generator=g)
    labels[list(ignored)] = -100
    features = torch.randn(n, d, generator=g) * torch.rand(n, 1, generator=g) * 4
    return logits, labels, features


# -- hand-worked 3-sample values ---------------------------------------------------------------
def test_fedlas_ls_hand_training_theta_one():
    loss = _hand_gate(FeDLaSLoss(3, "ls", base=0.1, beta=2.0, theta=1.0))
    value = loss(HAND_LOGITS, HAND_LABELS, features=HAND_FEATURES)
    # θ = 1: μ = 3, σ = 1 → γ = (-1, 0, 1)/1.001; ψ = (-1, +1, +1) → ψγ = (1, 0, 1)/1.001
    # r = 0.1·2σ(2ψγ) = (0.2σ(2/1.001), 0.1, 0.2σ(2/1.001))
    r_hi = 0.2 * _sigmoid(2 / 1.001)
    r = [r_hi, 0.1, r_hi]
    expected = sum((1 - ri) * c + ri * u for ri, c, u in zip(r, HAND_CE, HAND_UNIFORM)) / 3
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert loss.nci_mean.item() == pytest.approx(3.0) and loss.nci_std.item() == pytest.approx(1.0)
    np.testing.assert_allclose(loss.last_weights.numpy(), r, rtol=1e-6)
    assert loss.last_psi.tolist() == [-1.0, 1.0, 1.0]


def test_fedlas_mbls_hand_eval_with_set_statistics():
    loss = _hand_gate(FeDLaSLoss(3, "mbls", base=0.1, beta=2.0, margin=0.5)).eval()
    loss.nci_mean.fill_(3.0)
    loss.nci_std.fill_(1.0)
    value = loss(HAND_LOGITS, HAND_LABELS, features=HAND_FEATURES)
    # same r as above; R_i = mean_k relu(max_j z_j - z_k - 0.5) = (0, 2(ln2 - .5)/3, (ln2 + ln6 - 1)/3)
    r_hi = 0.2 * _sigmoid(2 / 1.001)
    r = [r_hi, 0.1, r_hi]
    penalties = [0.0, 2 * (LN2 - 0.5) / 3, (LN2 + math.log(6) - 1.0) / 3]
    expected = sum((1 - ri) * c + ri * p for ri, c, p in zip(r, HAND_CE, penalties)) / 3
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert loss.nci_mean.item() == 3.0 and loss.nci_std.item() == 1.0  # eval: untouched


def test_ema_update_hand():
    loss = FeDLaSLoss(3, theta=0.5)  # init μ = 20, σ = 100
    loss(HAND_LOGITS, HAND_LABELS, features=HAND_FEATURES)
    # μ = 0.5·3 + 0.5·20 = 11.5; σ = 0.5·1 + 0.5·100 = 50.5
    assert loss.nci_mean.item() == pytest.approx(11.5) and loss.nci_std.item() == pytest.approx(50.5)
    # γ uses the updated statistics: (‖f‖₁ - 11.5)/(50.5 + 0.001)
    np.testing.assert_allclose(loss.last_nci.numpy(), (np.array([2.0, 3.0, 4.0]) - 11.5) / 50.501, rtol=1e-6)
    # second batch: only sample 0 and 2 kept (norms 2 and 4): mean 3, std √2
    loss(HAND_LOGITS, torch.tensor([0, -100, 0]), features=HAND_FEATURES)
    assert loss.nci_mean.item() == pytest.approx(0.5 * 3 + 0.5 * 11.5)
    assert loss.nci_std.item() == pytest.approx(0.5 * math.sqrt(2) + 0.5 * 50.5)


def test_ema_with_fewer_than_two_kept_samples():
    loss = FeDLaSLoss(3, theta=0.5)
    loss(HAND_LOGITS, torch.tensor([-100, -100, -100]), features=HAND_FEATURES)  # nothing kept: no move
    assert loss.nci_mean.item() == 20.0 and loss.nci_std.item() == 100.0
    loss(HAND_LOGITS, torch.tensor([-100, 2, -100]), features=HAND_FEATURES)  # one kept: μ moves, σ undefined
    assert loss.nci_mean.item() == pytest.approx(0.5 * 3 + 0.5 * 20) and loss.nci_std.item() == 100.0
    assert torch.isfinite(loss.nci_mean) and torch.isfinite(loss.nci_std)


# -- float64 reference loop over several training steps ---------------------------------------------
@pytest.mark.parametrize("variant, base, beta", [("ls", 0.05, 4.0), ("mbls", 0.1, 0.5), ("ls", 0.2, 1.0)])
def test_against_reference_loop(variant, base, beta):
    torch.manual_seed(0)
    theta = 0.7
    loss = FeDLaSLoss(6, variant, base=base, beta=beta, margin=2.0, theta=theta)
    mu, sigma = 20.0, 100.0
    for step in range(3):
        logits, labels, features = _random_case(seed=step)
        kept_norms = [float(v) for v, y in zip(features.abs().sum(1).double(), labels) if y != -100]
        bm, bs = ref.batch_stats(kept_norms)
        mu, sigma = theta * bm + (1 - theta) * mu, theta * bs + (1 - theta) * sigma
        expected, weights = ref.fedlas(
            logits.tolist(),
            labels.tolist(),
            features.double().tolist(),
            variant,
            base,
            beta,
            2.0,
            mu,
            sigma,
            _gate_weights(loss),
        )
        got = loss(logits, labels, features=features)
        assert got.item() == pytest.approx(expected, rel=1e-6)
        np.testing.assert_allclose(loss.last_weights.numpy(), weights, rtol=1e-6)
        assert loss.nci_mean.item() == pytest.approx(mu, rel=1e-6)
        assert loss.nci_std.item() == pytest.approx(sigma, rel=1e-6)


# -- gate, STE, bounds ---------------------------------------------------------------------------
def test_psi_is_plus_minus_one_and_weights_in_open_interval():
    torch.manual_seed(1)
    loss = FeDLaSLoss(6, "ls", base=0.05, beta=4.0, theta=0.5)
    for step in range(4):
        logits, labels, features = _random_case(n=64, seed=10 + step)
        loss(logits.float(), labels, features=features)
        psi, w = loss.last_psi, loss.last_weights
        assert set(psi.unique().tolist()) <= {-1.0, 1.0}
        assert torch.all(w > 0) and torch.all(w < 2 * 0.05)


def test_straight_through_estimator_trains_the_gate():
    torch.manual_seed(2)
    logits, labels, features = _random_case(seed=3)
    logits = logits.float().requires_grad_(True)
    loss = FeDLaSLoss(6, "ls", base=0.1, beta=1.0, theta=0.5, gate_update="descent")
    loss(logits, labels, features=features).backward()
    gate_grads = [p.grad.clone() for p in loss.gate.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in gate_grads)

    # independent: dL/dψ with ψ a leaf, then push it through d(p1 - p0)/dθ as the identity-STE prescribes
    gamma, psi = loss.last_nci, loss.last_psi.clone().requires_grad_(True)
    kept = labels != -100
    r = 0.1 * 2 * torch.sigmoid(1.0 * psi * gamma)
    per_sample = label_smoothing_per_sample(F.log_softmax(logits.detach(), -1), labels.clamp_min(0), r)
    (per_sample[kept].sum() / kept.sum()).backward()
    loss.gate.zero_grad()
    (psi.grad * loss.gate.direction(logits)).sum().backward()
    for got, expected in zip(gate_grads, [p.grad for p in loss.gate.parameters()]):
        torch.testing.assert_close(got, expected)


def test_gate_sends_no_gradient_to_the_logits():
    logits, labels, features = _random_case(seed=4)
    z = logits.float().requires_grad_(True)
    loss = FeDLaSLoss(6, "ls", base=0.1, beta=2.0)
    loss(z, labels, features=features).backward()
    # same loss with the weights frozen as constants: the logits' gradient must not change
    z2 = logits.float().requires_grad_(True)
    kept = labels != -100
    per_sample = label_smoothing_per_sample(F.log_softmax(z2, -1), labels.clamp_min(0), loss.last_weights)
    (per_sample[kept].sum() / kept.sum()).backward()
    torch.testing.assert_close(z.grad, z2.grad)


def test_features_receive_no_gradient():
    logits, labels, features = _random_case(seed=5)
    features.requires_grad_(True)
    FeDLaSLoss(6)(logits.float().requires_grad_(True), labels, features=features).backward()
    assert features.grad is None


def test_eval_does_not_move_statistics_or_record_weights():
    loss = FeDLaSLoss(6).eval()
    logits, labels, features = _random_case(seed=6)
    state = {k: v.clone() for k, v in loss.state_dict().items()}
    loss(logits, labels, features=features)
    for k, v in loss.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert loss.last_weights is None


# -- exact reductions to the base losses -----------------------------------------------------------
def test_beta_zero_ls_is_label_smoothing_exactly():
    logits, labels, features = _random_case(seed=7)
    logits = logits.float()
    for alpha in (0.05, 0.1, 0.3):
        fed = FeDLaSLoss(6, "ls", base=alpha, beta=0.0)
        assert torch.equal(fed(logits, labels, features=features), LabelSmoothingLoss(alpha)(logits, labels))


def test_beta_zero_mbls_is_the_convex_combination_exactly():
    logits, labels, features = _random_case(seed=8)
    logits = logits.float()
    fed = FeDLaSLoss(6, "mbls", base=0.1, beta=0.0, margin=2.0)
    got = fed.per_sample_loss(logits, labels.clamp_min(0), labels != -100, features)
    lam = torch.tensor(0.1)
    expected = (1 - lam) * nll_per_sample(
        F.log_softmax(logits, -1), labels.clamp_min(0)
    ) + lam * margin_penalty_per_sample(logits, 2.0)
    assert torch.equal(got, expected)


def test_gradcheck_with_frozen_statistics():
    logits, labels, features = _random_case(n=6, seed=9, ignored=(1,))
    for variant in ("ls", "mbls"):
        loss = FeDLaSLoss(6, variant, beta=2.0, margin=100.0 if variant == "mbls" else 6.0).eval()
        z = logits.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda x: loss(x, labels, features=features), (z,))


# -- num_items_in_batch, masking, calling conventions -------------------------------------------------
@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_gradient_accumulation_invariance(variant):
    logits, labels, features = _random_case(n=16, seed=11, ignored=(0, 5, 13))
    count = int((labels != -100).sum())
    loss = FeDLaSLoss(6, variant, beta=2.0, margin=2.0).eval()  # frozen statistics: micro-batches see the same μ, σ

    def grads(fn):
        loss.zero_grad()
        z = logits.clone().requires_grad_(True)
        value = fn(z)
        value.backward()
        return value, z.grad, [p.grad.clone() for p in loss.parameters()]

    full = grads(lambda z: loss(z, labels, features=features))
    split = grads(
        lambda z: (
            loss(z[:8], labels[:8], features=features[:8], num_items_in_batch=count)
            + loss(z[8:], labels[8:], features=features[8:], num_items_in_batch=count)
        )
    )
    torch.testing.assert_close(split[0], full[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(split[1], full[1], rtol=1e-12, atol=1e-15)
    for a, b in zip(split[2], full[2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_ignored_rows_are_left_out_of_loss_and_statistics():
    logits, labels, features = _random_case(seed=12, ignored=(3, 4))
    kept = labels != -100
    a, b = FeDLaSLoss(6, theta=0.5), FeDLaSLoss(6, theta=0.5)
    b.load_state_dict(a.state_dict())
    poisoned = features.clone()
    poisoned[~kept] = 1e6
    va = a(logits, labels, features=poisoned)
    vb = b(logits[kept], labels[kept], features=features[kept])
    torch.testing.assert_close(va, vb)
    torch.testing.assert_close(a.nci_mean, b.nci_mean)
    torch.testing.assert_close(a.nci_std, b.nci_std)


def test_trainer_calling_convention_and_state_dict_round_trip():
    from transformers.modeling_outputs import ImageClassifierOutput

    logits, labels, features = _random_case(seed=13)
    loss = get_loss("fedlas_mbls", num_classes=6, theta=0.5)
    assert loss.requires_features and loss.variant == "mbls" and loss.beta == 0.5 and loss.base == 0.1
    loss(ImageClassifierOutput(logits=logits), labels, num_items_in_batch=None, features=features)
    state = loss.state_dict()
    assert {"nci_mean", "nci_std"} <= set(state) and any(k.startswith("gate.") for k in state)
    fresh = get_loss("fedlas_mbls", num_classes=6, theta=0.5)
    fresh.load_state_dict(state)
    fresh.eval(), loss.eval()
    assert torch.equal(fresh(logits, labels, features=features), loss(logits, labels, features=features))


# -- bad input -----------------------------------------------------------------------------------
def test_missing_features_points_to_calibration_trainer():
    logits, labels, _ = _random_case()
    with pytest.raises(ValueError, match="CalibrationTrainer"):
        FeDLaSLoss(6)(logits, labels)


def test_bad_tensors():
    logits, labels, features = _random_case()
    loss = FeDLaSLoss(6)
    with pytest.raises(ValueError, match="`features`.*same batch size"):
        loss(logits, labels, features=features[:-1])
    with pytest.raises(ValueError, match="`features`.*shape"):
        loss(logits, labels, features=features[:, 0])
    with pytest.raises(TypeError, match="`features`"):
        loss(logits, labels, features=features.tolist())
    with pytest.raises(ValueError, match="num_classes = 6"):
        loss(logits[:, :5], labels.clamp_max(4), features=features)
    with pytest.raises(TypeError, match="`labels`"):
        loss(logits, labels.float(), features=features)
    with pytest.raises(ValueError, match="found 6"):
        loss(logits, labels.clamp_max(6) + (labels == 5).long(), features=features)


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"base": -0.1}, "base"),
        ({"variant": "ls", "base": 1.5}, "base"),
        ({"beta": -1.0}, "beta"),
        ({"theta": 0.0}, "theta"),
        ({"theta": 1.5}, "theta"),
        ({"margin": -1.0}, "margin"),
        ({"variant": "focal"}, "variant"),
        ({"nci_init_std": -1.0}, "nci_init_std"),
        ({"num_classes": 1}, "num_classes"),
    ],
)
def test_bad_hyperparameters(kwargs, arg):
    kwargs = {"num_classes": 6, **kwargs}
    with pytest.raises(ValueError, match=f"`{arg}`"):
        FeDLaSLoss(**kwargs)


def test_registry():
    with pytest.raises(ValueError, match="`name`.*fedlas_ls"):
        get_loss("fedlass")
    with pytest.raises(TypeError, match="variant"):
        get_loss("fedlas_ls", num_classes=4, variant="mbls")
    assert get_loss("FeDLaS-LS", num_classes=4).variant == "ls"
    assert get_loss("ls", alpha=0.2).alpha == 0.2


# -- several processes: the statistics are reduced across ranks -----------------------------------------
def test_statistics_are_reduced_across_processes(monkeypatch):
    """Two ranks simulated in one process: torch.distributed's all_reduce adds the other rank's moments.

    (A real two-process run with CalibrationTrainer is tested with the trainer; forking workers from
    a test process that already used OpenMP can hang, and spawning them costs a minute of imports.)
    """
    from hf_calibration.losses.fedlas import batch_moments, l1_norms

    dist = torch.distributed
    logits, labels, features = _random_case(n=20, seed=0)
    halves = [slice(0, 10), slice(10, 20)]
    moments = [batch_moments(l1_norms(features[h]), labels[h] != -100) for h in halves]
    calls = []

    def fake_all_reduce(tensor, op=None):
        calls.append(op)
        tensor.copy_(moments[0] + moments[1])  # what the sum over both ranks gives

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    ranks = []
    for h in halves:
        torch.manual_seed(0)
        loss = FeDLaSLoss(6, theta=0.5)
        loss(logits[h], labels[h], features=features[h])
        ranks.append(loss)
    assert calls == [dist.ReduceOp.SUM, dist.ReduceOp.SUM]
    assert torch.equal(ranks[0].nci_mean, ranks[1].nci_mean) and torch.equal(ranks[0].nci_std, ranks[1].nci_std)
    monkeypatch.undo()

    single = FeDLaSLoss(6, theta=0.5)  # one process, whole batch
    single(logits, labels, features=features)
    torch.testing.assert_close(ranks[0].nci_mean, single.nci_mean)
    torch.testing.assert_close(ranks[0].nci_std, single.nci_std)
    # eval mode never communicates
    ranks[0].eval()(logits[:10], labels[:10], features=features[:10])


# -- non-finite features (an fp16 overflow upstream) --------------------------------------------------
def _ls_by_hand(logits, labels, r):
    """FeDLaS-LS per Eq. 4 in float64 from the weights r: mean_i[(1 - r_i)·CE_i + r_i·mean_k(-log p_ik)]."""
    log_p = torch.log_softmax(logits.double(), dim=1)
    ce = -log_p[torch.arange(len(labels)), labels]
    return ((1 - r) * ce + r * (-log_p.mean(dim=1))).mean()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_feature_row_leaves_the_statistics_and_the_other_rows_alone(bad, caplog):
    logits, labels, features = _random_case(seed=21, ignored=())
    poisoned = features.clone()
    poisoned[5, 3] = bad
    loss = FeDLaSLoss(6, theta=0.5, beta=4.0, base=0.1)
    z = logits.clone().requires_grad_(True)
    with caplog.at_level("WARNING", logger="hf_calibration.losses.fedlas"):
        value = loss(z, labels, features=poisoned)
    # statistics by hand from the 19 finite rows: μ ← θ·mean + (1-θ)·20, σ ← θ·std(ddof=1) + (1-θ)·100
    norms = features.abs().sum(1).double().numpy()
    finite = np.arange(20) != 5
    mean = 0.5 * norms[finite].mean() + 0.5 * 20.0
    std = 0.5 * norms[finite].std(ddof=1) + 0.5 * 100.0
    assert loss.nci_mean.item() == pytest.approx(mean, rel=1e-6)
    assert loss.nci_std.item() == pytest.approx(std, rel=1e-6)
    # the loss: γ_i by hand for the finite rows, γ = 0 (r = base) for the bad one; ψ from the gate's sign
    gamma = torch.from_numpy((norms - mean) / (std + 1e-3))
    gamma[5] = 0.0
    with torch.no_grad():
        g = loss.gate
        d = g.fc_out(F.leaky_relu(g.fc_in(logits.float()), 0.01))
    psi = torch.where(d[:, 1] > d[:, 0], 1.0, -1.0).double()
    r = 0.1 * 2 * torch.sigmoid(4.0 * psi * gamma)
    assert value.item() == pytest.approx(_ls_by_hand(logits, labels, r).item(), rel=1e-6)
    value.backward()
    assert torch.isfinite(z.grad).all()
    # counted and reported once; the buffers (what checkpoints hold) are finite
    assert loss.nonfinite_feature_rows == 1
    assert len([r for r in caplog.records if "non-finite features" in r.getMessage()]) == 1
    assert all(torch.isfinite(v).all() for v in loss.state_dict().values())


def test_non_finite_rows_are_counted_and_warned_about_once(caplog):
    logits, labels, features = _random_case(seed=22, ignored=(0,))
    poisoned = features.clone()
    poisoned[[0, 3, 4]] = float("inf")  # row 0 is ignored: not counted
    loss = FeDLaSLoss(6)
    with caplog.at_level("WARNING", logger="hf_calibration.losses.fedlas"):
        for _ in range(3):
            assert torch.isfinite(loss(logits, labels, features=poisoned))
        loss.eval()
        assert torch.isfinite(loss(logits, labels, features=poisoned))  # eval: stored statistics, same rule
    assert loss.nonfinite_feature_rows == 8
    assert len([r for r in caplog.records if "non-finite features" in r.getMessage()]) == 1
    assert torch.isfinite(loss.nci_mean) and torch.isfinite(loss.nci_std)


def test_the_unfused_reference_treats_non_finite_rows_the_same():
    logits, labels, features = _random_case(seed=23)
    poisoned = features.clone()
    poisoned[7] = float("nan")
    fused, unfused = FeDLaSLoss(6, seed=1, theta=0.5), FeDLaSLoss(6, seed=1, theta=0.5)
    a = fused(logits, labels, features=poisoned)
    b = super(FeDLaSLoss, unfused).forward(logits, labels, features=poisoned)  # plain autograd through per_sample_loss
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(fused.nci_mean, unfused.nci_mean)
    assert unfused.nonfinite_feature_rows == 1


# -- the gate: seeded, built later -------------------------------------------------------------------
def test_a_seeded_gate_is_nn_linears_own_initialisation_from_that_seed():
    from hf_calibration.losses.fedlas import BidirectionalCalibrationGate

    torch.manual_seed(5)
    reference = BidirectionalCalibrationGate(10)  # nn.Linear's default init from the global RNG seeded with 5
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)  # whatever the global RNG holds, the seeded gate is the same
        loss = FeDLaSLoss(10, seed=5)
        for (name, p), q in zip(loss.gate.named_parameters(), reference.parameters()):
            assert torch.equal(p, q), name
    assert not loss.gate_from_global_rng
    unseeded = FeDLaSLoss(10)
    assert unseeded.gate_from_global_rng
    unseeded.reset_gate(5)
    assert all(torch.equal(p, q) for p, q in zip(unseeded.gate.parameters(), reference.parameters()))
    assert not unseeded.gate_from_global_rng


def test_training_or_loading_the_gate_marks_it_as_not_fresh():
    logits, labels, features = _random_case()
    trained = FeDLaSLoss(6)
    trained(logits, labels, features=features)
    assert not trained.gate_from_global_rng
    loaded = FeDLaSLoss(6)
    loaded.load_state_dict(trained.state_dict())
    assert not loaded.gate_from_global_rng
    evaluated = FeDLaSLoss(6).eval()
    evaluated(logits, labels, features=features)
    assert evaluated.gate_from_global_rng  # eval does not change the gate


def test_num_classes_can_be_given_later():
    logits, labels, features = _random_case()
    loss = FeDLaSLoss(seed=2)
    assert loss.gate is None and loss.num_classes is None
    with pytest.raises(ValueError, match="`num_classes`.*CalibrationTrainer"):
        loss(logits, labels, features=features)
    loss.set_num_classes(6)
    loss.set_num_classes(6)  # the same K again: nothing changes
    expected = FeDLaSLoss(6, seed=2)
    assert all(torch.equal(p, q) for p, q in zip(loss.gate.parameters(), expected.gate.parameters()))
    assert torch.equal(loss(logits, labels, features=features), expected(logits, labels, features=features))
    with pytest.raises(ValueError, match="`num_classes`.*6.*5"):
        loss.set_num_classes(5)
    assert get_loss("fedlas_mbls").num_classes is None


def test_num_items_in_batch_is_checked_with_the_features():
    logits, labels, features = _random_case(ignored=())
    for count in (0, -1, torch.tensor(float("nan"))):
        with pytest.raises(ValueError, match="`num_items_in_batch`"):
            FeDLaSLoss(6)(logits, labels, features=features, num_items_in_batch=count)


def test_a_fedlas_class_called_as_compute_loss_func_says_to_use_calibration_trainer():
    """An instance in the plain `Trainer` would stop at the first step for want of features: the message says where
    FeDLaS runs instead of suggesting `compute_loss_func=FeDLaSLoss()`."""
    from transformers.modeling_outputs import ImageClassifierOutput

    logits, labels, _ = _random_case()
    with pytest.raises(
        TypeError,
        match=r"^FeDLaSLoss is a loss class that needs the classifier's features.*"
        r"`hf_calibration\.CalibrationTrainer\(\.\.\., compute_loss=FeDLaSLoss\)`\.$",
    ):
        FeDLaSLoss(ImageClassifierOutput(logits=logits), labels, num_items_in_batch=3)


@pytest.mark.parametrize("variant", ["ls", "mbls"])
def test_confident_rows_give_finite_gradients(variant):
    z = torch.tensor([[80.0, 0.0, -5.0, 1.0], [0.0, 120.0, 3.0, 2.0]], requires_grad=True)
    loss = FeDLaSLoss(4, variant=variant, seed=0)
    loss(z, torch.tensor([0, 1]), features=torch.randn(2, 5)).backward()
    assert torch.isfinite(z.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in loss.gate.parameters())


@pytest.mark.parametrize("gate_update", ["descent", "ascent"])
def test_a_descending_gate_turns_smoothing_down_on_fitted_samples_an_ascending_one_up(gate_update):
    """Why the default gate climbs the loss: on samples the model fits, ∂L/∂r = mean_k(-log p_k) - CE > 0, so a
    gate trained to lower the loss lowers r below α, whatever the sign of γ; climbing it raises r above α."""
    g = torch.Generator().manual_seed(0)
    n, k = 256, 6
    labels = torch.randint(0, k, (n,), generator=g)
    c = 2 + 8 * torch.rand(n, 1, generator=g)  # how confidently each sample is fitted (all of them are)
    logits = torch.randn(n, k, generator=g) + c * F.one_hot(labels, k)
    features = torch.rand(n, 8, generator=g) * c  # the feature norm grows with the confidence: γ of both signs
    loss = FeDLaSLoss(k, "ls", base=0.05, beta=4.0, gate_update=gate_update, seed=0).eval()
    norms = features.abs().sum(1)
    loss.nci_mean.fill_(norms.mean().item())
    loss.nci_std.fill_(norms.std().item())
    mask = torch.ones(n, dtype=torch.bool)
    opt = torch.optim.SGD(loss.gate.parameters(), lr=5.0)
    for _ in range(300):  # only the gate learns; logits and features stay as they are
        opt.zero_grad()
        loss(logits, labels, features=features).backward()
        opt.step()
    after = loss.smoothing_weights(logits, features, mask).detach()
    psi = torch.where(loss.gate.direction(logits) > 0, 1.0, -1.0)
    gamma = (norms - loss.nci_mean) / (loss.nci_std + 1e-3)
    agreement = (psi * torch.sign(gamma)).mean().item()  # +1: ψ = sign(γ) everywhere, -1: ψ = -sign(γ)
    if gate_update == "descent":  # ψ = -sign(γ): r = 2α·σ(-β|γ|) < α
        assert after.mean().item() < 0.7 * 0.05 and agreement < -0.4
    else:  # ψ = sign(γ): r = 2α·σ(β|γ|) > α
        assert after.mean().item() > 1.3 * 0.05 and agreement > 0.4
