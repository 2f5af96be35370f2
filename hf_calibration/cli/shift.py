"""``hf-calibration shift``: calibration of a model under the Hendrycks & Dietterich corruptions (and on OOD data).

    hf-calibration shift --model M --dataset D --split test [--calibrator C ...] [--corruptions all]
                         [--severities 1-5] [--ood-dataset D2] [--out DIR] [--json]

Each ``--calibrator`` is a method name (``ts``, ``smart``, ...: fitted on the clean ``--val-split``) or a folder
written by ``hf-calibration fit`` / ``save_pretrained`` (used as it is, its rows labelled by the folder). The spelling
decides: a path (``./smart``, ``runs/smart``, ``/abs/smart``) is a folder; a bare method name is the method, even with
a folder of that name here (a warning names the folder and its spelling); any other bare name is a folder. Two
spellings of one method (``ts`` and ``temperature_scaling``), or of one folder, are refused. Prints the table of
:class:`hf_calibration.shift.ShiftReport`; ``--out DIR`` also writes ``shift_report.json``, ``shift_report.txt``
and ``ece_vs_severity.png`` (an existing one only with ``--overwrite``). Logits go through the logits cache, one entry per corruption × severity.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_calibration.cli._common import CLIError, add_option, load_calibrator, method_kind, new_file, output_folder
from hf_calibration.cli._inputs import add_input_options

OUTPUTS = ("shift_report.json", "shift_report.txt", "ece_vs_severity.png")  # what --out DIR receives


def _severities(text: str) -> list[int]:
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-", 1))
            values = list(range(lo, hi + 1))
        else:
            values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected severities like 1-5 or 1,3,5, got {text!r}") from None
    if not values or any(v < 1 or v > 5 for v in values):
        raise argparse.ArgumentTypeError(f"severities are integers in 1-5, got {text!r}")
    return values


def _corruptions(text: str) -> list[str]:
    from hf_calibration.shift import CORRUPTIONS
    from hf_calibration.shift.parameters import BENCHMARK_CORRUPTIONS, EXTRA_CORRUPTIONS

    named = {"all": CORRUPTIONS, "benchmark": BENCHMARK_CORRUPTIONS, "extra": EXTRA_CORRUPTIONS}
    if text in named:
        return list(named[text])
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in CORRUPTIONS]
    if unknown or not values:
        raise argparse.ArgumentTypeError(
            f"unknown corruption(s) {unknown or text!r}; use all, benchmark, extra or names from: {', '.join(CORRUPTIONS)}"
        )
    return values


def _looks_like_a_path(text: str) -> bool:
    return text.startswith((".", "~", "/", "\\")) or "/" in text or "\\" in text or Path(text).is_absolute()


def _calibrators(items: list[str]) -> dict:
    """``--calibrator`` items → {row label: method kind, or loaded calibrator} (see the module docstring)."""
    import logging
    import os

    from hf_calibration.calibrators import get_calibrator_class, list_calibrators

    logger = logging.getLogger("hf_calibration.cli")
    seen: dict[str, str] = {}  # method kind or real folder path -> the item that named it
    calibrators = {}
    for item in items:
        path = Path(item).expanduser()
        bare_method = not _looks_like_a_path(item) and _method_or_none(item) is not None
        if bare_method:
            kind = _method_or_none(item)
            if path.is_dir():
                logger.warning(
                    "--calibrator %s: the %s method, fitted on --val-split; a folder %s is here too: write "
                    "./%s to use the saved calibrator.",
                    item,
                    kind,
                    item,
                    item,
                )
            key, label = kind, item.lower()
        elif path.is_dir():
            key, label = os.path.realpath(path), item
        elif _looks_like_a_path(item):
            raise CLIError(
                f"--calibrator {item!r}: no such folder (give the folder written by `hf-calibration fit` or "
                "save_pretrained)."
            )
        else:
            raise CLIError(
                f"--calibrator {item!r} is neither a method name (ts, {', '.join(list_calibrators())}) nor a "
                "folder here."
            )
        if key in seen:
            raise CLIError(
                f"--calibrator {item!r} and {seen[key]!r} name the same "
                f"{'method' if bare_method else 'folder'}: give it once."
            )
        seen[key] = item
        calibrators[label] = label if bare_method else load_calibrator(item)
        chosen = get_calibrator_class(kind) if bare_method else calibrators[label]
        if getattr(chosen, "_sigmoid_head", False):  # the shift report scores a softmax head
            raise CLIError(
                f"--calibrator {item!r} is a sigmoid (binary / multi-label) calibrator, but shift scores a softmax "
                f"(multi-class) head: choose from ts, {', '.join(list_calibrators('multiclass'))}."
            )
    return calibrators


def _method_or_none(text: str) -> str | None:
    try:
        return method_kind(text, "--calibrator")
    except CLIError:
        return None


def _same_split(a: str, b: str) -> bool:
    alias = {"val": "validation", "valid": "validation", "dev": "validation"}
    return alias.get(a.lower(), a.lower()) == alias.get(b.lower(), b.lower())


HELP = "calibration under corruptions (CIFAR-10-C / ImageNet-C) and on OOD data"
DESCRIPTION = """Accuracy, ECE, AdaECE, smCE and NLL of a model by corruption x severity, uncalibrated and with each calibrator
fitted on clean data; OOD AUROC / AUPR / FPR95 with --ood-dataset. Needs --model and --dataset (images to corrupt),
not --logits.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_options(p, "the clean test split, corrupted (default test)")
    add_option(
        p, "val_split", default="val", help="the clean split calibrators are fitted on (default val / validation)"
    )
    p.add_argument(
        "--calibrator",
        nargs="+",
        default=["ts", "smart"],
        metavar="C",
        help="method names (ts, smart, ...: fitted on --val-split) or calibrator folders (default: ts smart)",
    )
    p.add_argument(
        "--corruptions",
        type=_corruptions,
        default=None,
        metavar="LIST",
        help="all (19), benchmark (the 15, default), extra (4), or comma-separated names",
    )
    p.add_argument(
        "--severities", type=_severities, default=[1, 2, 3, 4, 5], metavar="S", help="1-5 (default) or e.g. 1,3,5"
    )
    add_option(p, "ood_dataset", metavar="D2", help="an out-of-distribution dataset: adds the OOD table")
    add_option(p, "ood_split", default=None, help="its split (default: its only split, else test)")
    p.add_argument("--seed", type=int, default=0, help="corruption seed (default 0)")
    p.add_argument(
        "--preset", choices=["cifar", "imagenet"], default=None, help="parameter table (default: by image size)"
    )
    p.add_argument(
        "--out", metavar="DIR", help="write shift_report.json, shift_report.txt and ece_vs_severity.png here"
    )
    p.add_argument("--overwrite", action="store_true", help="replace those files where they exist")
    p.add_argument("--json", action="store_true", help="print the report as JSON (fractions)")


def run(args) -> int:
    from hf_calibration.io.logits_cache import default_cache_dir
    from hf_calibration.shift.model import model_shift_report
    from hf_calibration.shift.parameters import BENCHMARK_CORRUPTIONS

    if args.logits is not None or args.labels is not None:
        raise CLIError("shift corrupts images: give --model M and --dataset D, not --logits.")
    if args.model is None or args.dataset is None:
        raise CLIError(f"missing {'--dataset' if args.model is not None else '--model'}")
    outputs = None
    if (
        args.out
    ):  # checked before any model runs: never a model's folder; the files are new, or --overwrite replaces them
        folder = output_folder(args.out, "--out")
        outputs = [new_file(folder / name, "--out file", args.overwrite) for name in OUTPUTS]
    from hf_calibration._core.checks import check_folder_or_hub_id

    check_folder_or_hub_id(args.model, "model")
    check_folder_or_hub_id(args.dataset, "dataset", "dataset")
    if args.ood_dataset is not None and not hasattr(args.ood_dataset, "features"):
        check_folder_or_hub_id(args.ood_dataset, "ood_dataset", "dataset")
    calibrators = _calibrators(args.calibrator)  # row label -> method kind or loaded calibrator
    split = args.split or "test"
    if any(isinstance(c, str) for c in calibrators.values()) and _same_split(args.val_split, split):
        import logging

        logging.getLogger("hf_calibration.cli").warning(
            "--val-split %s is the evaluated --split %s: the calibrators are fitted on the very samples they are scored "
            "on, so their numbers are optimistic (fit on a validation split).",
            args.val_split,
            split,
        )
    for value, flag in (
        (args.max_samples, "--max-samples"),
        (args.batch_size, "--batch-size"),
        (args.n_bins, "--n-bins"),
    ):
        if value is not None and value < 1:
            raise CLIError(f"{flag} must be at least 1, but got {value}.")
    report = model_shift_report(
        args.model, args.dataset, split=split, val_split=args.val_split, calibrators=calibrators,
        corruptions=args.corruptions or BENCHMARK_CORRUPTIONS, severities=args.severities,
        ood_dataset=args.ood_dataset, ood_split=args.ood_split, seed=args.seed, preset=args.preset,
        cache_dir=None if args.no_cache else (args.cache_dir or default_cache_dir()), n_bins=args.n_bins,
        batch_size=args.batch_size, image_column=(args.input_column or [None])[0], label_column=args.label_column,
        max_samples=args.max_samples, device=args.device, config_name=args.config, revision=args.revision,
        num_workers=args.num_workers,
    )  # fmt: skip
    print(report.to_json() if args.json else report.table())
    if outputs is not None:
        json_path, text_path, plot_path = outputs
        json_path.parent.mkdir(parents=True, exist_ok=True)
        report.to_json(str(json_path))
        text_path.write_text(report.table(full=True) + "\n")
        report.plot("ece").savefig(plot_path, dpi=120)
        if not args.json:
            print(f"written: {', '.join(map(str, outputs))}")
    return 0
