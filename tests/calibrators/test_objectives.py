"""Fit objectives against hand-computed values and independent references; the tabulated path against the exact softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_calibration.calibrators._machinery.fitting.partition import LogPartitionTable
from hf_calibration.calibrators._machinery.fitting.smart_step import OBJECTIVE_CODES, smart_loss_grad, workspace
from hf_calibration.calibrators.objectives import (
    brier,
    charbonnier_soft_ece,
    get_objective,
    nll,
    scaled_stats,
    soft_ece,
)

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


def _soft_bins_numpy(p, a, n_bins=15, sigma=0.05):
    """Straight transcription of the SoftECE definition, float64 numpy, loops over bins."""
    centres = np.array([(2 * b - 1) / (2 * n_bins) for b in range(1, n_bins + 1)])
    w = np.exp(-((p[:, None] - centres[None]) ** 2) / (2 * sigma**2))
    w /= w.sum(axis=1, keepdims=True)
    out = []
    for b in range(n_bins):
        n_b = w[:, b].sum()
        acc = (w[:, b] * a).sum() / n_b
        conf = (w[:, b] * p).sum() / n_b
        out.append((n_b / len(p), acc - conf))
    return out


def _case(seed=0, n=40, k=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g, dtype=torch.float64) * 2, torch.randint(0, k, (n,), generator=g)


def test_nll_is_cross_entropy():
    z, y = _case()
    assert nll(z, y).item() == pytest.approx(F.cross_entropy(z, y).item(), rel=1e-12)


def test_brier_by_hand():
    z, y = _case(1)
    p = torch.softmax(z, 1).numpy()
    onehot = np.eye(z.shape[1])[y.numpy()]
    assert brier(z, y).item() == pytest.approx(((p - onehot) ** 2).sum(1).mean(), rel=1e-12)


def test_soft_ece_and_charbonnier_by_hand():
    z, y = _case(2)
    p = torch.softmax(z, 1).max(1).values.numpy()
    a = (z.argmax(1) == y).double().numpy()
    bins = _soft_bins_numpy(p, a)
    assert soft_ece(z, y).item() == pytest.approx(sum(m * abs(g) for m, g in bins), rel=1e-10)
    delta = 1e-3
    expected = sum(m * (np.sqrt(g * g + delta * delta) - delta) for m, g in bins)
    assert charbonnier_soft_ece(z, y).item() == pytest.approx(expected, rel=1e-10)
    # Charbonnier never exceeds |.| (phi_delta(r) - delta <= |r|) and tends to it as delta -> 0
    assert charbonnier_soft_ece(z, y).item() <= soft_ece(z, y).item()
    assert charbonnier_soft_ece(z, y, delta=1e-9).item() == pytest.approx(soft_ece(z, y).item(), rel=1e-6)


def test_one_sample_two_classes_hand_worked():
    # z = (log 3, 0): p = 0.75, correct. With one bin every weight is 1: SoftECE = |1 - 0.75|.
    z = torch.tensor([[np.log(3.0), 0.0]], dtype=torch.float64)
    y = torch.tensor([0])
    assert soft_ece(z, y, n_bins=1).item() == pytest.approx(0.25)
    assert nll(z, y).item() == pytest.approx(-np.log(0.75))
    assert brier(z, y).item() == pytest.approx(0.25**2 + 0.25**2)


def test_objectives_are_differentiable():
    z, y = _case(3)
    z.requires_grad_(True)
    for fn in (nll, brier, soft_ece, charbonnier_soft_ece):
        (g,) = torch.autograd.grad(fn(z, y), z)
        assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_bad_objective_name_and_options():
    with pytest.raises(ValueError, match="objective"):
        get_objective("ece")
    z, y = _case()
    with pytest.raises(ValueError, match="sigma"):
        soft_ece(z, y, sigma=0.0)
    with pytest.raises(ValueError, match="n_bins"):
        soft_ece(z, y, n_bins=0)


@pytest.mark.parametrize("k", [2, 10, 300])
def test_table_matches_exact_softmax(k):
    g = torch.Generator().manual_seed(k)
    n = 64
    y = torch.randint(0, k, (n,), generator=g)
    z = (torch.randn(n, k, generator=g) * 3 + 8 * F.one_hot(y, k) * torch.rand(n, 1, generator=g)).float()
    z[0, 1] = z[0].max()  # a tie for the top
    table = LogPartitionTable(z.numpy(), y.numpy())
    for temp in (0.05, 0.1, 0.3, 1.0, 2.5, 7.0, 40.0, 200.0, 1000.0):
        tol = 1e-4 if temp <= 256 else 2e-3  # above T = 256 (the grid's end): first-order extrapolation in 1/T
        exact = scaled_stats(z.double() / temp, y)
        approx = table.stats(torch.tensor(1.0 / temp, dtype=torch.float64), sum_p_sq=True)
        assert torch.equal(approx.correct, exact.correct)
        for field in ("log_confidence", "log_p_true", "sum_p_sq"):
            a, e = getattr(approx, field), getattr(exact, field)
            if field == "sum_p_sq":
                a, e = torch.log(a), torch.log(e)
            assert torch.allclose(a, e, atol=tol, rtol=0), (temp, field, (a - e).abs().max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("beta", [0.01, 0.7, 3.0, 40.0])
def test_scaled_nll_is_cross_entropy_of_scaled_logits_and_its_derivative(dtype, beta):
    from hf_calibration.calibrators._machinery.fitting.partition import scaled_nll

    rng = np.random.default_rng(2)
    z = (rng.normal(size=(257, 13)) * 4).astype(dtype)
    z[0, :3] = z[0, 3]  # a tied top
    y = rng.integers(0, 13, 257)
    value, slope = scaled_nll(z, y, beta)
    b = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
    reference = F.cross_entropy(b * torch.from_numpy(z).double(), torch.from_numpy(y))
    reference.backward()
    assert value == pytest.approx(reference.item(), rel=1e-13)
    assert slope == pytest.approx(b.grad.item(), rel=1e-11, abs=1e-14)


def _fused_and_autograd(smart, z, y, objective, sigma=0.05, force_exp=False):
    """(value, grad) of the fused step and of torch autograd through ``smart._torch_objective``, at ``smart``'s weights."""
    from hf_calibration.calibrators._machinery.fitting.partition import GRID
    from hf_calibration.calibrators.smart import logit_margin

    binned = OBJECTIVE_CODES[objective] >= 2
    loss = smart._torch_objective(z, y, objective, **({"sigma": sigma} if binned else {}))
    smart.zero_grad()
    loss.backward()
    grad_torch = torch.cat(
        [smart.hidden.weight.grad[:, 0], smart.hidden.bias.grad, smart.output.weight.grad[0], smart.output.bias.grad]
    )
    table = LogPartitionTable(z, y)
    m_hat = ((logit_margin(torch.from_numpy(z)).double() - smart.margin_mean) / smart.margin_std).numpy()
    value, grad = smart_loss_grad(
        smart._flat_parameters(),
        m_hat,
        table.fd.reshape(-1).numpy(),
        GRID,
        table.gap_true.numpy(),
        table.correct.numpy(),
        OBJECTIVE_CODES[objective],
        15,
        sigma,
        1e-3,
        smart.eps,
        workspace(len(y), 15),
        force_exp,
    )
    return (value, grad), (loss.item(), grad_torch.numpy())


def _assert_matches(fused, reference):
    assert fused[0] == pytest.approx(reference[0], rel=1e-9)
    np.testing.assert_allclose(fused[1], reference[1], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("n", [300, 700])  # 700: several of the kernel's 256-row chunks, the last one partial
@pytest.mark.parametrize("objective", sorted(OBJECTIVE_CODES))
def test_fused_smart_step_matches_autograd(objective, n):
    from _calibrator_data import overconfident

    from hf_calibration.calibrators import SMARTCalibrator

    z, y = overconfident(n, 6, seed=4)
    smart = SMARTCalibrator(seed=5, max_steps=3).fit(z, y, objective=objective, progress_bar=False)
    # perturb so the comparison is not at a trained point
    smart._set_flat_parameters(smart._flat_parameters() + np.random.default_rng(0).normal(scale=0.3, size=49))
    _assert_matches(*_fused_and_autograd(smart, z, y, objective))


@pytest.mark.parametrize("b2", [-30.0, 400.0])  # T ~ eps = 1e-3 (beta above the table) and T ~ 400 (below it)
@pytest.mark.parametrize("objective", sorted(OBJECTIVE_CODES))
def test_fused_smart_step_matches_autograd_off_the_table(objective, b2):
    from _calibrator_data import overconfident

    from hf_calibration.calibrators import SMARTCalibrator

    z, y = overconfident(300, 6, seed=7)
    smart = SMARTCalibrator(seed=1, eps=1e-3, max_steps=1).fit(z, y, objective=objective, progress_bar=False)
    x = smart._flat_parameters()
    x[-1] = b2
    smart._set_flat_parameters(x)
    _assert_matches(*_fused_and_autograd(smart, z, y, objective))


@pytest.mark.parametrize("sigma", [0.05, 0.01])  # 0.01: too narrow for the membership recurrence, one exp per bin
def test_fused_smart_step_soft_bin_paths_match_autograd_and_each_other(sigma):
    from _calibrator_data import overconfident

    from hf_calibration.calibrators import SMARTCalibrator

    z, y = overconfident(600, 5, seed=11)
    smart = SMARTCalibrator(seed=3, max_steps=2).fit(z, y, progress_bar=False)
    fused, reference = _fused_and_autograd(smart, z, y, "charbonnier_soft_ece", sigma=sigma)
    _assert_matches(fused, reference)
    by_exp, _ = _fused_and_autograd(smart, z, y, "charbonnier_soft_ece", sigma=sigma, force_exp=True)
    assert fused[0] == pytest.approx(by_exp[0], rel=1e-13)
    np.testing.assert_allclose(fused[1], by_exp[1], rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("objective", ["nll", "charbonnier_soft_ece"])
def test_fused_smart_step_does_not_depend_on_the_thread_count(objective):
    import numba
    from _calibrator_data import overconfident

    from hf_calibration.calibrators import SMARTCalibrator

    if numba.get_num_threads() < 2:
        pytest.skip("one numba thread")
    z, y = overconfident(1000, 7, seed=13)  # four chunks, the last one partial
    smart = SMARTCalibrator(seed=2, max_steps=2).fit(z, y, objective=objective, progress_bar=False)
    default = numba.get_num_threads()
    results = []
    try:
        for threads in (1, default):
            numba.set_num_threads(threads)
            results.append(_fused_and_autograd(smart, z, y, objective)[0])
    finally:
        numba.set_num_threads(default)
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
