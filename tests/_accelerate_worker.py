"""Launched by tests/metrics/test_accumulator.py as ``torchrun --nproc_per_node 2 tests/_accelerate_worker.py OUT``.

A plain accelerate loop over 397 samples in batches of 50 on two CPU processes, with accelerate's default
``even_batches=True`` (the last round repeats 3 samples so that both processes get a full batch) and with
``even_batches=False``; each process streams its own batches into a ``CalibrationAccumulator`` and syncs. Saves
``OUT/rank{RANK}.pt``: the synced reports, and how many rows each process saw.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

N, BATCH = 397, 50


def data() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(7)
    labels = g.integers(0, 5, N)
    logits = (2.0 * g.standard_normal((N, 5)) + 2.5 * np.eye(5)[labels]).astype(np.float32)
    return logits, labels


def main(out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset

    from hf_calibration.metrics import CalibrationAccumulator

    torch.set_num_threads(1)
    z, y = data()
    result = {}
    for even in (True, False):
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=even))
        loader = accelerator.prepare(
            DataLoader(TensorDataset(torch.from_numpy(z), torch.from_numpy(y)), batch_size=BATCH)
        )
        acc, seen = CalibrationAccumulator(confidence_dtype="float64"), 0
        for logits, labels in loader:
            seen += logits.shape[0]
            acc.update(logits, labels)
        result[even] = {
            "rows_seen": seen,
            "rows_kept": acc.n,
            "report": acc.sync().compute().to_dict(),
            "world_size": accelerator.num_processes,
        }
    torch.save(result, out / f"rank{os.environ['RANK']}.pt")
    torch.distributed.barrier()  # neither process leaves while the other still talks to it (gloo aborts then)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    print(f"rank {os.environ.get('RANK')} done")
