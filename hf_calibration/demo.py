"""The end-to-end demo on scikit-learn's handwritten digits: train calibrated, recalibrate, compare, share.

``hf-calibration demo`` (or :func:`run_demo`) runs, offline and on a CPU in about a minute:

1. fine-tune a tiny ViT (built from a config, random init) with cross-entropy and with FeDLaS-LS
   through :class:`~hf_calibration.training.trainer.CalibrationTrainer`, and run the MaC-Cal second stage on a
   copy of the cross-entropy model. The default regime is the one real fine-tuning usually lands in and the
   training-time methods are built for: 200 training images for 80 epochs, so cross-entropy fits its training
   set and is over-confident on the test split (the summary states the regime it measured);
2. fit temperature scaling and SMART on a held-out calibration split;
3. measure every combination on the test split (:func:`~hf_calibration.metrics.calibration_report`),
   print one table (:func:`~hf_calibration.metrics.format_reports`) with one verdict line under it (which
   methods lowered ECE against cross-entropy) and write reliability diagrams;
4. save the model, its image processor and its SMART calibrator side by side, load them back
   (``pipeline(...)`` / :func:`~hf_calibration.calibrators.load_calibrator`), ``attach`` the calibrator
   and classify a few test images with ``pipeline("image-classification")``, before and after.

Same seed → same table. Progress bars show on a terminal; when stderr is not one (a log file, CI), training
logs one line per epoch instead. The builders (:func:`digits_splits`, :func:`digits_image_processor`,
:func:`tiny_vit`, :class:`PixelDataset`) are reused by the examples, and :func:`digits_model` / :func:`digits_logits` give the
documentation's examples a trained model and its held-out logits to work on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from hf_calibration._core.checks import check_float, check_int

logger = logging.getLogger(__name__)

__all__ = [
    "DemoConfig",
    "DemoResult",
    "DigitsLogits",
    "DigitsSplits",
    "PixelDataset",
    "digits_cache_dir",
    "digits_dataset",
    "digits_image_processor",
    "digits_logits",
    "digits_model",
    "digits_splits",
    "predict_logits",
    "run_demo",
    "tiny_vit",
    # text and audio stand-ins
    "audio_dataset",
    "text_dataset",
    "tiny_audio_classifier",
    "tiny_text_classifier",
]

NUM_LABELS = 10


# ----------------------------------------------------------------------------- data


@dataclass
class DigitsSplits:
    """scikit-learn's digits as PIL images (8x8 grey, stored RGB) in train / calibration / test splits."""

    train_images: list
    train_labels: np.ndarray
    calibration_images: list
    calibration_labels: np.ndarray
    test_images: list
    test_labels: np.ndarray


def _to_pil(image: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.round(image * (255.0 / 16.0)).astype(np.uint8), mode="L").convert("RGB")


def digits_splits(
    seed: int = 0, *, calibration_size: int = 400, test_size: int = 400, train_size: int | None = None
) -> DigitsSplits:
    """Shuffle the 1,797 digits with ``seed`` and cut test, calibration and train splits (in that order).

    Args:
        calibration_size: images held out to fit post-hoc calibrators.
        test_size: images held out to measure.
        train_size: keep only this many training images (default: all the rest, 997 with the defaults).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    n = len(digits.target)
    check_int(calibration_size, "calibration_size", minimum=1)
    check_int(test_size, "test_size", minimum=1)
    available = n - calibration_size - test_size
    if available < 1:
        raise ValueError(
            f"Expected `calibration_size + test_size` to leave training images out of {n}, but got {calibration_size} + {test_size}."
        )
    if train_size is not None:
        check_int(train_size, "train_size", minimum=1)
        if train_size > available:
            raise ValueError(f"Expected argument `train_size` to be at most {available}, but got {train_size}.")
    order = np.random.default_rng(seed).permutation(n)
    test, cal, train = (
        order[:test_size],
        order[test_size : test_size + calibration_size],
        order[test_size + calibration_size :],
    )
    if train_size is not None:
        train = train[:train_size]

    def images(idx):
        return [_to_pil(digits.images[i]) for i in idx]

    y = digits.target.astype(np.int64)
    return DigitsSplits(images(train), y[train], images(cal), y[cal], images(test), y[test])


def digits_dataset(seed: int = 0, *, calibration_size: int = 400, test_size: int = 400, train_size: int | None = 200):
    """The :func:`digits_splits` images as a ``datasets.DatasetDict`` (``train`` / ``validation`` / ``test``), with an
    ``image`` column (``datasets.Image``) and a ``label`` column (``ClassLabel`` "0"-"9"), as image datasets on the
    Hub are laid out. ``train_size`` defaults to the demo's 200 (``None``: every image left)."""
    import datasets

    data = digits_splits(seed, calibration_size=calibration_size, test_size=test_size, train_size=train_size)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(k) for k in range(NUM_LABELS)])}
    )

    def make(images, labels):
        return datasets.Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features)

    return datasets.DatasetDict(
        {
            "train": make(data.train_images, data.train_labels),
            "validation": make(data.calibration_images, data.calibration_labels),
            "test": make(data.test_images, data.test_labels),
        }
    )


def digits_image_processor(image_size: int = 16):
    """A ViT image processor for the digits: bilinear resize to ``image_size``, scale to [-1, 1]."""
    from transformers import ViTImageProcessor

    return ViTImageProcessor(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=2,  # PIL bilinear
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


class PixelDataset(torch.utils.data.Dataset):
    """Preprocessed images as a map-style dataset of ``{"pixel_values", "labels"}`` (what Trainer expects).

    Preprocessing happens once, here, with the same image processor the pipeline uses later.
    """

    def __init__(self, images: list, labels: np.ndarray, image_processor):
        # any sequence: a list, or a ``datasets`` column (``dataset["image"]``, which image processors refuse as such)
        self.pixel_values = torch.as_tensor(image_processor(images=list(images), return_tensors="np")["pixel_values"])
        self.labels = torch.as_tensor(np.asarray(list(labels)), dtype=torch.long)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


def tiny_vit(
    num_labels: int = NUM_LABELS,
    *,
    image_size: int = 16,
    patch_size: int = 4,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    **overrides: Any,
):
    """A small ``ViTForImageClassification`` from a config (random init, seeded): ~100k parameters at the defaults."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        num_channels=3,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=2 * hidden_size,
        num_labels=num_labels,
        id2label={i: str(i) for i in range(num_labels)},
        label2id={str(i): i for i in range(num_labels)},
        **overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ViTForImageClassification(config)


@torch.no_grad()
def predict_logits(model: torch.nn.Module, dataset: PixelDataset, batch_size: int = 256) -> np.ndarray:
    """Logits of ``model`` (eval mode) on every image of ``dataset``, as a float32 numpy array."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = [
            model(pixel_values=dataset.pixel_values[i : i + batch_size].to(device)).logits.float().cpu()
            for i in range(0, len(dataset), batch_size)
        ]
    finally:
        model.train(was_training)
    return torch.cat(out).numpy()


# ----------------------------------------------------------------------------- demo


@dataclass
class DemoConfig:
    """Settings of :func:`run_demo`; the defaults are the README's demo.

    Args:
        output_dir: where the diagrams, logits, model and calibrator are written.
        seed: seeds the split, the models, the FeDLaS gate, MaC-Cal and SMART (same seed → same table).
        epochs: training epochs per model (default 80: cross-entropy fits the 200 training images).
        maccal_epochs: epochs of the MaC-Cal stage (default 5, ``MaCCalConfig``'s). The stage retrains the head on
            the calibration split, held-out data as ``MaCCalConfig`` recommends, the same images the post-hoc
            calibrators are fitted on.
        train_size: keep only this many training images (default 200; ``None``: all 997 left after the held-out
            splits, where cross-entropy is close to calibrated).
        calibration_size / test_size: held-out images for the calibrators / for the table.
        image_size: the 8x8 digits are resized to this (the ViT's input size).
        hidden_size, num_layers: the ViT's width and depth.
        batch_size, learning_rate: Trainer settings (AdamW, linear decay).
        n_bins: bins of every binned metric.
        num_threads: torch CPU threads while the demo runs (1 is fastest for this tiny model on a busy
            machine); ``None`` leaves torch's setting alone.
        pipeline_images: test images sent through the image-classification pipeline.
        progress: show progress bars (on a terminal; elsewhere one log line per training epoch).
    """

    output_dir: str = "hf_calibration_demo"
    seed: int = 0
    epochs: int = 80
    maccal_epochs: int = 5
    train_size: int | None = 200
    calibration_size: int = 400
    test_size: int = 400
    image_size: int = 16
    hidden_size: int = 64
    num_layers: int = 2
    batch_size: int = 32
    learning_rate: float = 3e-3
    n_bins: int = 15
    num_threads: int | None = 1
    pipeline_images: int = 4
    progress: bool = True

    def __post_init__(self):
        check_int(self.seed, "seed", minimum=0)
        check_int(self.epochs, "epochs", minimum=1)
        check_int(self.maccal_epochs, "maccal_epochs", minimum=1)
        if self.train_size is not None:
            check_int(self.train_size, "train_size", minimum=1)
        check_int(self.calibration_size, "calibration_size", minimum=50)  # SMART's documented floor
        check_int(self.test_size, "test_size", minimum=1)
        check_int(self.image_size, "image_size", minimum=4)
        if self.image_size % 4:
            raise ValueError(
                f"Expected argument `image_size` to be a multiple of the patch size 4, but got {self.image_size}."
            )
        check_int(self.hidden_size, "hidden_size", minimum=4)
        if self.hidden_size % 4:
            raise ValueError(
                f"Expected argument `hidden_size` to be a multiple of the 4 attention heads, but got {self.hidden_size}."
            )
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.batch_size, "batch_size", minimum=1)
        check_float(self.learning_rate, "learning_rate", minimum=0.0, min_inclusive=False)
        check_int(self.n_bins, "n_bins", minimum=1)
        if self.num_threads is not None:
            check_int(self.num_threads, "num_threads", minimum=1)
        check_int(self.pipeline_images, "pipeline_images", minimum=0)
        if not isinstance(self.progress, bool):
            raise TypeError(f"Expected argument `progress` to be a bool, but got {self.progress!r}.")
        if self.pipeline_images > self.test_size:
            raise ValueError(
                f"Expected argument `pipeline_images` to be at most test_size={self.test_size}, but got {self.pipeline_images}."
            )


@dataclass
class PipelineRow:
    image: int
    label: str
    predicted: str
    score: float  # the pipeline's top score without the calibrator
    calibrated_score: float  # the same top score with SMART attached


@dataclass
class DemoResult:
    """What :func:`run_demo` measured and wrote."""

    table: str  # the one table (Markdown), deterministic given the seed
    reports: dict  # row name → CalibrationReport
    regime: str  # one sentence: is cross-entropy over-confident here, measured
    verdict: str  # one line: which methods lowered ECE against cross-entropy
    pipeline: list[PipelineRow]
    files: dict[str, Path]  # what was written, by role
    seconds: float
    temperatures: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # stage → seconds
    held_out: dict[str, dict] = field(default_factory=dict)  # model → SMART's held-out check (fit_info_)
    shipped: str = "SMART"  # the calibrator saved beside the CE model: SMART unless its held-out check failed

    def summary(self) -> str:
        n = self.reports[next(iter(self.reports))].n
        lines = [
            "",
            f"Calibration on scikit-learn digits, test split ({n} images). {self.regime}",
            "",
            self.table,
            "",
            self.verdict,
            "",
        ]
        if self.temperatures:
            lines.append("Temperature scaling: " + ", ".join(f"{k} T = {v:.3f}" for k, v in self.temperatures.items()))
        if self.held_out:
            checks = [
                f"{name} {r['uncalibrated_nll']:.4f} -> {r['cross_fitted_nll']:.4f}"
                + (" (worse: its parameters overfit this few samples)" if r["worse"] else "")
                for name, r in self.held_out.items()
            ]
            lines.append(
                f"SMART's held-out check (NLL, each calibration image calibrated by a fit on the other "
                f"{next(iter(self.held_out.values()))['folds'] - 1} of 5 folds): " + "; ".join(checks) + "."
            )
            if self.shipped != "SMART":
                lines.append(
                    f"Saved beside the CE model: {self.shipped}, not SMART, whose held-out check on the CE model failed."
                )
        if self.pipeline:
            lines += [
                "",
                f'pipeline("image-classification") on test images, top-1 score without / with {self.shipped} attached:',
                "",
            ]
            lines.append("| image | label | predicted | score | calibrated score |")
            lines.append("|---:|---:|---:|---:|---:|")
            for r in self.pipeline:
                lines.append(f"| {r.image} | {r.label} | {r.predicted} | {r.score:.4f} | {r.calibrated_score:.4f} |")
        lines += ["", "Written:"]
        lines += [f"  {role}: {path}" for role, path in self.files.items()]
        stages = ", ".join(f"{k} {v:.0f} s" for k, v in self.timings.items())
        lines.append(f"\nDone in {self.seconds:.0f} s" + (f" ({stages})." if stages else "."))
        return "\n".join(lines)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _interactive(config: DemoConfig) -> bool:
    """Progress bars only where someone watches them: on a terminal."""
    return config.progress and sys.stderr.isatty()


def _epoch_logger(name: str):
    """A callback that logs one line per epoch (the non-terminal stand-in for the Trainer's progress bar)."""
    from transformers import TrainerCallback

    class EpochLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                logger.info(
                    "%s: epoch %d/%d, loss %.4f",
                    name,
                    round(state.epoch or 0),
                    round(args.num_train_epochs),
                    logs["loss"],
                )

    return EpochLog()


def _train(name: str, loss, train: PixelDataset, config: DemoConfig, workdir: str):
    from transformers import PrinterCallback, TrainingArguments

    from hf_calibration.training.trainer import CalibrationTrainer

    log_epochs = config.progress and not _interactive(config)
    model = tiny_vit(
        image_size=config.image_size, hidden_size=config.hidden_size, num_layers=config.num_layers, seed=config.seed
    )
    args = TrainingArguments(
        output_dir=str(Path(workdir) / _slug(name)),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        weight_decay=0.05,
        warmup_steps=0.1,
        lr_scheduler_type="linear",
        seed=config.seed,
        data_seed=config.seed,
        save_strategy="no",
        logging_strategy="epoch" if log_epochs else "no",
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=not _interactive(config),
    )
    trainer = CalibrationTrainer(model=model, args=args, train_dataset=train, compute_loss_func=loss)
    trainer.remove_callback(PrinterCallback)  # it would print its logs to stdout, beside the table
    if log_epochs:
        trainer.add_callback(_epoch_logger(name))
    logger.info("Training the ViT with %s (%d epochs on %d images)", name, config.epochs, len(train))
    trainer.train()
    return trainer.model


class DigitsLogits(NamedTuple):
    """Held-out logits of the demo's cross-entropy ViT (float32, (N, 10)) and their labels (int64)."""

    val_logits: np.ndarray  # the calibration split: fit calibrators here
    val_labels: np.ndarray
    test_logits: np.ndarray  # the test split: measure here
    test_labels: np.ndarray


def digits_logits(
    seed: int = 0, *, epochs: int = 80, train_size: int = 200, calibration_size: int = 400, test_size: int = 400
) -> DigitsLogits:
    """Real logits to try the metrics and calibrators on without a model of your own: offline, in seconds.

    The logits of :func:`digits_model` (the demo's cross-entropy ViT, same seed and settings: the demo's
    ``logits_vit_ce.npz``) on the calibration (``val``) and test splits of :func:`digits_splits`. The model fits its
    ``train_size`` training digits, so it is over-confident on held-out images, as fine-tuned models usually are.
    Trained once and kept with the model (see :func:`digits_model`): a second call trains nothing and returns fresh
    copies.
    """
    _, logits = _digits_model(seed, epochs, train_size, calibration_size, test_size)
    return DigitsLogits(*(a.copy() for a in logits))


def digits_model(
    seed: int = 0, *, epochs: int = 80, train_size: int = 200, calibration_size: int = 400, test_size: int = 400
):
    """The demo's tiny ViT trained with cross-entropy on the digits, in eval mode, and its image processor.

    Trained exactly as :func:`run_demo` trains its cross-entropy model (same seed, same settings), on ``train_size``
    images of :func:`digits_splits` for ``epochs`` epochs, the first time these arguments are asked for. The trained
    weights and their held-out logits are then kept in the user's cache (:func:`digits_cache_dir`), keyed by the
    arguments, the demo's code and the versions of hf-calibration, torch and transformers, so a later process loads
    them in about a second instead of training again; where that folder cannot be written, each process trains its
    own. Each call returns a fresh copy of the model. Returns ``(model, image_processor)``: a stand-in for a
    fine-tuned classifier.
    """
    model, _ = _digits_model(seed, epochs, train_size, calibration_size, test_size)
    return copy.deepcopy(model), digits_image_processor(DemoConfig.image_size)


DIGITS_CACHE_FORMAT = 1  # the layout of a cached stand-in (weights.safetensors, logits.npz, key.json)


@functools.lru_cache(maxsize=2)
def _digits_model(seed: int, epochs: int, train_size: int, calibration_size: int, test_size: int):
    """The trained stand-in and its held-out logits: from this process's memory, else from the user's cache
    (:func:`digits_cache_dir`), else trained and kept there for the next process."""
    config = DemoConfig(
        seed=seed,
        epochs=epochs,
        train_size=train_size,
        calibration_size=calibration_size,
        test_size=test_size,
        progress=False,
    )
    key = _digits_key(config)
    folder = digits_cache_dir() / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    found = _load_digits(folder, key, config)
    if found is not None:
        return found
    from filelock import FileLock

    try:  # one process trains, another waiting on the same stand-in loads what it wrote
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder) + ".lock")
        lock.acquire()
    except OSError as err:
        logger.warning(
            "The digits cache %s cannot be written (%s): training the stand-in for this process.", folder, err
        )
        return _train_digits(config)
    try:
        found = _load_digits(folder, key, config)
        if found is None:
            found = _train_digits(config)
            _save_digits(folder, key, *found)
        return found
    finally:
        lock.release()


def digits_cache_dir() -> Path:
    """Where :func:`digits_model` keeps its trained stand-ins: ``$HF_HOME/hf_calibration/digits``
    (``~/.cache/huggingface/hf_calibration/digits`` by default), beside ``predict_logits``'s logits cache."""
    from hf_calibration.io.logits_cache import default_cache_dir

    return default_cache_dir().parent / "digits"


def _digits_key(config: DemoConfig) -> dict:
    """Everything the trained weights depend on: the recipe (the settings, this module's code), the versions."""
    import transformers

    from hf_calibration._core.version import __version__

    settings = {k: v for k, v in config.__dict__.items() if k not in ("output_dir", "pipeline_images", "progress")}
    return {
        "format": DIGITS_CACHE_FORMAT,
        "settings": settings,
        "recipe": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "versions": {
            "hf-calibration": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }


def _load_digits(folder: Path, key: dict, config: DemoConfig):
    """The cached ``(model, logits)`` in ``folder``, or None (absent, another key, or unreadable: trained again)."""
    if not (folder / "key.json").is_file():
        return None
    from safetensors.torch import load_file

    try:
        if json.loads((folder / "key.json").read_text()) != key:
            return None
        model = tiny_vit(
            image_size=config.image_size, hidden_size=config.hidden_size, num_layers=config.num_layers, seed=config.seed
        )
        model.load_state_dict(load_file(folder / "weights.safetensors"))
        with np.load(folder / "logits.npz", allow_pickle=False) as data:
            logits = DigitsLogits(*(data[name] for name in DigitsLogits._fields))
    except Exception as err:  # whatever a damaged entry raises (safetensors has its own error): train again
        logger.warning("Ignoring the unreadable digits cache entry %s (%s): training the stand-in again.", folder, err)
        return None
    logger.info("Loaded the trained digits stand-in from %s", folder)
    return model.eval(), logits


def _save_digits(folder: Path, key: dict, model, logits: DigitsLogits) -> None:
    """Write the entry into a temporary folder renamed into place: a crashed or concurrent run never leaves half of
    one. A cache that cannot be written is a warning, never an error."""
    import shutil

    from safetensors.torch import save_file

    staging = None
    try:
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        save_file(model.state_dict(), staging / "weights.safetensors")
        np.savez(staging / "logits.npz", **logits._asdict())
        (staging / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True))
        shutil.rmtree(folder, ignore_errors=True)  # an unreadable entry of the same key (we hold its lock)
        staging.rename(folder)
    except OSError as err:
        logger.warning(
            "Could not keep the trained digits stand-in in %s (%s); it is trained again next time.", folder, err
        )
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _digits_datasets(config: DemoConfig):
    """The digits splits of ``config``, their image processor and their train / calibration / test
    :class:`PixelDataset`."""
    data = digits_splits(
        config.seed, calibration_size=config.calibration_size, test_size=config.test_size, train_size=config.train_size
    )
    processor = digits_image_processor(config.image_size)
    train = PixelDataset(data.train_images, data.train_labels, processor)
    cal = PixelDataset(data.calibration_images, data.calibration_labels, processor)
    test = PixelDataset(data.test_images, data.test_labels, processor)
    return data, processor, train, cal, test


def _train_digits(config: DemoConfig):
    from hf_calibration.losses import CrossEntropyLoss

    _, _, train, cal, test = _digits_datasets(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.num_threads)
    try:
        with tempfile.TemporaryDirectory(prefix="hf_calibration_digits_") as workdir:
            model = _train("cross-entropy", CrossEntropyLoss(), train, config, workdir).eval()
        logits = DigitsLogits(
            predict_logits(model, cal), cal.labels.numpy(), predict_logits(model, test), test.labels.numpy()
        )
    finally:
        torch.set_num_threads(threads)
    return model, logits


def run_demo(config: DemoConfig | None = None, **overrides: Any) -> DemoResult:
    """Run the whole demo (see the module docstring); ``run_demo(epochs=2, train_size=200)`` for a quick one.

    Returns:
        :class:`DemoResult`; ``print(result.summary())`` shows what ``hf-calibration demo`` prints.
    """
    if config is None:
        config = DemoConfig(**overrides)
    elif overrides:
        config = DemoConfig(**{**config.__dict__, **overrides})
    if not isinstance(config, DemoConfig):
        raise TypeError(f"Expected argument `config` to be a DemoConfig, but got {type(config).__name__}.")
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    bars = hf_logging.is_progress_bar_enabled()
    if bars and not _interactive(config):  # transformers' own bars (saving, loading weights): not in a log file
        hf_logging.disable_progress_bar()
    try:
        with _writing_into(Path(config.output_dir)):
            return _run(config)
    finally:
        torch.set_num_threads(threads)
        if bars:
            hf_logging.enable_progress_bar()


LOCK_NAME = ".hf_calibration_demo.lock"


@contextlib.contextmanager
def _writing_into(out: Path):
    """Hold ``out``'s lock file while a demo writes there: a second demo started on the same folder stops at once with
    ``BlockingIOError``, where it used to run to the end and leave one seed's table beside the other's model and figures.
    The operating system releases the lock when the process ends, however it ends."""
    from filelock import FileLock, Timeout

    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise BlockingIOError(
            f"Another hf-calibration demo is writing into {out}/ right now: wait for it to finish, or give this one "
            "another `output_dir`."
        ) from None
    try:
        yield
    finally:
        lock.release()


def _run(config: DemoConfig) -> DemoResult:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from transformers import pipeline

    from hf_calibration.calibrators import HeldOutWorseWarning, SMARTCalibrator, TemperatureScaling, load_calibrator
    from hf_calibration.io.logits_files import save_logits
    from hf_calibration.losses import CrossEntropyLoss, FeDLaSLoss
    from hf_calibration.maccal import MaCCalConfig, maccal_stage
    from hf_calibration.metrics import calibration_report, format_reports, reliability_diagram

    start = time.perf_counter()
    timings: dict[str, float] = {}
    clock = [start]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        timings[stage] = timings.get(stage, 0.0) + now - clock[0]
        clock[0] = now

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}

    logger.info("Loading scikit-learn's digits (offline)")
    data, processor, train, cal, test = _digits_datasets(config)
    lap("data")

    # 1. train with cross-entropy and with FeDLaS; MaC-Cal on a copy of the cross-entropy model
    with tempfile.TemporaryDirectory(prefix="hf_calibration_demo_") as workdir:
        ce_model = _train("cross-entropy", CrossEntropyLoss(), train, config, workdir)
        torch.manual_seed(config.seed)  # the FeDLaS gate's initialisation
        fedlas_model = _train("FeDLaS-LS", FeDLaSLoss(num_classes=NUM_LABELS, variant="ls"), train, config, workdir)
    logger.info(
        "MaC-Cal stage on a copy of the cross-entropy model (%d epochs on the calibration split)", config.maccal_epochs
    )
    maccal_model = copy.deepcopy(ce_model)
    maccal_stage(
        maccal_model, cal, MaCCalConfig(epochs=config.maccal_epochs, seed=config.seed, progress=_interactive(config))
    )

    models = {"CE": ce_model, "FeDLaS-LS": fedlas_model}
    ce_train_accuracy = float((predict_logits(ce_model, train).argmax(1) == train.labels.numpy()).mean())
    logits = {name: (predict_logits(m, cal), predict_logits(m, test)) for name, m in models.items()}
    maccal_test = predict_logits(maccal_model, test)
    lap("training")

    # 2. post-hoc calibrators fitted on the calibration split
    rows: dict[str, np.ndarray] = {}
    temperatures: dict[str, float] = {}
    held_out: dict[str, dict] = {}
    shipped_ce = None
    for name, (z_cal, z_test) in logits.items():
        logger.info("Fitting temperature scaling and SMART for the %s model on %d held-out images", name, len(cal))
        ts = TemperatureScaling().fit(z_cal, cal.labels.numpy(), progress_bar=_interactive(config))
        with warnings.catch_warnings():  # its held-out check is stated in the summary, and decides what is shipped
            warnings.simplefilter("ignore", HeldOutWorseWarning)
            smart = SMARTCalibrator(seed=config.seed).fit(z_cal, cal.labels.numpy(), progress_bar=_interactive(config))
        check = smart.fit_info_.get("held_out_check")
        if check is not None:
            held_out[name] = check
        temperatures[name] = float(ts.temperature(z_test[:1])[0])
        with torch.no_grad():
            rows[name] = z_test
            rows[f"{name} + TS"] = ts(torch.from_numpy(z_test)).numpy()
            rows[f"{name} + SMART"] = smart(torch.from_numpy(z_test)).numpy()
        if shipped_ce is None:  # the CE model's: SMART, unless its own held-out check says it overfits
            shipped_ce = ("temperature scaling", ts) if check is not None and check["worse"] else ("SMART", smart)
        path = out / f"logits_vit_{_slug(name)}.npz"
        save_logits(
            path, val=(z_cal, cal.labels.numpy()), test=(z_test, test.labels.numpy()), overwrite=True
        )  # the demo's own folder
        files[f"logits ({name}; val = calibration split)"] = path
    rows["CE + MaC-Cal"] = maccal_test
    lap("calibrators")

    # 3. one table, reliability diagrams
    y_test = test.labels.numpy()
    reports = {name: calibration_report(z, y_test, config.n_bins) for name, z in rows.items()}
    table = format_reports(reports)
    regime = _regime(reports["CE"], rows["CE"], ce_train_accuracy, len(train))
    verdict = _verdict(reports)
    (out / "calibration_table.md").write_text(table + "\n")
    files["table"] = out / "calibration_table.md"
    for name, z in rows.items():
        path = out / f"reliability_{_slug(name)}.png"
        reliability_diagram(z, y_test, config.n_bins, title=f"ViT {name} (digits test)").savefig(path, dpi=100)
        files[f"reliability diagram ({name})"] = path
    path = out / "reliability_margin_groups_ce_smart.png"
    reliability_diagram(
        rows["CE + SMART"], y_test, config.n_bins, margin_groups=3, title="ViT CE + SMART by logit margin"
    ).savefig(path, dpi=100)
    files["reliability by margin group (CE + SMART)"] = path
    lap("metrics and diagrams")

    # 4. share: model + processor + calibrator in one folder, load back, attach, pipeline
    model_dir = out / "vit_ce"
    ce_model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    shipped, calibrator_ce = shipped_ce
    calibrator_ce.save_pretrained(
        model_dir / "calibrator", overwrite=True
    )  # replaces the previous run's calibrator only
    files[f"model + image processor + {shipped} calibrator"] = model_dir
    pipeline_rows: list[PipelineRow] = []
    if config.pipeline_images:
        logger.info("Loading %s back and running pipeline('image-classification') with %s attached", model_dir, shipped)
        classifier = pipeline("image-classification", model=str(model_dir), device="cpu")
        calibrator = load_calibrator(model_dir, subfolder="calibrator")
        images = data.test_images[: config.pipeline_images]
        before = classifier(images, top_k=1)
        calibrator.attach(classifier.model)
        try:
            after = classifier(images, top_k=1)
        finally:
            calibrator.detach()
        for i, (b, a) in enumerate(zip(before, after)):
            pipeline_rows.append(
                PipelineRow(i, str(int(data.test_labels[i])), b[0]["label"], float(b[0]["score"]), float(a[0]["score"]))
            )
    lap("save, load, pipeline")

    return DemoResult(
        table=table,
        reports=reports,
        regime=regime,
        verdict=verdict,
        pipeline=pipeline_rows,
        files=files,
        seconds=time.perf_counter() - start,
        temperatures=temperatures,
        timings=timings,
        held_out=held_out,
        shipped=shipped,
    )


def _regime(report, logits: np.ndarray, train_accuracy: float, n_train: int) -> str:
    """One sentence on the regime measured: does cross-entropy fit its training set, is it over-confident on test?"""
    confidence = float(torch.from_numpy(logits).double().softmax(-1).max(-1).values.mean())
    over = report.o_ece > report.u_ece
    head = "Regime: over-confident" if over else "Regime: not over-confident"
    return (
        f"{head}: cross-entropy fits its {n_train} training images to {100 * train_accuracy:.2f} % and on the test split "
        f"its mean confidence is {100 * confidence:.2f} % for an accuracy of {100 * report.accuracy:.2f} % "
        f"(O-ECE {100 * report.o_ece:.2f} %, U-ECE {100 * report.u_ece:.2f} %)."
    )


def _verdict(reports: dict) -> str:
    """One line: the rows whose ECE is below cross-entropy's, and those that are not (with the direction they err in)."""
    base = reports["CE"].ece
    lower = [name for name, r in reports.items() if name != "CE" and r.ece < base]
    higher = [
        f"{name} ({'under' if r.u_ece > r.o_ece else 'over'}-confident)"
        for name, r in reports.items()
        if name != "CE" and r.ece >= base
    ]
    text = f"Verdict: against CE's ECE of {100 * base:.2f} %, "
    text += ("lowered by " + ", ".join(lower)) if lower else "no method lowered it"
    return text + (f"; not lowered by {', '.join(higher)}." if higher else ".")


# ----------------------------------------------------------------------------- text and audio stand-ins

_POSITIVE = ("good", "great", "fine", "lovely", "superb")
_NEGATIVE = ("bad", "awful", "dull", "poor", "weak")
_NEUTRAL = ("the", "film", "plot", "was", "a", "movie", "acting", "story", "and")
_TONES = ((200.0, 400.0), (800.0, 1200.0), (2000.0, 3000.0))  # Hz: the audio stand-in's three classes
_RATE = 16000


def _splits(make, sizes: dict[str, int], seed: int):
    import datasets

    rng = np.random.default_rng(seed)
    return datasets.DatasetDict({name: make(rng, n) for name, n in sizes.items()})


def text_dataset(seed: int = 0, *, size: int = 400, train_size: int = 80):
    """A sentiment stand-in for a text dataset: ``train`` (``train_size`` rows: a small fine-tuning set, which leaves
    the fine-tuned model over-confident) / ``validation`` / ``test`` (``size`` rows) splits of short reviews (``text``)
    with a ``label`` (``ClassLabel`` negative / positive) that follows the count of positive and negative words,
    noisily (a review with as many of each is a coin toss)."""
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )

    def make(rng, n):
        texts, labels = [], []
        for _ in range(n):
            polar = rng.integers(1, 4)
            positive = int(rng.integers(0, polar + 1))
            words = list(rng.choice(_POSITIVE, positive)) + list(rng.choice(_NEGATIVE, polar - positive))
            words += list(rng.choice(_NEUTRAL, rng.integers(1, 4)))
            rng.shuffle(words)
            texts.append(" ".join(words))
            labels.append(int(rng.random() < 1 / (1 + np.exp(-1.5 * (2 * positive - polar)))))
        return datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features)

    return _splits(make, {"train": train_size, "validation": size, "test": size}, seed)


def _word_tokenizer():
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = [*_POSITIVE, *_NEGATIVE, *_NEUTRAL]
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        model_max_length=32,
    )


def _fit(model, batches, steps: int, lr: float):
    from hf_calibration._core.threads import torch_single_threaded

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    with torch_single_threaded():  # tiny matrices: threads cost more than they give
        for step in range(steps):
            loss = model(**batches[step % len(batches)]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def tiny_text_classifier(seed: int = 0, *, steps: int = 150):
    """``(model, tokenizer)``: a one-layer ``BertForSequenceClassification`` built from a config and a word-level
    tokenizer (no download), fine-tuned for ``steps`` steps on :func:`text_dataset`'s ``train`` split: a stand-in for
    your fine-tuned text classifier, over-confident as fine-tuned models are. A second or two on a CPU."""
    import transformers

    torch.manual_seed(seed)
    tokenizer = _word_tokenizer()
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    train = text_dataset(seed)["train"][:]  # a dict of lists
    batches = [
        {
            **tokenizer(train["text"][i : i + 32], padding=True, return_tensors="pt"),
            "labels": torch.tensor(train["label"][i : i + 32]),
        }
        for i in range(0, len(train["label"]), 32)
    ]
    return _fit(transformers.BertForSequenceClassification(config), batches, steps, 3e-3), tokenizer


def audio_dataset(seed: int = 0, *, size: int = 200, train_size: int = 50, sampling_rate: int = _RATE):
    """An audio stand-in: ``train`` (``train_size`` rows) / ``validation`` / ``test`` (``size`` rows) splits of noisy
    quarter-second tones in three frequency bands (``label``: low / mid / high), in an ``audio`` column of
    ``{"array", "sampling_rate"}`` rows (what a ``datasets.Audio`` column decodes to)."""
    import datasets

    def make(rng, n):
        labels = rng.integers(0, len(_TONES), n)
        t = np.arange(sampling_rate // 4) / sampling_rate
        audio = []
        for k in labels:
            tone = np.sin(2 * np.pi * rng.uniform(*_TONES[k]) * t + rng.uniform(0, 2 * np.pi))
            audio.append(
                {"array": (tone + rng.normal(0, 1.5, t.size)).astype(np.float32), "sampling_rate": sampling_rate}
            )
        features = datasets.Features(
            {
                "audio": {
                    "array": datasets.Sequence(datasets.Value("float32")),
                    "sampling_rate": datasets.Value("int64"),
                },
                "label": datasets.ClassLabel(names=["low", "mid", "high"]),
            }
        )
        return datasets.Dataset.from_dict({"audio": audio, "label": labels.tolist()}, features=features)

    return _splits(make, {"train": train_size, "validation": size, "test": size}, seed)


def tiny_audio_classifier(seed: int = 0, *, steps: int = 40):
    """``(model, feature_extractor)``: a one-layer ``Wav2Vec2ForSequenceClassification`` built from a config, with a
    16 kHz ``Wav2Vec2FeatureExtractor``, fine-tuned for ``steps`` steps on :func:`audio_dataset`'s ``train`` split: a
    stand-in for your fine-tuned audio classifier. A few seconds on a CPU."""
    import transformers

    torch.manual_seed(seed)
    extractor = transformers.Wav2Vec2FeatureExtractor(sampling_rate=_RATE, return_attention_mask=True)
    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(16, 16),
        conv_stride=(5, 4),
        conv_kernel=(10, 4),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
        id2label={0: "low", 1: "mid", 2: "high"},
        label2id={"low": 0, "mid": 1, "high": 2},
    )
    train = audio_dataset(seed)["train"][:]  # a dict of lists
    batches = []
    for i in range(0, len(train["label"]), 25):
        waves = [np.asarray(a["array"], dtype=np.float32) for a in train["audio"][i : i + 25]]
        features = extractor(waves, sampling_rate=_RATE, return_tensors="pt")
        batches.append({**features, "labels": torch.tensor(train["label"][i : i + 25])})
    return _fit(transformers.Wav2Vec2ForSequenceClassification(config), batches, steps, 3e-3), extractor
