"""Launched by tests/test_distributed.py as ``torchrun --nproc_per_node 2 tests/_distributed_worker.py ROOT OUT``.

Each process calls ``predict_logits`` (which joins the process group torchrun describes and runs its own shard),
then streams its own uneven part of a fixed set of logits into ``CalibrationAccumulator``s and syncs them. It
saves what it got to ``OUT/rank{RANK}.pt``; the test compares that with one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# rows of the accumulator data each rank streams: uneven, and rank 1 sees nothing in the second accumulator
PARTS = {"uneven": {0: slice(0, 700), 1: slice(700, 1999)}, "one_empty": {0: slice(0, 1999), 1: slice(0, 0)}}


def accumulator_data() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(3)
    labels = g.integers(0, 6, 1999)
    logits = (2.0 * g.standard_normal((1999, 6)) + 2.0 * np.eye(6)[labels]).astype(np.float32)
    labels[::23] = -100
    return logits, labels


def main(root: Path, out: Path) -> None:
    from hf_calibration.io import predict_logits
    from hf_calibration.metrics import CalibrationAccumulator

    torch.set_num_threads(1)
    logits, labels = predict_logits(
        str(root / "vit"),
        str(root / "saved"),
        split="test",
        batch_size=4,
        num_workers=0,
        progress=False,
        cache_dir=out / "cache",
    )
    rank = torch.distributed.get_rank()
    result = {"world_size": torch.distributed.get_world_size(), "logits": logits, "labels": labels, "reports": {}}
    z, y = accumulator_data()
    for name, parts in PARTS.items():
        for dtype in ("float32", "float64"):
            acc = CalibrationAccumulator(confidence_dtype=dtype)
            rows = parts[rank]
            for start in range(rows.start, rows.stop, 128):
                stop = min(rows.stop, start + 128)
                acc.update(torch.from_numpy(z[start:stop]), torch.from_numpy(y[start:stop]))
            result["reports"][(name, dtype)] = acc.sync().compute().to_dict()
            result["reports"][(name, dtype, "again")] = (
                acc.sync().compute().to_dict()
            )  # a second sync counts nothing twice
    # update after a sync, then sync again: rank 0 adds rows 0..99 a second time; every sample still counted once
    acc = CalibrationAccumulator(confidence_dtype="float64")
    rows = PARTS["uneven"][rank]
    acc.update(z[rows], y[rows]).sync()
    if rank == 0:
        acc.update(z[:100], y[:100])
    result["reports"]["resumed"] = acc.sync().compute().to_dict()
    # accelerate on CPUs without cpu=True reports one process while torch.distributed has two: sync refuses to sum
    from accelerate import PartialState

    result["accelerate_processes"] = PartialState().num_processes
    try:
        acc.sync()
        result["accelerate_conflict"] = None
    except RuntimeError as err:
        result["accelerate_conflict"] = str(err)
    torch.save(result, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"rank {os.environ.get('RANK')} done")
