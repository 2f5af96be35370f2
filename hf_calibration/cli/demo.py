"""``hf-calibration demo``: the whole product on scikit-learn's digits, offline."""

from __future__ import annotations

import argparse

from hf_calibration.cli._common import add_option, writable_dir

HELP = "train, calibrate, compare and share on scikit-learn's digits (offline)"
DESCRIPTION = """The whole product on built-in data: fine-tune a tiny ViT with cross-entropy and with FeDLaS (CalibrationTrainer),
run MaC-Cal, fit temperature scaling and SMART, print one table, write reliability diagrams, save / load / attach
SMART and run an image-classification pipeline.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(
        p,
        "output_dir",
        default="hf_calibration_demo",
        metavar="DIR",
        help="where diagrams, logits, the model and the calibrator go (default ./hf_calibration_demo)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of everything (same seed → same table)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs per model (default 80)")
    add_option(p, "maccal_epochs", type=int, default=None, help="MaC-Cal stage epochs (default 5)")
    add_option(
        p,
        "train_size",
        type=int,
        default=None,
        help="use only this many training images (default 200: CE fits them and is over-confident)",
    )
    add_option(
        p, "calibration_size", type=int, default=None, help="held-out images to fit the calibrators on (default 400)"
    )
    add_option(p, "test_size", type=int, default=None, help="held-out images the table is measured on (default 400)")
    add_option(p, "num_threads", type=int, default=1, help="torch CPU threads (default 1: fastest for this tiny model)")
    add_option(p, "pipeline_images", type=int, default=4, help="test images sent through the pipeline (default 4)")
    add_option(p, "no_progress", action="store_true", help="hide progress bars")


def run(args) -> int:
    from hf_calibration.demo import DemoConfig, run_demo

    given = {
        "output_dir": args.output_dir,
        "seed": args.seed,
        "epochs": args.epochs,
        "maccal_epochs": args.maccal_epochs,
        "train_size": args.train_size,
        "calibration_size": args.calibration_size,
        "test_size": args.test_size,
        "num_threads": args.num_threads,
        "pipeline_images": args.pipeline_images,
        "progress": not args.no_progress,
    }
    config = DemoConfig(**{k: v for k, v in given.items() if v is not None})
    writable_dir(config.output_dir, "--output_dir")
    result = run_demo(config)
    print(result.summary())
    return 0
