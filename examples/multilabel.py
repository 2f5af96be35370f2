"""A multi-label image classifier, fine-tuned, calibrated, shared with its calibrator, served calibrated by a pipeline.

1. a ViT with ``problem_type="multi_label_classification"`` (one sigmoid per label) is trained through
   ``CalibrationTrainer`` with a multi-label loss (the asymmetric loss by default);
2. a sigmoid calibrator is fitted on a held-out calibration split (``AutoCalibrator``: the sigmoid calibrators
   cross-validated, or one named with ``--calibrator platt`` ...), and measured on the test split, per label,
   macro-averaged and pooled;
3. the model is saved with the calibrator in its ``calibrator/`` subfolder, and pushed to the Hub the same way
   (``--push_to_hub_repo``; a dry run by default: the files that would be uploaded are listed);
4. ``hf_calibration.pipeline("image-classification", model=folder)`` loads both and returns each label's calibrated
   probability (a sigmoid per label: the scores do not sum to 1).

Offline: scikit-learn's handwritten digits, each tagged with three labels (below 5, even, drawn with a closed loop:
0, 6, 8, 9), and a tiny ViT built from a config.

    python examples/multilabel.py
    python examples/multilabel.py --calibrator beta --loss bce --num_train_epochs 40
    python examples/multilabel.py --push_to_hub_repo <you>/vit-digit-tags --no_dry_run
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import HfArgumentParser, TrainingArguments

TAGS = ("below 5", "even", "closed loop")

DEFAULTS = dict(
    output_dir="multilabel-digits",
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
    loss: str = field(
        default="asl", metadata={"help": "Training loss: bce, asl (asymmetric), sigmoid_focal or binary_ls."}
    )
    calibrator: str = field(
        default="auto", metadata={"help": "auto (cross-validated choice) or a sigmoid calibrator's kind."}
    )
    train_size: int | None = field(default=None, metadata={"help": "Training images (default: all the rest)."})
    calibration_size: int = field(default=400)
    test_size: int = field(default=400)
    push_to_hub_repo: str | None = field(
        default=None, metadata={"help": "Hub repo id for the model and its calibrator."}
    )
    dry_run: bool = field(
        default=True, metadata={"help": "Only list what would be pushed (the default; always offline)."}
    )
    pipeline_images: int = field(default=3)


def tags_of(digits: np.ndarray) -> np.ndarray:
    """(N, 3) float 0/1 tags of digit labels."""
    digits = np.asarray(digits)
    return np.stack([digits < 5, digits % 2 == 0, np.isin(digits, [0, 6, 8, 9])], axis=1).astype(np.float32)


def parse(argv: list[str] | None = None) -> tuple[ScriptArguments, TrainingArguments]:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    parser.set_defaults(**DEFAULTS)
    return parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else list(argv))


def hub_is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def main(argv: list[str] | None = None) -> dict:
    from hf_calibration import CalibrationTrainer, pipeline
    from hf_calibration.calibrators import AutoCalibrator, create_calibrator
    from hf_calibration.demo import PixelDataset, digits_image_processor, digits_splits, tiny_vit
    from hf_calibration.losses import get_loss
    from hf_calibration.metrics import calibration_report, format_reports

    script, training = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    # 1. a multi-label fine-tune
    split = digits_splits(
        training.seed,
        calibration_size=script.calibration_size,
        test_size=script.test_size,
        train_size=script.train_size,
    )
    processor = digits_image_processor()
    data = {}
    for name, images, digits in (
        ("train", split.train_images, split.train_labels),
        ("calibration", split.calibration_images, split.calibration_labels),
        ("test", split.test_images, split.test_labels),
    ):
        data[name] = PixelDataset(images, np.zeros(len(digits)), processor)
        data[name].labels = torch.from_numpy(tags_of(digits))  # multi-hot float targets, as transformers expects
    model = tiny_vit(num_labels=len(TAGS), seed=training.seed, problem_type="multi_label_classification")
    model.config.id2label, model.config.label2id = dict(enumerate(TAGS)), {t: i for i, t in enumerate(TAGS)}
    trainer = CalibrationTrainer(
        model=model, args=training, train_dataset=data["train"], compute_loss=get_loss(script.loss)
    )
    trainer.train()
    model.eval()

    # 2. a sigmoid calibrator on the held-out calibration split
    held_out = trainer.predict(data["calibration"])
    if script.calibrator == "auto":
        calibrator = AutoCalibrator().fit(held_out, progress_bar=False).calibrator_
    else:
        calibrator = create_calibrator(script.calibrator).fit(held_out, progress_bar=False, task="multilabel")
    test = trainer.predict(data["test"])
    calibrated = calibrator(torch.from_numpy(test.predictions)).numpy()
    reports = {
        "uncalibrated": calibration_report(test.predictions, test.label_ids, label_names=TAGS),
        calibrator.kind: calibration_report(calibrated, test.label_ids, label_names=TAGS),
    }
    print(
        f"{calibrator.kind} fitted on {len(held_out.label_ids)} held-out images; test split, {len(test.label_ids)} images:"
    )
    print(format_reports(reports, ["accuracy", "ece", "adaece", "nll", "brier"]))
    print(format_reports(reports, ["ece", "nll"], average="micro"))
    print("\nper label, calibrated:\n" + reports[calibrator.kind].per_label_table())

    # 3. the model with its calibrator beside it, locally and on the Hub
    folder = Path(training.output_dir) / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    calibrator.save_pretrained(folder / "calibrator", overwrite=True)
    pushed = share(model, calibrator, script)

    # 4. a pipeline that loads both: each label's calibrated probability
    classify = pipeline("image-classification", model=str(folder), top_k=len(TAGS))
    images = split.test_images[: script.pipeline_images]
    results = classify(images)
    print('\nhf_calibration.pipeline("image-classification"): calibrated per-label scores')
    for i, rows in enumerate(results):
        print(
            f"  image {i} (digit {split.test_labels[i]}): " + ", ".join(f"{r['label']} {r['score']:.3f}" for r in rows)
        )
    return {
        "calibrator": calibrator,
        "reports": reports,
        "folder": folder,
        "pipeline_results": results,
        "pushed": pushed,
        "test_logits": test.predictions,
        "test_labels": test.label_ids,
    }


def share(model, calibrator, script: ScriptArguments) -> dict:
    """Push the model to ``push_to_hub_repo`` and the calibrator beside it (``path_in_repo="calibrator"``), or, in a dry run,
    build the calibrator's upload folder and list it."""
    repo = script.push_to_hub_repo or "<your-username>/vit-digit-tags"
    if script.dry_run or script.push_to_hub_repo is None or hub_is_offline():
        folder = Path(calibrator.push_to_hub(repo, path_in_repo="calibrator", dry_run=True))
        print(
            f"\nDry run: model.push_to_hub({repo!r}) and calibrator.push_to_hub({repo!r}, path_in_repo='calibrator') "
            f"would upload the model and, in calibrator/: {', '.join(sorted(p.name for p in folder.iterdir()))}"
        )
        return {"dry_run": True, "repo": repo}
    model_url = model.push_to_hub(repo)
    calibrator_url = calibrator.push_to_hub(repo, path_in_repo="calibrator")
    print(
        f"\nPushed the model ({model_url}) and its calibrator ({calibrator_url}); load both with "
        f"hf_calibration.pipeline('image-classification', model={repo!r})"
    )
    return {"dry_run": False, "repo": repo, "model_url": str(model_url), "calibrator_url": str(calibrator_url)}


if __name__ == "__main__":
    main()
