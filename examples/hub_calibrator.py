"""Fit SMART on a trained classifier's held-out predictions, share it on the Hub, load it back, calibrate a pipeline.

1. ``Trainer.predict`` on a held-out calibration split → ``SMARTCalibrator().fit(prediction_output)``;
2. ``push_to_hub`` (beside the model, in a ``calibrator/`` subfolder, or to a repo of its own) — a dry run by
   default: the calibrator is written with ``save_pretrained`` and the files that would be uploaded are listed;
3. ``SMARTCalibrator.from_pretrained`` → ``attach(model)`` → ``pipeline("image-classification")`` scores and
   ``Trainer.predict`` logits are calibrated; ``detach()`` restores the model.

Offline by default: a tiny ViT (or Swin, ``--arch swin``) built from a config is trained for a few epochs on
scikit-learn's digits. Name a trained Hub checkpoint and its dataset to calibrate a real model instead:

    python examples/hub_calibrator.py
    python examples/hub_calibrator.py --arch swin --num_train_epochs 20
    python examples/hub_calibrator.py --model_name_or_path nateraw/vit-base-patch16-224-cifar10 \\
        --dataset_name uoft-cs/cifar10 --image_column img --calibration_split test --max_calibration_samples 2000 \\
        --push_to_hub_repo <you>/vit-cifar10-smart --no_dry_run
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments, pipeline

from hf_calibration.calibrators import SMARTCalibrator
from hf_calibration.metrics import calibration_report, format_reports

logger = logging.getLogger(__name__)

DIGITS_DEFAULTS = dict(
    output_dir="hub-calibrator-digits",
    learning_rate=3e-3,
    num_train_epochs=30,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=256,
    weight_decay=0.05,
    logging_strategy="no",
    save_strategy="no",
    report_to="none",
    use_cpu=True,
)


@dataclass
class ScriptArguments:
    arch: str = field(default="vit", metadata={"help": "Offline model family: vit or swin (tiny, from a config)."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A trained Hub classifier (skips training)."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Its Hub dataset (default: offline digits)."})
    dataset_config_name: str | None = field(default=None)
    calibration_split: str = field(default="validation", metadata={"help": "Split the calibrator is fitted on."})
    test_split: str = field(default="test", metadata={"help": "Split it is evaluated on."})
    image_column: str = field(default="image")
    label_column: str = field(default="label")
    max_calibration_samples: int | None = field(default=None)
    max_test_samples: int | None = field(default=None)
    train_size: int | None = field(default=None, metadata={"help": "Offline: training images to use (default all)."})
    objective: str = field(default="charbonnier_soft_ece", metadata={"help": "SMART's fit objective."})
    push_to_hub_repo: str | None = field(default=None, metadata={"help": "Hub repo id to push the calibrator to."})
    path_in_repo: str | None = field(
        default="calibrator", metadata={"help": "Subfolder of that repo (model beside it)."}
    )
    dry_run: bool = field(
        default=True,
        metadata={
            "help": "Only save_pretrained and list what would be pushed (the default; always when offline). "
            "--no_dry_run pushes."
        },
    )
    pipeline_images: int = field(default=4)


def tiny_swin(num_labels: int = 10, image_size: int = 16, seed: int = 0):
    """A small ``SwinForImageClassification`` from a config (random init, seeded)."""
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(
        image_size=image_size,
        patch_size=2,
        num_channels=3,
        embed_dim=24,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        num_labels=num_labels,
        id2label={i: str(i) for i in range(num_labels)},
        label2id={str(i): i for i in range(num_labels)},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SwinForImageClassification(config)


def offline_setup(script: ScriptArguments, training: TrainingArguments):
    """Train a tiny ViT / Swin on the digits; return (trainer, calibration set, test set, test images, processor)."""
    from hf_calibration.demo import PixelDataset, digits_image_processor, digits_splits, tiny_vit

    if script.arch not in ("vit", "swin"):
        raise ValueError(f"Expected argument `arch` to be one of ['swin', 'vit'], but got {script.arch!r}.")
    split = digits_splits(
        training.seed,
        calibration_size=script.max_calibration_samples or 400,
        test_size=script.max_test_samples or 400,
        train_size=script.train_size,
    )
    processor = digits_image_processor()
    train = PixelDataset(split.train_images, split.train_labels, processor)
    cal = PixelDataset(split.calibration_images, split.calibration_labels, processor)
    test = PixelDataset(split.test_images, split.test_labels, processor)
    model = tiny_vit(seed=training.seed) if script.arch == "vit" else tiny_swin(seed=training.seed)
    trainer = Trainer(model=model, args=training, train_dataset=train)
    trainer.train()
    return trainer, cal, test, split.test_images, processor


def hub_setup(script: ScriptArguments, training: TrainingArguments):
    """A trained Hub classifier and its dataset's calibration / test splits (no training)."""
    from datasets import load_dataset
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    raw = load_dataset(script.dataset_name, script.dataset_config_name)
    cal, test = raw[script.calibration_split], raw[script.test_split]
    if script.max_calibration_samples:
        cal = cal.select(range(min(script.max_calibration_samples, len(cal))))
    if script.max_test_samples:
        test = test.select(range(min(script.max_test_samples, len(test))))
    processor = AutoImageProcessor.from_pretrained(script.model_name_or_path)
    model = AutoModelForImageClassification.from_pretrained(script.model_name_or_path)
    images = [im.convert("RGB") for im in test.select(range(script.pipeline_images))[script.image_column]]

    def transform(batch):
        pixels = processor([im.convert("RGB") for im in batch[script.image_column]], return_tensors="pt")[
            "pixel_values"
        ]
        return {"pixel_values": pixels, "labels": torch.as_tensor(batch[script.label_column])}

    cal.set_transform(transform)
    test.set_transform(transform)
    return Trainer(model=model, args=training), cal, test, images, processor


def hub_is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def share(calibrator: SMARTCalibrator, script: ScriptArguments, folder: Path) -> str:
    """Push to the Hub, or (dry run) save locally and list what would be uploaded. Returns where to load from."""
    calibrator.save_pretrained(
        folder, overwrite=True
    )  # this script's own output folder: a rerun replaces its calibrator
    if script.dry_run or script.push_to_hub_repo is None or hub_is_offline():
        target = script.push_to_hub_repo or "<your-username>/<model>-smart"
        where = f"{target}/{script.path_in_repo}" if script.path_in_repo else target
        print(
            f"Dry run: calibrator.push_to_hub({target!r}"
            + (f", path_in_repo={script.path_in_repo!r})" if script.path_in_repo else ")")
            + f" would upload to https://huggingface.co/{where}:"
        )
        for path in sorted(folder.iterdir()):
            print(f"  {path.name:<20} {path.stat().st_size:>8} bytes")
        card = (folder / "README.md").read_text().splitlines()
        print("  model card excerpt: " + " / ".join(line for line in card if line.startswith("| ECE")))
        return str(folder)
    url = calibrator.push_to_hub(script.push_to_hub_repo, path_in_repo=script.path_in_repo)
    print(f"Pushed: {url}")
    return script.push_to_hub_repo


def parse(argv: list[str] | None = None) -> tuple[ScriptArguments, TrainingArguments]:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args = sys.argv[1:] if argv is None else list(argv)
    hub = any(a.split("=")[0] in ("--dataset_name", "--model_name_or_path") for a in args)
    parser.set_defaults(
        **(
            {"output_dir": "hub-calibrator", "report_to": "none", "remove_unused_columns": False}
            if hub
            else DIGITS_DEFAULTS
        )
    )
    script, training = parser.parse_args_into_dataclasses(args=args)
    if (script.dataset_name is None) != (script.model_name_or_path is None):
        raise ValueError(
            "Expected `--dataset_name` and `--model_name_or_path` together (or neither: the offline digits)."
        )
    return script, training


def main(argv: list[str] | None = None) -> dict:
    script, training = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if script.model_name_or_path is None:
        trainer, cal, test, images, processor = offline_setup(script, training)
    else:
        trainer, cal, test, images, processor = hub_setup(script, training)
    model = trainer.model.eval()

    # 1. fit on the Trainer's predictions of the held-out calibration split
    calibrator = SMARTCalibrator(seed=training.seed).fit(trainer.predict(cal), objective=script.objective)
    print(
        f"SMART fitted on {calibrator.fit_info_['num_samples']} held-out predictions "
        f"(fit-set ECE {100 * calibrator.fit_info_['ece_before']:.2f} % → {100 * calibrator.fit_info_['ece_after']:.2f} %)"
    )

    # 2. share (dry run offline) and 3. load back
    source = share(calibrator, script, Path(training.output_dir) / "calibrator")
    loaded = SMARTCalibrator.from_pretrained(source, subfolder=None if Path(source).is_dir() else script.path_in_repo)

    before = trainer.predict(test)
    classifier = pipeline("image-classification", model=model, image_processor=processor, device=model.device)
    images = images[: script.pipeline_images]
    scores_before = classifier(images, top_k=1)
    loaded.attach(model)
    try:
        after = trainer.predict(test)  # the model's own forward now returns calibrated logits
        scores_after = classifier(images, top_k=1)
    finally:
        loaded.detach()

    reports = {
        "uncalibrated": calibration_report(before.predictions, before.label_ids),
        "SMART (attached)": calibration_report(after.predictions, after.label_ids),
    }
    print(f"\n{type(model).__name__} on {len(before.label_ids)} test images:\n" + format_reports(reports))
    print('\npipeline("image-classification"), top-1 label: score without → with SMART')
    for i, (b, a) in enumerate(zip(scores_before, scores_after)):
        print(f"  image {i}: {b[0]['label']}: {b[0]['score']:.4f} → {a[0]['score']:.4f}")
    return {
        "calibrator": loaded,
        "source": source,
        "reports": reports,
        "before": before,
        "after": after,
        "scores_before": scores_before,
        "scores_after": scores_after,
        "model": model,
        "test": test,
    }


if __name__ == "__main__":
    main()
