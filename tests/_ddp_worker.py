"""Launched by tests/test_ddp.py as ``torchrun --nproc_per_node 2 tests/_ddp_worker.py OUT_DIR``.

Each process trains the same tiny ViT with FeDLaS-LS through `CalibrationTrainer` on its own shard of the
data (the Trainer's distributed sampler splits it), then runs the MaC-Cal stage (every process on the whole
stage-2 data), and saves its loss and model state after every step and at the end to ``OUT_DIR/rank{RANK}.pt``.
The test also calls `train_fedlas` in a single process with the union batch.

Each process builds its loss after seeding torch's global RNG with a value of its own, as processes whose RNG
differs when the loss is built (the gate is drawn from it): the trainer must give every process one gate anyway.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

NUM_SAMPLES = 32  # one optimizer step per epoch: 2 ranks x 16, or 1 process x 32
EPOCHS = 3


def _copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def train_fedlas(per_device_batch: int, output_dir: str, global_seed: int = 0) -> dict:
    from _models import digits_dataset, make_model
    from transformers import TrainerCallback, TrainingArguments

    from hf_calibration import CalibrationTrainer
    from hf_calibration.losses import get_loss
    from hf_calibration.maccal import MaCCalConfig

    class EveryStep(TrainerCallback):
        """The loss state (gate, EMA statistics) and the model's weights after every optimizer step."""

        def __init__(self):
            self.steps = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append({"loss": _copy(loss), "model": _copy(model)})

    torch.set_num_threads(1)
    model = make_model("vit", seed=0)
    torch.manual_seed(global_seed)  # the gate would be drawn from this
    # statistics that make γ = O(1) from the first step, so the gate gets gradients large enough to see
    loss = get_loss("fedlas_ls", base=0.3, theta=0.5, nci_init_mean=8.0, nci_init_std=2.0)  # num_classes: the trainer's
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=per_device_batch,
        num_train_epochs=EPOCHS,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
        use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_find_unused_parameters=False,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    every_step = EveryStep()
    trainer = CalibrationTrainer(
        model=model,
        args=args,
        train_dataset=digits_dataset(slice(0, NUM_SAMPLES)),
        compute_loss_func=loss,
        maccal=MaCCalConfig(epochs=2, batch_size=32, progress=False),
        maccal_dataset=digits_dataset(slice(0, 64)),
        callbacks=[every_step],
    )
    trainer.train()
    return {
        "loss": _copy(loss),
        "model": _copy(model),
        "steps": every_step.steps,
        "maccal_head": getattr(model.config, "maccal_head", None),
        "world_size": trainer.args.world_size,
        "global_step": trainer.state.global_step,
    }


if __name__ == "__main__":
    out = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    state = train_fedlas(NUM_SAMPLES // int(os.environ.get("WORLD_SIZE", "1")), str(out / "trainer"), 1000 + rank)
    torch.save(state, out / f"rank{rank}.pt")
