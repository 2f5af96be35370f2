"""Launched by tests/training/test_callback_ddp.py as ``torchrun --nproc_per_node 2 tests/_callback_ddp_worker.py OUT``.

Two CPU processes (gloo) train the same tiny ViT with the plain ``Trainer`` and a ``CalibrationCallback``; the eval split
has an odd number of rows (301), so the processes' shares differ and accelerate pads one. Each process saves what it
holds at the end (its temperature, q_hat, whether it fitted, its eval logits gathered here by the trainer) to
``OUT/rank{RANK}.pt``; the main process alone writes ``OUT/run/calibrator`` and ``OUT/run/conformal``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(out: str) -> None:
    from _models import digits_dataset, make_model
    from transformers import Trainer, TrainingArguments

    import hf_calibration.training.eval_calibration as core
    from hf_calibration import CalibrationCallback

    torch.set_num_threads(1)
    fits = []
    fit = core.fit_eval_calibration
    core.fit_eval_calibration = lambda *a, **k: fits.append(1) or fit(*a, **k)  # count the fits of this process
    import hf_calibration.training.callback as callback_module

    callback_module.fit_eval_calibration = core.fit_eval_calibration
    args = TrainingArguments(
        output_dir=os.path.join(out, "run"),
        per_device_train_batch_size=32,
        per_device_eval_batch_size=50,
        max_steps=60,
        learning_rate=5e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    callback = CalibrationCallback(conformal="thr", alpha=0.1)
    trainer = Trainer(
        model=make_model("vit", seed=0),
        args=args,
        train_dataset=digits_dataset(slice(0, 1200)),
        eval_dataset=digits_dataset(slice(1200, 1501)),
        callbacks=[callback],
    )
    trainer.train()
    rank = int(os.environ["RANK"])
    torch.save(
        {
            "fits": len(fits),
            "temperature": float(callback.calibrator.log_temperature.detach().exp()),
            "identity": callback.calibrator.is_identity,
            "q_hat": float(callback.conformal_predictor.q_hat),
            "weights": {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()},
        },
        os.path.join(out, f"rank{rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1])
