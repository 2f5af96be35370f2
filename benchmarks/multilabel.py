"""Sigmoid heads on real images: every sigmoid calibrator fitted on validation logits and scored on test logits.

Two tasks built from the CIFAR-10 images of ``../shared/data/cifar10_jpeg.npz`` (decoded once into ``--cache`` by
``shift.prepare``: 40,000 train / 5,000 validation / 10,000 test images):

* multi-label: 2 x 2 mosaics of four images, each tile average-pooled to 16 x 16 (a 32 x 32 mosaic); the labels are
  the classes present (1 to 4 of the 10). Train mosaics draw their tiles from the train images, validation mosaics
  from the validation images, test mosaics from the test images.
* binary: cat vs dog (CIFAR-10 classes 3 and 5), 32 x 32, one logit (``problem_type="multi_label_classification"``,
  ``num_labels=1``).

Each model is a small ResNet from transformers' config (basic blocks, widths 16 / 32 / 64), trained from scratch
through ``hf_calibration.CalibrationTrainer`` with ``BinaryCrossEntropyLoss`` and AdamW (no augmentation), one run per
seed. Its validation and test logits are
cached in ``--cache``; the results go to ``--out`` (JSON, one record per task and seed: re-running skips what is done).

Every method is fitted on the validation logits only and scored on the test logits: ECE (15 bins), NLL (binary
cross-entropy) and Brier, macro (the mean over labels) and pooled (every (image, label) pair), with 95 % bootstrap
intervals over the test images (seed 0). Methods: this package's sigmoid calibrators and ``AutoCalibrator``;
scikit-learn's ``CalibratedClassifierCV`` (sigmoid, isotonic, and temperature where the installed version has it) on
the same logits, one label at a time (a frozen estimator whose decision function is the label's logit); netcal's
binary methods (logistic, beta, histogram binning; BBQ and ENIR on the binary task) on the same probabilities. The
binary ECE of every method's test probabilities is also computed by torchmetrics' ``BinaryCalibrationError``.

    python benchmarks/multilabel.py                        # both tasks, seeds 0 1 2 (resumable)
    python benchmarks/multilabel.py --tasks binary --seeds 0
    python benchmarks/multilabel.py --report-only          # rewrite the markdown from the JSON
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("benchmarks.multilabel")

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# AdamW: with SGD (lr 0.05, as benchmarks/training_cifar.py trains softmax heads) the multi-label BCE stayed at the prior's
# 0.64 for four epochs (validation NLL 0.689 after three epochs on 5,120 mosaics, AdamW 0.594)
SETTINGS = {
    "multilabel": {
        "train": 12000,
        "val": 4000,
        "test": 8000,
        "epochs": 8,
        "lr": 3e-3,
        "batch": 128,
        "widths": (16, 32, 64),
    },
    "binary": {"epochs": 12, "lr": 2e-3, "batch": 128, "widths": (16, 32, 64)},
}
OURS = {
    "sigmoid TS (one T)": ("sigmoid_temperature_scaling", {}),
    "sigmoid TS (T per label)": ("sigmoid_temperature_scaling", {"per_label": True}),
    "Platt": ("platt", {}),
    "beta": ("beta", {}),
    "isotonic": ("sigmoid_isotonic", {}),
    "histogram binning": ("sigmoid_histogram_binning", {}),
}
N_BOOT = 1000


# ----------------------------------------------------------------------------- data


def load_cifar(npz: Path, cache: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from shift import load_split, prepare

    if not (cache / "cifar10_u8.npz").is_file():
        logger.info("decoding %s into %s (once)", npz, cache)
        prepare(str(npz), cache, seed=0)
    return {name: load_split(cache, name) for name in ("train", "val", "test")}


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 or float (N, H, W, 3) in [0, 255] → normalised float32 (N, 3, H, W)."""
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).permute(0, 3, 1, 2).div_(255)
    return ((x - MEAN) / STD).contiguous()


def mosaics(x: np.ndarray, y: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 2 x 2 mosaics of tiles drawn uniformly from ``x`` (each average-pooled to 16 x 16) and their multi-hot
    labels (the classes present)."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(y), size=(n, 4))
    tiles = x.reshape(len(y), 16, 2, 16, 2, 3).mean(axis=(2, 4), dtype=np.float32)  # (N, 16, 16, 3)
    t = tiles[pick]  # (n, 4, 16, 16, 3)
    top = np.concatenate([t[:, 0], t[:, 1]], axis=2)
    bottom = np.concatenate([t[:, 2], t[:, 3]], axis=2)
    images = np.concatenate([top, bottom], axis=1)  # (n, 32, 32, 3)
    labels = np.zeros((n, 10), dtype=np.float32)
    np.put_along_axis(labels, y[pick], 1.0, axis=1)
    return images, labels


def task_data(task: str, cifar: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if task == "multilabel":
        s = SETTINGS[task]
        return {name: mosaics(*cifar[name], s[name], seed=100 + i) for i, name in enumerate(("train", "val", "test"))}
    out = {}
    for name in ("train", "val", "test"):
        x, y = cifar[name]
        keep = np.isin(y, (3, 5))
        out[name] = (x[keep].astype(np.float32), (y[keep] == 5).astype(np.float32))  # dog = 1
    return out


# ----------------------------------------------------------------------------- training


def make_model(task: str, seed: int):
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    w = list(SETTINGS[task]["widths"])
    config = ResNetConfig(
        num_channels=3,
        embedding_size=w[0],
        hidden_sizes=w,
        depths=[1] * len(w),
        layer_type="basic",
        downsample_in_first_stage=False,
        num_labels=10 if task == "multilabel" else 1,
        problem_type="multi_label_classification",
    )
    return ResNetForImageClassification(config)


def train_and_predict(task: str, seed: int, data: dict, cache: Path, progress: bool) -> dict[str, np.ndarray]:
    """Train one model through CalibrationTrainer; its val / test logits (cached)."""
    path = cache / f"{task}_seed{seed}.npz"
    if path.is_file():
        return dict(np.load(path))
    from _data import TensorDictDataset
    from transformers import TrainingArguments

    from hf_calibration import CalibrationTrainer
    from hf_calibration.losses import BinaryCrossEntropyLoss

    s = SETTINGS[task]
    tensors = {name: TensorDictDataset(to_tensor(x), torch.from_numpy(y)) for name, (x, y) in data.items()}
    steps = s["epochs"] * -(-len(data["train"][1]) // s["batch"])
    args = TrainingArguments(
        output_dir=str(cache / f"run_{task}_{seed}"),
        per_device_train_batch_size=s["batch"],
        per_device_eval_batch_size=1000,
        num_train_epochs=s["epochs"],
        learning_rate=s["lr"],
        optim="adamw_torch",
        weight_decay=5e-4,
        lr_scheduler_type="linear",
        warmup_steps=max(1, steps // 10),
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="epoch",
        report_to="none",
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        use_cpu=True,
    )
    trainer = CalibrationTrainer(
        model=make_model(task, seed), args=args, train_dataset=tensors["train"], compute_loss=BinaryCrossEntropyLoss()
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    out = {}
    for name in ("val", "test"):
        prediction = trainer.predict(tensors[name])
        out[f"logits_{name}"] = prediction.predictions.astype(np.float32)
        out[f"labels_{name}"] = data[name][1].astype(np.int64)
    out["train_seconds"] = np.array(seconds)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, **out)
    return out


# ----------------------------------------------------------------------------- peers


def _sklearn_methods() -> list[str]:
    from sklearn.calibration import CalibratedClassifierCV

    methods = ["sigmoid", "isotonic"]
    try:  # temperature scaling came with scikit-learn 1.8
        from sklearn.frozen import FrozenEstimator

        rng = np.random.default_rng(0)
        x = rng.normal(size=(40, 1))
        CalibratedClassifierCV(
            FrozenEstimator(_LogitColumn().fit(x, (x[:, 0] > 0).astype(int))), method="temperature"
        ).fit(x, (x[:, 0] > 0).astype(int))
        methods.append("temperature")
    except (ValueError, TypeError, ImportError):
        pass
    return methods


class _LogitColumn:
    """A fitted binary 'classifier' whose decision function is one column of its input (the label's logit)."""

    _estimator_type = "classifier"

    def __init__(self, column: int = 0):
        self.column = column

    def fit(self, X, y):
        self.classes_ = np.array([0, 1])
        return self

    def decision_function(self, X):
        return np.asarray(X)[:, self.column]

    def predict(self, X):
        return (self.decision_function(X) > 0).astype(int)

    def get_params(self, deep=True):
        return {"column": self.column}

    def set_params(self, **params):
        self.column = params.get("column", self.column)
        return self

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier", target_tags=TargetTags(required=True), classifier_tags=ClassifierTags()
        )


def sklearn_probabilities(method: str, z_val, y_val, z_test) -> np.ndarray:
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator

    out = np.empty(z_test.shape)
    for l in range(z_val.shape[1]):
        estimator = FrozenEstimator(_LogitColumn(l).fit(z_val, y_val[:, l]))
        model = CalibratedClassifierCV(estimator, method=method).fit(z_val, y_val[:, l].astype(int))
        out[:, l] = model.predict_proba(z_test)[:, 1]
    return out


def netcal_probabilities(name: str, p_val, y_val, p_test) -> np.ndarray:
    from netcal import binning, scaling

    make = {
        "logistic": lambda: scaling.LogisticCalibration(),
        "beta": lambda: scaling.BetaCalibration(),
        "histogram": lambda: binning.HistogramBinning(bins=15),
        "BBQ": lambda: binning.BBQ(),
        "ENIR": lambda: binning.ENIR(),
    }[name]
    out = np.empty(p_test.shape)
    for l in range(p_val.shape[1]):
        model = make()
        model.fit(p_val[:, l].astype(np.float64), y_val[:, l].astype(int))
        out[:, l] = np.asarray(model.transform(p_test[:, l].astype(np.float64)), dtype=np.float64).reshape(-1)
    return out


# ----------------------------------------------------------------------------- scores


def scores(p: np.ndarray, y: np.ndarray, task: str, with_ci: bool) -> dict:
    """Test-set scores of probabilities ``p`` (N, L): macro / pooled ECE, NLL, Brier (with the package's 95 % bootstrap
    intervals, one paired set of resamples for all), per-label ECE."""
    from hf_calibration.metrics.bootstrap import Bootstrap
    from hf_calibration.metrics.multilabel import _intervals, _values, prepare_sigmoid

    inputs = prepare_sigmoid(p, y[:, 0] if task == "binary" else y, task=task, from_logits=False)
    names = ("ece", "nll", "brier")
    found = _intervals(inputs, names, 15, Bootstrap(0.95, N_BOOT, 0)) if with_ci else {}
    out = {}
    for name in names:
        per_label, macro, micro = _values(inputs, name, 15)
        out[f"{name}_macro"], out[f"{name}_micro"] = macro, micro
        if name == "ece":
            out["ece_per_label"] = per_label.tolist()
        if name in found:
            _, mac, mic = found[name]
            out[f"{name}_macro_ci"], out[f"{name}_micro_ci"] = [mac.low, mac.high], [mic.low, mic.high]
    out["accuracy"] = float(((p > 0.5) == (y > 0.5)).mean())
    return out


EDGES = np.linspace(0.0, 1.0, 16)


def torchmetrics_check(p: np.ndarray, y: np.ndarray) -> float:
    """Largest |our binary ECE - torchmetrics' BinaryCalibrationError| over labels (15 bins, l1). NaN when some
    probability sits exactly on a bin edge: torchmetrics' bins are [lo, hi) with p = 1.0 in a phantom 16th bin (its
    issue #3510), ours (lo, hi] (Guo et al.); a step calibrator (isotonic, histogram binning, BBQ) outputs such values."""
    from torchmetrics.functional.classification import binary_calibration_error

    from hf_calibration.metrics import ece

    worst = 0.0
    for l in range(p.shape[1]):
        if np.isin(p[:, l], EDGES).any():
            return float("nan")
        theirs = float(
            binary_calibration_error(torch.from_numpy(p[:, l]).double(), torch.from_numpy(y[:, l]).long(), n_bins=15)
        )
        ours = ece(p[:, l], y[:, l].astype(np.int64), task="binary", from_logits=False)
        worst = max(worst, abs(theirs - ours))
    return worst


def evaluate(task: str, logits: dict, seed: int) -> dict:
    from hf_calibration.calibrators import AutoCalibrator, create_calibrator

    z_val, z_test = logits["logits_val"].astype(np.float64), logits["logits_test"].astype(np.float64)
    y_val = logits["labels_val"].reshape(len(z_val), -1)
    y_test = logits["labels_test"].reshape(len(z_test), -1)
    z_val, z_test = z_val.reshape(len(z_val), -1), z_test.reshape(len(z_test), -1)
    p_val, p_test = 1 / (1 + np.exp(-z_val)), 1 / (1 + np.exp(-z_test))
    with_ci = seed == 0
    fit_task = task
    methods: dict[str, dict] = {}

    def record(name: str, family: str, fit, seconds: float | None = None):
        start = time.perf_counter()
        try:
            p = fit()
        except Exception as err:  # noqa: BLE001 - a peer that fails is a row saying so
            methods[name] = {"family": family, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
            logger.warning("%s failed: %s", name, err)
            return
        elapsed = time.perf_counter() - start if seconds is None else seconds
        p = np.clip(np.asarray(p, dtype=np.float64).reshape(p_test.shape), 0.0, 1.0)
        methods[name] = {
            "family": family,
            "fit_seconds": elapsed,
            **scores(p, y_test, task, with_ci),
            "torchmetrics_max_abs_diff": torchmetrics_check(p, y_test),
        }
        logger.info(
            "%s / seed %d / %s: ECE %.4f NLL %.4f",
            task,
            seed,
            name,
            methods[name]["ece_macro"],
            methods[name]["nll_macro"],
        )

    record("uncalibrated", "model", lambda: p_test, 0.0)
    for name, (kind, kw) in OURS.items():
        if task == "binary" and kw.get("per_label"):
            continue  # one label: the same as one T
        record(
            name,
            "hf_calibration",
            lambda kind=kind, kw=kw: (
                create_calibrator(kind, **kw)
                .fit(z_val, y_val, task=fit_task, progress_bar=False)
                .predict_proba(z_test)
                .numpy()
            ),
        )
    auto = {}

    def fit_auto():
        calibrator = AutoCalibrator().fit(z_val, y_val, task=fit_task, progress_bar=False)
        auto["chosen"] = calibrator.method_
        return calibrator.predict_proba(z_test).numpy()

    record("AutoCalibrator", "hf_calibration", fit_auto)
    if "AutoCalibrator" in methods:
        methods["AutoCalibrator"]["chosen"] = auto.get("chosen")
    for method in _sklearn_methods():
        record(
            f"sklearn {method}",
            "scikit-learn",
            lambda method=method: sklearn_probabilities(method, z_val, y_val, z_test),
        )
    for name in ("logistic", "beta", "histogram") + (("BBQ", "ENIR") if task == "binary" else ()):
        record(f"netcal {name}", "netcal", lambda name=name: netcal_probabilities(name, p_val, y_val, p_test))
    return {
        "task": task,
        "seed": seed,
        "num_labels": int(y_test.shape[1]),
        "n_val": int(len(z_val)),
        "n_test": int(len(z_test)),
        "train_seconds": float(logits.get("train_seconds", np.nan)),
        "positive_rate_test": float(y_test.mean()),
        "methods": methods,
    }


# ----------------------------------------------------------------------------- report


def _mean_std(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "inf" if values is not None else "-"
    if len(values) == 1:
        return f"{scale * values[0]:.{digits}f}"
    return f"{scale * np.mean(values):.{digits}f} ± {scale * np.std(values, ddof=1):.{digits}f}"


def _cell(records: list[dict], method: str, key: str, scale: float, digits: int) -> str:
    values = [r["methods"].get(method, {}).get(key) for r in records]
    if any(v is None for v in values):
        return "failed" if any("error" in r["methods"].get(method, {}) for r in records) else "-"
    if any(not math.isfinite(v) for v in values):
        return "inf"
    return _mean_std(values, scale, digits)


def section(task: str, records: list[dict]) -> list[str]:
    records = sorted(records, key=lambda r: r["seed"])
    seeds = [r["seed"] for r in records]
    methods = list(records[0]["methods"])
    first = records[0]
    title = (
        "Multi-label: 2 x 2 mosaics of CIFAR-10 images, 10 labels (the classes present)"
        if task == "multilabel"
        else "Binary: cat vs dog (CIFAR-10), one logit"
    )
    lines = [
        f"### {title}",
        "",
        f"Validation (fit) {first['n_val']:,} images, test {first['n_test']:,} images; positive rate on test "
        f"{100 * first['positive_rate_test']:.1f} %; training {_mean_std([r['train_seconds'] for r in records], 1, 0)} s "
        f"per model; seeds {', '.join(map(str, seeds))} (mean ± std over seeds).",
        "",
    ]
    if task == "multilabel":
        header = (
            "| method | family | ECE macro (%) | ECE pooled (%) | NLL macro | NLL pooled | Brier macro | "
            "acc @0.5 (%) | fit (s) |"
        )
        rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
        keys = [
            ("ece_macro", 100, 2),
            ("ece_micro", 100, 2),
            ("nll_macro", 1, 4),
            ("nll_micro", 1, 4),
            ("brier_macro", 1, 4),
            ("accuracy", 100, 2),
            ("fit_seconds", 1, 2),
        ]
    else:
        header = "| method | family | ECE (%) | NLL | Brier | acc @0.5 (%) | fit (s) |"
        rule = "|---|---|---:|---:|---:|---:|---:|"
        keys = [
            ("ece_macro", 100, 2),
            ("nll_macro", 1, 4),
            ("brier_macro", 1, 4),
            ("accuracy", 100, 2),
            ("fit_seconds", 1, 2),
        ]
    lines += [header, rule]
    for method in methods:
        family = first["methods"][method].get("family", "")
        lines.append(
            f"| {method} | {family} | " + " | ".join(_cell(records, method, k, s, d) for k, s, d in keys) + " |"
        )
    lines.append("")
    # NLL against the uncalibrated model, seed by seed
    worse = []
    for method in methods:
        if method == "uncalibrated":
            continue
        over = [
            r["seed"]
            for r in records
            if method in r["methods"]
            and "nll_macro" in r["methods"][method]
            and not r["methods"][method]["nll_macro"] <= r["methods"]["uncalibrated"]["nll_macro"]
        ]
        failed = [r["seed"] for r in records if "error" in r["methods"].get(method, {})]
        if over:
            worse.append(f"{method} (seed{'s' if len(over) > 1 else ''} {', '.join(map(str, over))})")
        if failed:
            worse.append(
                f"{method} failed on seed(s) {', '.join(map(str, failed))}: {records[0]['methods'][method].get('error', '')}"
            )
    lines.append(
        "**Test NLL against the uncalibrated model (macro):** "
        + (
            "every method is at or below it on every seed."
            if not worse
            else "above it — " + "; ".join(worse) + ". Every other method is at or below it on every seed."
        )
    )
    chosen = [r["methods"].get("AutoCalibrator", {}).get("chosen") for r in records]
    lines += ["", f"AutoCalibrator (5-fold CV on the validation logits) chose: {', '.join(str(c) for c in chosen)}."]
    diffs = [
        r["methods"][m].get("torchmetrics_max_abs_diff")
        for r in records
        for m in r["methods"]
        if "error" not in r["methods"][m]
    ]
    finite = [d for d in diffs if d is not None and math.isfinite(d)]
    lines += [
        "",
        f"Binary ECE against torchmetrics' `BinaryCalibrationError` (15 bins, l1), per label on every method's test "
        f"probabilities: largest |difference| {max(finite):.2e} over {len(finite)} method x seed cases"
        + (
            f" ({len(diffs) - len(finite)} cases not compared: a probability exactly on a bin edge, where torchmetrics' "
            "[lo, hi) bins and its phantom bin at p = 1.0 differ from the (lo, hi] bins by design)"
            if len(finite) < len(diffs)
            else ""
        )
        + ".",
    ]
    # intervals, seed 0
    if any(k.endswith("_ci") for k in first["methods"]["uncalibrated"]):
        lines += [
            "",
            f"Seed {first['seed']} with 95 % bootstrap intervals over the test images ({N_BOOT} resamples, every label "
            "of an image together; each metric's interval method, `hf_calibration.metrics.bootstrap.INTERVALS`: basic "
            "(bias-corrected) for ECE, percentile for NLL. A bias-corrected ECE interval can lie below its estimate, as "
            "the macro ECE's do here: the binned ECE of each label is biased upwards by more than the spread of a "
            "mean over 10 labels, and the interval is where the true value lies, the estimate corrected for "
            "that bias; the package's own output notes it):",
            "",
        ]
        cols = (
            [("ece_macro", 100, 2), ("ece_micro", 100, 2), ("nll_macro", 1, 4), ("nll_micro", 1, 4)]
            if task == "multilabel"
            else [("ece_macro", 100, 2), ("nll_macro", 1, 4), ("brier_macro", 1, 4)]
        )
        names = {
            "ece_macro": "ECE macro (%)" if task == "multilabel" else "ECE (%)",
            "ece_micro": "ECE pooled (%)",
            "nll_macro": "NLL macro" if task == "multilabel" else "NLL",
            "nll_micro": "NLL pooled",
            "brier_macro": "Brier macro" if task == "multilabel" else "Brier",
        }
        lines += ["| method | " + " | ".join(names[k] for k, _, _ in cols) + " |", "|---|" + "---:|" * len(cols)]
        for method, values in first["methods"].items():
            if "error" in values:
                continue
            cells = []
            for k, s, d in cols:
                v, (lo, hi) = values[k], values.get(f"{k}_ci", (float("nan"), float("nan")))
                cells.append(f"{s * v:.{d}f} [{s * lo:.{d}f}, {s * hi:.{d}f}]" if math.isfinite(v) else "inf")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if task == "multilabel":
        best = min(
            (m for m in methods if m != "uncalibrated" and "ece_per_label" in first["methods"][m]),
            key=lambda m: first["methods"][m]["nll_macro"],
        )
        lines += [
            "",
            f"Per-label test ECE (%), seed {first['seed']}: uncalibrated and the lowest macro NLL ({best}):",
            "",
            "| label | " + " | ".join(CLASSES) + " | macro | pooled |",
            "|---|" + "---:|" * 12,
        ]
        for method in ("uncalibrated", best):
            v = first["methods"][method]
            lines.append(
                f"| {method} | "
                + " | ".join(f"{100 * x:.2f}" for x in v["ece_per_label"])
                + f" | {100 * v['ece_macro']:.2f} | {100 * v['ece_micro']:.2f} |"
            )
    return lines + [""]


def markdown(data: dict, command: str) -> str:
    lines = [
        "## Sigmoid heads on real images: multi-label mosaics and cat vs dog (`benchmarks/multilabel.py`)",
        "",
        "Small ResNets (transformers `ResNetConfig`, basic blocks, widths 16 / 32 / 64) trained from scratch on CPU "
        "through `CalibrationTrainer` with `BinaryCrossEntropyLoss` and AdamW, no augmentation (multi-label: 12,000 "
        "mosaics, 8 epochs; binary: the 8,000 training cats and dogs, 12 epochs); every calibrator fitted on the "
        "validation logits, scored on the test logits. scikit-learn (`CalibratedClassifierCV` on a frozen estimator "
        "whose decision function is the label's logit) and netcal run one label at a time on the same logits / "
        "probabilities. Macro = the mean over labels of each label's value; pooled = every (image, label) pair as one "
        "binary problem. NLL is the binary cross-entropy.",
        "",
        f"- Machine: {data['machine']}; load average at the start {data['load']}.",
        f"- Command: `{command}`",
        "",
    ]
    for task in ("multilabel", "binary"):
        records = [r for r in data["records"].values() if r["task"] == task]
        if records:
            lines += section(task, records)
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", default=str(ROOT.parent / "shared" / "data" / "cifar10_jpeg.npz"))
    p.add_argument("--cache", default=str(ROOT / ".data" / "multilabel"))
    p.add_argument("--tasks", nargs="+", default=["multilabel", "binary"], choices=["multilabel", "binary"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=str(HERE / "results" / "multilabel.json"))
    p.add_argument("--md", default=str(HERE / "results" / "multilabel.md"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("hf_calibration").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    out, md = Path(args.out), Path(args.md)
    data = json.loads(out.read_text()) if out.is_file() else {"records": {}}
    command = (
        "python benchmarks/multilabel.py"
        + ("" if args.tasks == ["multilabel", "binary"] else f" --tasks {' '.join(args.tasks)}")
        + ("" if args.seeds == [0, 1, 2] else f" --seeds {' '.join(map(str, args.seeds))}")
    )
    if not args.report_only:
        data["machine"] = (
            f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} threads"
        )
        data["load"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        cifar = None
        for task in args.tasks:
            task_sets = None
            for seed in args.seeds:
                key = f"{task}/{seed}"
                if key in data["records"]:
                    continue
                cache = Path(args.cache)
                if not (cache / f"{task}_seed{seed}.npz").is_file():
                    cifar = cifar if cifar is not None else load_cifar(Path(args.npz), cache)
                    task_sets = task_sets if task_sets is not None else task_data(task, cifar)
                logits = train_and_predict(task, seed, task_sets, cache, args.progress)
                data["records"][key] = evaluate(task, logits, seed)
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1, allow_nan=True))
                tmp.replace(out)
                md.write_text(markdown(data, command))
    md.write_text(markdown(data, command))
    print(md.read_text())


if __name__ == "__main__":
    main()
