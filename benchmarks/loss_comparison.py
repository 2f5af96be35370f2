"""Calibration of a tiny ViT trained on scikit-learn's digits with each training loss, over several seeds.

CE, LS, MbLS, FLSD-53, FeDLaS-LS and FeDLaS-MbLS, each trained with `CalibrationTrainer` from the same
random init per seed, evaluated on a held-out validation and test split: mean ± std of accuracy, ECE,
AdaECE, O-ECE and U-ECE (15 bins, percent). Writes ``benchmarks/results/loss_comparison.md`` and prints it.

    python benchmarks/loss_comparison.py                  # 6 losses x 3 seeds, ~4-8 min on 1 CPU thread
    python benchmarks/loss_comparison.py --epochs 5 --seeds 0   # quick look
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _data import TensorDictDataset  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name → (get_loss name, kwargs); hyper-parameters are the papers' CIFAR-10 defaults (DESIGN.md)
LOSSES = {
    "CE": ("ce", {}),
    "LS (α=0.05)": ("ls", {"alpha": 0.05}),
    "MbLS (m=6, λ=0.1)": ("mbls", {"margin": 6.0, "lam": 0.1}),
    "FLSD-53": ("flsd53", {}),
    "FeDLaS-LS (α=0.05, β=4)": ("fedlas_ls", {"base": 0.05, "beta": 4.0, "theta": 0.95}),
    "FeDLaS-MbLS (λ=0.1, β=0.5, m=6)": ("fedlas_mbls", {"base": 0.1, "beta": 0.5, "margin": 6.0, "theta": 0.95}),
}
METRICS = ("accuracy", "ece", "adaece", "o_ece", "u_ece")
HEADERS = ("Accuracy", "ECE", "AdaECE", "O-ECE", "U-ECE")


def _example():
    """The example's tiny ViT (one definition of the demo model)."""
    path = ROOT / "examples" / "train_with_calibrated_loss.py"
    spec = importlib.util.spec_from_file_location("train_with_calibrated_loss", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def digits_splits(split_seed: int = 0):
    """60 / 20 / 20 stratified train / val / test split of the 1797 digits, fixed across model seeds."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.from_numpy((data.images / 16.0).astype(np.float32))[:, None]
    y = torch.from_numpy(data.target.astype(np.int64))
    idx = np.arange(len(y))
    train, rest = train_test_split(idx, test_size=0.4, random_state=split_seed, stratify=data.target)
    val, test = train_test_split(rest, test_size=0.5, random_state=split_seed, stratify=data.target[rest])
    return {name: TensorDictDataset(x[i], y[i]) for name, i in (("train", train), ("val", val), ("test", test))}


def run_one(loss_name: str, loss_kwargs: dict, seed: int, splits: dict, args, tiny_vit) -> dict:
    from transformers import PrinterCallback, TrainingArguments

    from hf_calibration import CalibrationTrainer
    from hf_calibration.losses import get_loss
    from hf_calibration.metrics import calibration_report

    kwargs = dict(loss_kwargs)
    if loss_name.startswith("fedlas"):
        kwargs["num_classes"] = 10
    model = tiny_vit(10, args.hidden_size, args.layers, seed=seed)
    torch.manual_seed(seed)  # the FeDLaS gate's init
    loss = get_loss(loss_name, **kwargs)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            learning_rate=args.lr,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=512,
            warmup_steps=30,
            weight_decay=0.05,
            seed=seed,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_pin_memory=False,
            use_cpu=True,
        )
        trainer = CalibrationTrainer(model=model, args=training, train_dataset=splits["train"], compute_loss_func=loss)
        trainer.remove_callback(PrinterCallback)  # keep the console to the progress bar and the table
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        result = {"seconds": seconds}
        for split in ("val", "test"):
            pred = trainer.predict(splits[split])
            report = calibration_report(pred.predictions, pred.label_ids)
            result[split] = {m: float(report[m]) for m in METRICS}
    return result


def _cell(values: list[float]) -> str:
    v = 100 * np.asarray(values)
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" if len(v) > 1 else f"{v.mean():.2f}"


def table(results: dict, split: str) -> str:
    lines = ["| loss | " + " | ".join(f"{h} (%)" for h in HEADERS) + " |", "|---|" + "---:|" * len(HEADERS)]
    for name, runs in results.items():
        cells = [_cell([r[split][m] for r in runs]) for m in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=float, default=40)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--hidden_size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable timings on a shared box)")
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "loss_comparison.md")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    tiny_vit = _example().tiny_vit
    splits = digits_splits()
    results: dict[str, list[dict]] = {name: [] for name in args.losses}
    start = time.perf_counter()
    jobs = [(name, seed) for name in args.losses for seed in args.seeds]
    for name, seed in tqdm(jobs, desc="loss x seed"):
        loss_name, kwargs = LOSSES[name]
        results[name].append(run_one(loss_name, kwargs, seed, splits, args, tiny_vit))
    total = time.perf_counter() - start

    text = report(results, splits, args, argv, total)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return text


def _summary(results: dict) -> list[str]:
    """What the numbers say, computed from them (so a re-run cannot leave a stale sentence behind)."""
    mean = {name: {m: 100 * np.mean([r["test"][m] for r in runs]) for m in METRICS} for name, runs in results.items()}
    best = min(mean, key=lambda name: mean[name]["ece"])
    lines = [f"- Lowest mean test ECE: **{best}** ({mean[best]['ece']:.2f} %)."]
    if "CE" in mean:
        ce = mean["CE"]
        side = "over" if ce["o_ece"] > ce["u_ece"] else "under"
        lines.append(
            f"- CE's own miscalibration is mostly {side}-confidence (O-ECE {ce['o_ece']:.2f} % vs U-ECE "
            f"{ce['u_ece']:.2f} %). Every other loss is built to reduce over-confidence; where a loss has a larger "
            "U-ECE than CE it has pushed the model past calibration into under-confidence."
        )
        worse = [name for name in mean if name != "CE" and mean[name]["ece"] > ce["ece"]]
        if worse:
            lines.append(f"- Higher test ECE than CE: {', '.join(worse)}.")
    lines.append(
        "- Caveat: a 1k-image, 10-class problem and a tiny model, with hyper-parameters taken from the papers' "
        "CIFAR-10 settings, not tuned here; this says how the losses behave in this regime, not on CIFAR / ImageNet."
    )
    return lines


def report(results: dict, splits: dict, args, argv, total: float) -> str:
    import transformers

    n = {k: len(v) for k, v in splits.items()}
    per_run = np.mean([r["seconds"] for runs in results.values() for r in runs])
    command = " ".join(["python benchmarks/loss_comparison.py", *(sys.argv[1:] if argv is None else argv)])
    text = "\n".join(
        [
            "## Training losses on digits: calibration of a tiny ViT (loss_comparison.py)",
            "",
            f"- Machine: {platform.machine()} {platform.processor() or ''} ({os.cpu_count()} cores, {args.threads} "
            f"torch thread(s)), Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}.",
            f"- Command: `{command}`",
            f"- Data: scikit-learn digits, stratified split {n['train']} train / {n['val']} val / {n['test']} test "
            "(split fixed; the seed changes the init, the FeDLaS gate init and the batch order).",
            f"- Model: ViT from a config, random init, 1x8x8 input, patch 2, width {args.hidden_size}, "
            f"{args.layers} layers; AdamW lr {args.lr}, 30 warm-up steps then linear decay, weight decay 0.05, "
            f"batch {args.batch_size}, {args.epochs:g} epochs, trained with `CalibrationTrainer`.",
            "- Loss hyper-parameters: the papers' CIFAR-10 defaults, not tuned on this data. "
            "Metrics: 15 bins, percent, mean ± std (ddof 1) over seeds " + ", ".join(map(str, args.seeds)) + ".",
            f"- Wall time: {total:.0f} s in all, {per_run:.1f} s per training run.",
            "",
            "### Reading",
            "",
            *_summary(results),
            "",
            "### Test split",
            "",
            table(results, "test"),
            "",
            "### Validation split",
            "",
            table(results, "val"),
            "",
        ]
    )
    return text


if __name__ == "__main__":
    main()
