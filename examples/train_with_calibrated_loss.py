"""Train an image classifier with a calibration loss (LS, MbLS, focal, FLSD-53, FeDLaS), optionally MaC-Cal after it.

Offline by default: a tiny ViT built from a config (random init) trained on scikit-learn's 8x8 handwritten
digits. Name a hub dataset and checkpoint to fine-tune a real model instead. Prints accuracy, ECE, AdaECE and
O-/U-ECE on the held-out split.

    python examples/train_with_calibrated_loss.py --loss fedlas_ls
    python examples/train_with_calibrated_loss.py --loss mbls --loss_kwargs '{"margin": 10}' --maccal
    python examples/train_with_calibrated_loss.py --loss fedlas_mbls \\
        --dataset_name uoft-cs/cifar10 --model_name_or_path google/vit-base-patch16-224-in21k \\
        --output_dir vit-cifar10-fedlas --num_train_epochs 3 --learning_rate 5e-5 --per_device_train_batch_size 64

Multi-GPU: the same command under ``accelerate launch --multi_gpu --num_processes N`` (see docs/multi-gpu.md).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import HfArgumentParser, TrainingArguments

from hf_calibration import CalibrationTrainer
from hf_calibration.losses import get_loss, list_losses
from hf_calibration.metrics import calibration_report, format_reports

logger = logging.getLogger(__name__)

# the demo's defaults where TrainingArguments' own (fine-tuning) defaults don't fit training from scratch
DIGITS_DEFAULTS = dict(
    output_dir="calibrated-digits-vit",
    learning_rate=3e-3,
    num_train_epochs=20,
    per_device_train_batch_size=64,
    per_device_eval_batch_size=256,
    warmup_steps=50,
    weight_decay=0.05,
    logging_strategy="epoch",
    save_strategy="no",
    eval_strategy="no",
    report_to="none",
    dataloader_pin_memory=False,
)
COLUMNS = ("accuracy", "ece", "adaece", "o_ece", "u_ece")


@dataclass
class ScriptArguments:
    loss: str = field(default="fedlas_ls", metadata={"help": f"Training loss, one of {list_losses()}."})
    loss_kwargs: str = field(
        default="{}", metadata={"help": "JSON of loss arguments, e.g. '{\"beta\": 1.0}' (num_classes: the model's)."}
    )
    maccal: bool = field(default=False, metadata={"help": "Run the MaC-Cal second stage after training."})
    maccal_kwargs: str = field(default="{}", metadata={"help": "JSON of MaCCalConfig arguments."})
    head: str | None = field(
        default=None, metadata={"help": "Dotted path of the classifier's final Linear, for models not auto-detected."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset (default: the offline digits)."})
    dataset_config_name: str | None = field(default=None)
    train_split: str = field(default="train")
    eval_split: str = field(default="test")
    image_column: str = field(default="img", metadata={"help": "Image column of the hub dataset."})
    label_column: str = field(default="label", metadata={"help": "Label column of the hub dataset."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Hub checkpoint (default: a tiny ViT)."})
    max_train_samples: int | None = field(default=None)
    max_eval_samples: int | None = field(default=None)
    hidden_size: int = field(default=32, metadata={"help": "Tiny ViT width (offline demo only)."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Tiny ViT depth (offline demo only)."})


# ------------------------------------------------------------------------------------------- data and model


def digits_splits(seed: int = 0, test_fraction: float = 0.25):
    """scikit-learn's digits as two `datasets.Dataset`s of ``pixel_values`` (1x8x8 in [0, 1]) and ``labels``."""
    from datasets import Dataset
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    idx_train, idx_test = train_test_split(
        np.arange(len(images)), test_size=test_fraction, random_state=seed, stratify=data.target
    )

    def subset(idx):
        return Dataset.from_dict({"pixel_values": images[idx], "labels": data.target[idx]}).with_format("torch")

    return subset(idx_train), subset(idx_test), 10


def tiny_vit(num_labels: int, hidden_size: int = 32, num_hidden_layers: int = 2, seed: int = 0):
    """A ViT for 1x8x8 images from a config, random init (patch 2 → 16 tokens + CLS)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden_size,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
    )
    return ViTForImageClassification(config)


def hub_splits_and_model(script: ScriptArguments):
    """A hub image-classification dataset preprocessed by the checkpoint's image processor, and the checkpoint."""
    from datasets import load_dataset
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    raw = load_dataset(script.dataset_name, script.dataset_config_name)
    train, test = raw[script.train_split], raw[script.eval_split]
    if script.max_train_samples is not None:
        train = train.select(range(min(script.max_train_samples, len(train))))
    if script.max_eval_samples is not None:
        test = test.select(range(min(script.max_eval_samples, len(test))))
    names = train.features[script.label_column].names
    processor = AutoImageProcessor.from_pretrained(script.model_name_or_path)

    def transform(batch):
        images = [image.convert("RGB") for image in batch[script.image_column]]
        out = processor(images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "labels": torch.as_tensor(batch[script.label_column])}

    train.set_transform(transform)
    test.set_transform(transform)
    model = AutoModelForImageClassification.from_pretrained(
        script.model_name_or_path,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        ignore_mismatched_sizes=True,
    )
    return train, test, len(names), model


def collate(rows):
    return {
        "pixel_values": torch.stack([torch.as_tensor(r["pixel_values"]) for r in rows]),
        "labels": torch.as_tensor([int(r["labels"]) for r in rows]),
    }


# ------------------------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> tuple[ScriptArguments, TrainingArguments]:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args = sys.argv[1:] if argv is None else list(argv)
    offline = not any(a.split("=")[0] in ("--dataset_name", "--model_name_or_path") for a in args)
    if offline:
        parser.set_defaults(**DIGITS_DEFAULTS)
    else:
        parser.set_defaults(remove_unused_columns=False, report_to="none")
    script, training = parser.parse_args_into_dataclasses(args=args)
    if (script.dataset_name is None) != (script.model_name_or_path is None):
        raise ValueError("Expected `--dataset_name` and `--model_name_or_path` together (or neither: the digits demo).")
    return script, training


def evaluate_calibration(trainer, dataset):
    output = trainer.predict(dataset)
    return calibration_report(output.predictions, output.label_ids)


def main(argv: list[str] | None = None) -> dict:
    script, training = parse(argv)
    logging.basicConfig(level=logging.INFO if training.should_log else logging.WARNING)

    if script.dataset_name is None:
        train, test, num_labels = digits_splits(seed=training.seed)
        if script.max_train_samples is not None:
            train = train.select(range(min(script.max_train_samples, len(train))))
        if script.max_eval_samples is not None:
            test = test.select(range(min(script.max_eval_samples, len(test))))
        model = tiny_vit(num_labels, script.hidden_size, script.num_hidden_layers, seed=training.seed)
    else:
        train, test, num_labels, model = hub_splits_and_model(script)

    # FeDLaS's num_classes and its gate's seed come from the trainer (model.config.num_labels, --seed)
    loss = get_loss(script.loss, **json.loads(script.loss_kwargs))

    trainer = CalibrationTrainer(
        model=model,
        args=training,
        train_dataset=train,
        eval_dataset=test,
        data_collator=collate,
        compute_loss_func=loss,
        head=script.head,
    )
    trainer.train()
    reports = {script.loss: evaluate_calibration(trainer, test)}

    if script.maccal:
        from hf_calibration.maccal import MaCCalConfig

        # the stage can also run inside train() with CalibrationTrainer(..., maccal=config); run separately
        # here to report the model before and after it
        trainer.maccal = MaCCalConfig(**json.loads(script.maccal_kwargs))
        trainer.run_maccal()
        reports[f"{script.loss} + MaC-Cal"] = evaluate_calibration(trainer, test)

    if training.should_save and training.save_strategy != "no":
        trainer.save_model()
    if trainer.is_world_process_zero():
        print(format_reports(reports, columns=COLUMNS))
    return reports


if __name__ == "__main__":
    main()
