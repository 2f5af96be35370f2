"""Calibration metrics through 🤗 evaluate: load them offline, stream batches, combine them, use them in a Trainer.

Three steps, offline by default (the metric scripts ship inside the package; data are scikit-learn's digits and
the model a tiny ViT built from a config):

1. ``evaluate.load(hf_calibration.metric_path("ece"))`` (any install) or ``evaluate.load("<repo>/metrics/ece")``
   (a clone), fed batch by batch with ``add_batch`` and checked against the plain function;
2. ``evaluate.combine([ece, adaece, smce])``;
3. ``Trainer(compute_metrics=...)``: ECE, AdaECE and smCE reported at every evaluation (also with
   ``--batch_eval_metrics``, where batches are streamed into the metrics).

    python examples/evaluate_metrics.py
    python examples/evaluate_metrics.py --metric_source repo --batch_eval_metrics
    python examples/evaluate_metrics.py --metric_source <hub-namespace>      # evaluate.load("<ns>/ece"), online
    python examples/evaluate_metrics.py --dataset_name uoft-cs/cifar10 --image_column img \\
        --model_name_or_path google/vit-base-patch16-224-in21k --num_train_epochs 1 --learning_rate 5e-5 \\
        --output_dir vit-cifar10 --per_device_train_batch_size 64 --max_train_samples 5000
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import evaluate
import numpy as np
import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments

import hf_calibration
from hf_calibration.metrics import adaece, ece, smce

logger = logging.getLogger(__name__)

REPO_METRICS = Path(__file__).resolve().parents[1] / "metrics"  # the repository's metrics/ folder (a clone)
METRICS = ("ece", "adaece", "smce")
DIGITS_DEFAULTS = dict(
    output_dir="evaluate-metrics-digits",
    learning_rate=3e-3,
    num_train_epochs=10,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=128,
    weight_decay=0.05,
    eval_strategy="epoch",
    logging_strategy="epoch",
    save_strategy="no",
    report_to="none",
    use_cpu=True,
)


@dataclass
class ScriptArguments:
    metric_source: str = field(
        default="package",
        metadata={
            "help": "'package' (bundled scripts, hf_calibration.metric_path), 'repo' (this clone's metrics/ "
            "folder) or a Hub namespace holding the metrics as Spaces (online)."
        },
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub image dataset (default: offline digits)."})
    dataset_config_name: str | None = field(default=None)
    train_split: str = field(default="train")
    eval_split: str = field(default="test")
    image_column: str = field(default="image")
    label_column: str = field(default="label")
    model_name_or_path: str | None = field(default=None, metadata={"help": "Hub checkpoint (default: tiny ViT)."})
    max_train_samples: int | None = field(default=None)
    max_eval_samples: int | None = field(default=None)


def load_metric(name: str, source: str = "package"):
    """An `evaluate` calibration metric from the installed package, this clone, or the Hub."""
    if source == "package":
        return evaluate.load(hf_calibration.metric_path(name))
    if source == "repo":
        return evaluate.load(str(REPO_METRICS / name))
    return evaluate.load(f"{source}/{name}")


# ----------------------------------------------------------------------------- data and model


def digits_data(seed: int, max_train: int | None, max_eval: int | None):
    """Tiny ViT + digits (train / test) as torch datasets of {"pixel_values", "labels"}."""
    from hf_calibration.demo import PixelDataset, digits_image_processor, digits_splits, tiny_vit

    split = digits_splits(seed, calibration_size=1, test_size=max_eval or 400, train_size=max_train)
    processor = digits_image_processor()
    train = PixelDataset(split.train_images, split.train_labels, processor)
    test = PixelDataset(split.test_images, split.test_labels, processor)
    return train, test, tiny_vit(seed=seed)


def hub_data(script: ScriptArguments):
    """A Hub image dataset preprocessed on the fly by the checkpoint's image processor, and the checkpoint."""
    from datasets import load_dataset
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    raw = load_dataset(script.dataset_name, script.dataset_config_name)
    train, test = raw[script.train_split], raw[script.eval_split]
    if script.max_train_samples:
        train = train.select(range(min(script.max_train_samples, len(train))))
    if script.max_eval_samples:
        test = test.select(range(min(script.max_eval_samples, len(test))))
    names = train.features[script.label_column].names
    processor = AutoImageProcessor.from_pretrained(script.model_name_or_path)

    def transform(batch):
        pixels = processor([im.convert("RGB") for im in batch[script.image_column]], return_tensors="pt")[
            "pixel_values"
        ]
        return {"pixel_values": pixels, "labels": torch.as_tensor(batch[script.label_column])}

    train.set_transform(transform)
    test.set_transform(transform)
    model = AutoModelForImageClassification.from_pretrained(
        script.model_name_or_path,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        ignore_mismatched_sizes=True,
    )
    return train, test, model


# ----------------------------------------------------------------------------- compute_metrics


def make_compute_metrics(combined, batched: bool):
    """``compute_metrics`` for Trainer: whole predictions at once, or (``batch_eval_metrics``) batch by batch."""
    if not batched:

        def compute_metrics(eval_pred):
            logits = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
            return combined.compute(predictions=logits, references=eval_pred.label_ids)

        return compute_metrics

    def compute_metrics_batched(eval_pred, compute_result: bool):
        logits = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        combined.add_batch(
            predictions=logits.detach().float().cpu().numpy(), references=eval_pred.label_ids.cpu().numpy()
        )
        return combined.compute() if compute_result else {}

    return compute_metrics_batched


def parse(argv: list[str] | None = None) -> tuple[ScriptArguments, TrainingArguments]:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args = sys.argv[1:] if argv is None else list(argv)
    hub = any(a.split("=")[0] in ("--dataset_name", "--model_name_or_path") for a in args)
    parser.set_defaults(
        **({"remove_unused_columns": False, "eval_strategy": "epoch", "report_to": "none"} if hub else DIGITS_DEFAULTS)
    )
    script, training = parser.parse_args_into_dataclasses(args=args)
    if (script.dataset_name is None) != (script.model_name_or_path is None):
        raise ValueError(
            "Expected `--dataset_name` and `--model_name_or_path` together (or neither: the offline digits)."
        )
    return script, training


def main(argv: list[str] | None = None) -> dict:
    script, training = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    # 1. one metric, streamed in batches, equals the plain function
    metric = load_metric("ece", script.metric_source)
    g = np.random.default_rng(training.seed)
    labels = g.integers(0, 10, 1000)
    logits = (3 * g.standard_normal((1000, 10)) + 4 * np.eye(10)[labels]).astype(np.float32)
    for start in range(0, 1000, 250):
        metric.add_batch(predictions=logits[start : start + 250], references=labels[start : start + 250])
    streamed = metric.compute()["ece"]
    direct = ece(logits, labels)
    print(f"1. evaluate ECE (4 batches) = {100 * streamed:.4f} %   hf_calibration.metrics.ece = {100 * direct:.4f} %")

    # 2. several metrics in one call
    combined = evaluate.combine([load_metric(name, script.metric_source) for name in METRICS])
    together = combined.compute(predictions=logits, references=labels)
    print("2. evaluate.combine:", ", ".join(f"{k} = {100 * v:.2f} %" for k, v in together.items()))

    # 3. inside a Trainer
    if script.dataset_name is None:
        train, test, model = digits_data(training.seed, script.max_train_samples, script.max_eval_samples)
    else:
        train, test, model = hub_data(script)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=train,
        eval_dataset=test,
        compute_metrics=make_compute_metrics(combined, training.batch_eval_metrics),
    )
    trainer.train()
    metrics = trainer.evaluate()
    print("3. Trainer.evaluate():", ", ".join(f"{k} = {100 * metrics[f'eval_{k}']:.2f} %" for k in METRICS))
    prediction = trainer.predict(test)
    z, y = prediction.predictions, prediction.label_ids
    print(
        f"   check with the plain functions: ece = {100 * ece(z, y):.2f} %, adaece = {100 * adaece(z, y):.2f} %, "
        f"smce = {100 * smce(z, y):.2f} %"
    )
    return {
        "streamed_ece": streamed,
        "direct_ece": direct,
        "combined": together,
        "trainer": metrics,
        "logits": z,
        "labels": y,
    }


if __name__ == "__main__":
    main()
