"""Draw the documentation's pictures into docs/img/ from code and committed results; nothing is drawn by hand.

    python docs/make_figures.py            # all of them (runs the demo: about a minute on a laptop CPU)
    python docs/make_figures.py --only training_losses

* ``demo_*``: ``hf-calibration demo`` at its defaults (seed 0), run in a scratch folder: its reliability diagrams
  (cross-entropy, cross-entropy + SMART, SMART by logit-margin group), a before / after pair drawn from the
  logits it saved and the SMART calibrator it saved, and its printed summary, written into getting-started.md
  between its two ``the demo's summary`` markers (the page reads as it is on the repository's host too).
* ``measure_before_after.png``: ``digits_logits()`` before / after temperature scaling fitted on its val split,
  as measure.md draws it.
* ``training_losses.png``: test ECE of every training loss on CIFAR-10, from
  ``benchmarks/results/training_cifar.json`` (``benchmarks/training_cifar.py``).

The benchmark plots under ``benchmarks/results/`` are shown as they are (``docs/hooks.py``), not copied.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
DPI = 100
SUMMARY_MARKERS = ("<!-- the demo's summary: written by docs/make_figures.py -->", "<!-- end of the demo's summary -->")


def demo() -> None:
    import torch

    from hf_calibration.calibrators import load_calibrator
    from hf_calibration.demo import run_demo
    from hf_calibration.metrics import reliability_diagram

    with tempfile.TemporaryDirectory(prefix="hf_calibration_docs_") as scratch:
        result = run_demo(output_dir=scratch, seed=0, progress=False)
        out = Path(scratch)
        for source, name in (
            ("reliability_ce.png", "demo_reliability_ce.png"),
            ("reliability_ce_smart.png", "demo_reliability_ce_smart.png"),
            ("reliability_margin_groups_ce_smart.png", "demo_margin_groups.png"),
        ):
            shutil.copyfile(out / source, IMG / name)
        with np.load(out / "logits_vit_ce.npz") as data:
            z, y = data["logits_test"], data["labels_test"]
        smart = load_calibrator(out / "vit_ce" / "calibrator")
        with torch.no_grad():
            calibrated = smart(torch.from_numpy(z)).numpy()
        figure = reliability_diagram(
            z, y, calibrated=calibrated, title="the demo's ViT (cross-entropy), digits test split"
        )
        figure.savefig(IMG / "demo_before_after.png", dpi=DPI)
        summary = result.summary().replace(scratch, "hf_calibration_demo")
        summary = "\n".join(line for line in summary.splitlines() if not line.startswith("Done in"))  # this host's time
        page = ROOT / "docs" / "getting-started.md"
        start, end = SUMMARY_MARKERS
        before, rest = page.read_text().split(start + "\n")
        after = rest.split(end, 1)[1]
        page.write_text(before + start + "\n```text\n" + summary.strip() + "\n```\n" + end + after)


def measure() -> None:
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.demo import digits_logits
    from hf_calibration.metrics import reliability_diagram

    val_logits, val_labels, logits, labels = digits_logits()
    calibrator = TemperatureScaling().fit(val_logits, val_labels, progress_bar=False)
    figure = reliability_diagram(
        logits, labels, calibrated=calibrator(logits).numpy(), title="digits_logits(): before / after TS"
    )
    figure.savefig(IMG / "measure_before_after.png", dpi=DPI)


def training_losses() -> None:
    import matplotlib.pyplot as plt

    records = json.loads((ROOT / "benchmarks" / "results" / "training_cifar.json").read_text())["records"]
    regimes = {
        "overconfident": "CE fits its training images (no augmentation)",
        "wellfitted": "CE calibrated (crop + flip)",
    }
    losses = [name for name in dict.fromkeys(r["loss"] for r in records if r["stage"] == "stage1")]

    def ece(regime, loss, stage="stage1", key="ece"):
        values = [100 * r[key] for r in records if r["regime"] == regime and r["loss"] == loss and r["stage"] == stage]
        return (float(np.mean(values)), float(np.std(values))) if values else (np.nan, 0.0)

    rows = [(loss, {g: ece(g, loss) for g in regimes}) for loss in losses]
    rows += [
        ("CE + temperature scaling", {g: ece(g, "CE", key="ece_ts") for g in regimes}),
        ("CE + MaC-Cal (held-out)", {g: ece(g, "CE", "maccal") for g in regimes}),
        ("Mixup + MaC-Cal (held-out)", {g: ece(g, "Mixup", "maccal") for g in regimes}),
    ]
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.2))
    height = 0.38
    y = np.arange(len(rows))
    for i, (regime, label) in enumerate(regimes.items()):
        means = [r[1][regime][0] for r in rows]
        stds = [r[1][regime][1] for r in rows]
        ax.barh(y + (i - 0.5) * height, means, height, xerr=stds, label=label, capsize=2)
    ax.set_yticks(y, [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("test ECE (%), mean ± std over 3 seeds")
    ax.set_title("Training losses on CIFAR-10 (benchmarks/training_cifar.py)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(IMG / "training_losses.png", dpi=DPI)
    plt.close(fig)


FIGURES = {"demo": demo, "measure": measure, "training_losses": training_losses}


def main(argv: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="draw only these")
    args = parser.parse_args(argv)
    IMG.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIGURES:
        FIGURES[name]()
        print(f"drew {name}")


if __name__ == "__main__":
    main()
