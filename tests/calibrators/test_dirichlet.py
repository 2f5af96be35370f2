"""Dirichlet calibration with ODIR (Kull et al. 2019): matrix scaling on the clipped log-probabilities; the fit
against scipy, the identity start, torch-uncertainty on shared logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import fit_affine_reference, log_probabilities
from _calibrator_data import SHARED_LOGITS, overconfident

from hf_calibration.calibrators import DirichletCalibration


@pytest.mark.parametrize("lam, mu, nu", [(0.0, 0.0, 0.0), (3.0, 1.0, None)])
def test_fit_reaches_the_scipy_minimum_on_log_probabilities(lam, mu, nu):
    z, y = overconfident(400, 4, seed=11)
    z[:20] *= 20  # some probabilities below float64 eps: the clipped log matters
    dc = DirichletCalibration(reg_lambda=lam, reg_mu=mu, reg_diagonal=nu, tol=1e-14, max_iter=5000).fit(
        z, y, progress_bar=False
    )
    nu = 4 / 100 if nu is None else nu
    _, ref_objective, ref_nll = fit_affine_reference(
        log_probabilities(z), y, reg_lambda=lam, reg_mu=mu, reg_diagonal=nu
    )
    assert dc.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-6)
    assert dc.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    f = torch.from_numpy(log_probabilities(z))
    torch.testing.assert_close(dc(torch.from_numpy(z).double()), f @ dc.weight.T + dc.bias, rtol=0, atol=1e-10)


def test_identity_parameters_return_the_models_probabilities():
    z, y = overconfident(200, 6, seed=2)
    dc = DirichletCalibration(reg_lambda=1e12, reg_mu=1e12, max_iter=1).fit(z, y, progress_bar=False)
    with torch.no_grad():
        dc.weight.copy_(torch.eye(6))
        dc.bias.zero_()
    zt = torch.from_numpy(z).double()
    torch.testing.assert_close(dc.predict_proba(zt), torch.softmax(zt, 1), rtol=0, atol=1e-12)


def test_card_names_the_method_and_its_regularisation():
    z, y = overconfident(300, 4, seed=3)
    dc = DirichletCalibration(reg_lambda=2.0, reg_mu=1.0).fit(z, y, progress_bar=False)
    text = dc._card_description()
    assert "Dirichlet" in text and "lambda = 2" in text and "given" in text
    assert not dc.preserves_argmax


def _torch_uncertainty_comparison(ours_cls, peer_name, file):
    pytest.importorskip("torch_uncertainty")
    import torch_uncertainty.post_processing as tu
    from torch.utils.data import DataLoader, TensorDataset

    d = np.load(SHARED_LOGITS / file)
    zv, yv, zt, yt = (torch.from_numpy(d[k]) for k in ("logits_val", "labels_val", "logits_test", "labels_test"))
    ours = ours_cls().fit(zv, yv, progress_bar=False)
    peer = getattr(tu, peer_name)(num_classes=zv.shape[1])
    peer.fit(DataLoader(TensorDataset(zv, yv), batch_size=len(yv)), progress=False)
    with torch.no_grad():
        return (
            torch.nn.functional.cross_entropy(ours(zt).double(), yt).item(),
            torch.nn.functional.cross_entropy(peer(zt).double(), yt).item(),
        )


@pytest.mark.skipif(
    not (SHARED_LOGITS / "cifar10_resnet50_cross_entropy_calibench.npz").is_file(), reason="shared logits absent"
)
def test_never_worse_than_torch_uncertainty_on_test_nll():
    # (vector and matrix scaling, and every shared file, K = 100 included, are compared in benchmarks/calibrator_fits.py)
    ours, peer = _torch_uncertainty_comparison(
        DirichletCalibration, "DirichletScaler", "cifar10_resnet50_cross_entropy_calibench.npz"
    )
    assert ours <= peer  # measured: 0.1939 vs 0.2045
