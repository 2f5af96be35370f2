"""Two CPU processes (torchrun, gloo) training with FeDLaS through CalibrationTrainer, each on its own data.

Checks that the loss state is identical across ranks after every step, bit for bit — the gate (drawn from
``args.seed`` however each process's RNG stood, and trained with gradients the trainer averages: DDP syncs the
model's only) and the EMA statistics (all-reduced by the loss) — as are the model's weights; and that the end
state equals what one process computes from the union batch, up to float32 summation order (two half-batch
gradients summed by the all-reduce against one 32-row sum): rtol 1e-6 / atol 1e-7 on the loss state, rtol 1e-5 /
atol 1e-6 on the model, after 3 SGD steps at lr 0.5.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parents[1]  # tests/, where the worker scripts are
sys.path.insert(0, str(HERE))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(a: dict, b: dict, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_hold_one_loss_state_at_every_step_equal_to_one_big_batch(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(HERE / "_ddp_worker.py"),
        str(tmp_path),
    ]
    # its own session, so a timeout kills torchrun's workers too (they would outlive a plain kill of torchrun)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail("torchrun did not finish in 300 s:\n" + stdout[-3000:] + stderr[-3000:])
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["global_step"] for r in ranks] == [3, 3] and [len(r["steps"]) for r in ranks] == [3, 3]

    # identical across ranks after every step, bit for bit: gate, EMA statistics and model weights
    for step, (a, b) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"]), start=1):
        assert any(k.startswith("gate.") for k in a["loss"]) and {"nci_mean", "nci_std"} <= set(a["loss"]), step
        _close(a["loss"], b["loss"], rtol=0, atol=0)
        _close(a["model"], b["model"], rtol=0, atol=0)
    # the gate trained (its gradients reached every rank), and the statistics moved
    first, last = ranks[0]["steps"][0]["loss"], ranks[0]["steps"][-1]["loss"]
    assert not torch.equal(first["gate.fc_in.weight"], last["gate.fc_in.weight"])
    assert not torch.equal(first["nci_mean"], last["nci_mean"])
    _close(ranks[0]["loss"], ranks[1]["loss"], rtol=0, atol=0)
    _close(ranks[0]["model"], ranks[1]["model"], rtol=0, atol=0)

    # and what one process computes on the union of the two ranks' batches (up to summation order), its global
    # RNG in yet another state when it builds the loss
    from _ddp_worker import train_fedlas

    single = train_fedlas(32, str(tmp_path / "single"), global_seed=7)
    assert single["world_size"] == 1 and single["global_step"] == 3
    for ddp_step, one_step in zip(ranks[0]["steps"], single["steps"]):
        _close(ddp_step["loss"], one_step["loss"], rtol=1e-6, atol=1e-7)
    _close(ranks[0]["loss"], single["loss"], rtol=1e-6, atol=1e-7)
    _close(ranks[0]["model"], single["model"], rtol=1e-5, atol=1e-6)

    # the MaC-Cal stage ran after training on every process, on the whole stage-2 data: the same bottleneck
    # head on both ranks (compared bit for bit above, with the model) and as in one process (compared above)
    assert ranks[0]["maccal_head"] is not None and ranks[0]["maccal_head"] == single["maccal_head"]
    assert any(".fc1." in k for k in ranks[0]["model"])
