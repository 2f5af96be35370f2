"""``CalibrationCallback`` under two CPU processes (torchrun, gloo): the main process alone fits, once, on the eval
logits of both processes (301 rows, unevenly shared), and every process ends with the same calibrator and threshold;
the temperature equals scipy's on the whole split's logits computed here in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from _models import digits_dataset, make_model  # noqa: E402
from _torchrun import run_torchrun  # noqa: E402


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_fit_once_on_the_gathered_eval_logits(tmp_path):
    from scipy.optimize import minimize_scalar

    run_torchrun(HERE / "_callback_ddp_worker.py", tmp_path, timeout=600)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["fits"] for r in ranks] == [1, 0]  # fitted once, on the main process
    assert ranks[0]["temperature"] == ranks[1]["temperature"] and ranks[0]["q_hat"] == ranks[1]["q_hat"]
    assert (tmp_path / "run" / "calibrator" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "conformal" / "model.safetensors").is_file()
    model = make_model("vit", seed=0).eval()
    model.load_state_dict(ranks[0]["weights"])
    data = digits_dataset(slice(1200, 1501))
    with torch.no_grad():
        z = model(pixel_values=data.pixel_values).logits.double()
    y = data.labels

    def nll(log_t: float) -> float:
        return F.cross_entropy(z / np.exp(log_t), y).item()

    t = float(np.exp(minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-9}).x))
    assert not ranks[0]["identity"] and ranks[0]["temperature"] == pytest.approx(t, rel=1e-4)
