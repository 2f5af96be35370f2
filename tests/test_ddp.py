"""Two CPU processes (torchrun, gloo) training with FeDLaS through CalibrationTrainer, each on its own data.

Checks that the loss state stays identical across ranks — the EMA statistics (all-reduced by the loss) and
the gate weights (whose gradients DDP does not sync: the trainer averages them) — and equals what one
process computes from the union batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _close(a: dict, b: dict, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_hold_identical_loss_state_equal_to_one_big_batch(tmp_path):
    from _torchrun import run_torchrun

    run_torchrun(HERE / "_ddp_worker.py", tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["steps"] for r in ranks] == [3, 3]

    # identical across ranks, bit for bit: the same all-reduced statistics and averaged gate gradients
    _close(ranks[0]["loss"], ranks[1]["loss"], rtol=0, atol=0)
    _close(ranks[0]["model"], ranks[1]["model"], rtol=0, atol=0)

    # and what one process computes on the union of the two ranks' batches (up to summation order)
    from _ddp_worker import train_fedlas

    single = train_fedlas(32, str(tmp_path / "single"))
    assert single["world_size"] == 1 and single["steps"] == 3
    _close(ranks[0]["loss"], single["loss"], rtol=1e-6, atol=1e-7)
    _close(ranks[0]["model"], single["model"], rtol=1e-5, atol=1e-6)

    # the MaC-Cal stage ran after training on every process, on the whole stage-2 data: the same bottleneck
    # head on both ranks (compared bit for bit above, with the model) and as in one process (compared above)
    assert ranks[0]["maccal_head"] is not None and ranks[0]["maccal_head"] == single["maccal_head"]
    assert any(".fc1." in k for k in ranks[0]["model"])
