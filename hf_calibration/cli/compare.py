"""``hf-calibration compare``: cross-validate every calibrator on a calibration set and print the table.

Also home of the selection options that ``fit --method auto`` shares (``add_selection_options``, ``fit_auto``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_calibration.cli._common import (
    CLIError,
    add_input_kind_option,
    add_option,
    dump_json,
    from_logits_of,
    method_kind,
    new_file,
    output_folder,
    save_diagram,
)
from hf_calibration.cli._inputs import add_input_options, load_inputs

SELECTION_METRICS = ("ece", "adaece", "smce", "nll", "brier")  # as hf_calibration.calibrators.selection.auto


def add_selection_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--methods`` / ``--metric`` / ``--cv`` (and friends) of the cross-validated choice, shared by ``compare`` and ``fit``."""
    p.add_argument(
        "--methods",
        metavar="A,B,...",
        help=f"{prefix}calibrators to {'choose from' if prefix else 'compare'}, or `default` / `all` (default: the "
        "default set, which leaves out matrix_scaling, dirichlet, pts, cts and isotonic_ovr; `all`: every registered one)",
    )
    p.add_argument(
        "--metric",
        choices=SELECTION_METRICS,
        default="ece",
        help=f"{prefix}what the best calibrator minimises on the held-out folds (default ece)",
    )
    p.add_argument(
        "--cv", type=int, default=5, help=f"{prefix}number of stratified folds of the calibration set (default 5)"
    )
    add_option(
        p,
        "fit_seeds",
        type=int,
        default=1,
        metavar="S",
        help=f"{prefix}fits per fold of a seeded method (SMART), scores averaged (default 1)",
    )
    add_option(
        p,
        "no_race",
        action="store_true",
        help=f"{prefix}run every candidate on every fold (default: stop, after each fold from the second, a candidate "
        "that a paired t-test finds worse than the uncalibrated model on NLL, or worse than the leader on --metric "
        "without a lower NLL)",
    )


def parse_methods(text: str | None):
    """``--methods ts,smart`` -> registered kinds; None -> ``"default"``; ``default`` / ``all`` as they are."""
    if text is None:
        return "default"
    if text.strip().lower() in ("default", "all"):
        return text.strip().lower()
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise CLIError("--methods: give a comma-separated list of calibrators, e.g. ts,smart,spline.")
    return list(dict.fromkeys(method_kind(name) for name in names))


def fit_auto(args, data, from_logits: bool, progress_bar: bool):
    """``fit --method auto``: an ``AutoCalibrator`` fitted on the loaded split, with the command's options."""
    from hf_calibration.calibrators import AutoCalibrator

    if args.objective is not None:
        raise CLIError("--objective does not apply to --method auto: every candidate fits its own default objective.")
    auto = AutoCalibrator(
        metric=args.metric,
        cv=args.cv,
        methods=parse_methods(args.methods),
        seed=0 if args.seed is None else args.seed,
        fit_seeds=args.fit_seeds,
        race=not args.no_race,
    )
    return auto.fit(
        data.logits, data.labels, from_logits=from_logits, progress_bar=progress_bar, task=getattr(data, "task", None)
    )


HELP = "cross-validate every calibrator on a calibration set"
DESCRIPTION = """Split the calibration set into stratified folds, fit each calibrator on the others and score it on the held-out fold
(accuracy change, ECE, AdaECE, smCE, NLL, Brier, fit time; mean ± std over folds). Only the given split is used.
Candidates that cannot win are stopped early (--no-race runs them all). With --out, writes one reliability diagram
per method from its held-out (out-of-fold) predictions.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_options(p, "which `logits_<split>` is the calibration set (default: plain `logits`, else `val`)")
    add_input_kind_option(p)
    add_selection_options(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the folds and the first fit seed (default 0)")
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write one reliability diagram per method here, reliability_<method>.png (default: none)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace diagrams already in --out")
    p.add_argument("--json", action="store_true", help="print the table as JSON (fractions, not percent)")
    add_paired_options(p)


def add_paired_options(p: argparse.ArgumentParser) -> None:
    """``--ci`` / ``--n-boot``: the paired bootstrap of every method against the best (``compare``)."""
    p.add_argument(
        "--ci",
        type=float,
        default=0.95,
        help="level of the paired bootstrap of each method against the best, on the pooled held-out "
        "predictions (default 0.95; 0 leaves it out)",
    )
    add_option(p, "n_boot", type=int, default=1000, metavar="B", help="resamples of that bootstrap (default 1000)")


def check_paired_options(args) -> None:
    """Before any work: ``--ci`` in (0, 1) or 0, ``--n-boot`` >= 10."""
    if args.ci and not 0 < args.ci < 1:
        raise CLIError(f"--ci: give a level in (0, 1) such as 0.95, or 0 to leave the bootstrap out; got {args.ci}.")
    if args.n_boot < 10:
        raise CLIError(f"--n-boot: give at least 10 resamples; got {args.n_boot}.")


def paired_section(args, table):
    """The paired bootstrap against the best by ``--metric`` (None with ``--ci 0`` or when no method qualifies)."""
    if not args.ci:
        return None
    try:
        return table.paired_bootstrap(args.metric, ci=args.ci, n_boot=args.n_boot)
    except ValueError as err:  # every method failed on some fold: the table says so already
        if "qualifies" in str(err) or "failed on some fold" in str(err):
            return None
        raise


def diagram_title(source: str, name: str, table) -> str:
    """Say which ECE the diagram shows (all held-out predictions pooled) and which the table shows (the fold mean)."""
    scores = table[name]
    return (
        f"{name} · {source}\nheld-out folds pooled (the table: mean over {table.cv} folds, "
        f"ECE {100 * scores.mean('ece'):.2f} ± {100 * scores.std('ece'):.2f} %)"
    )


def run(args) -> int:
    from hf_calibration.calibrators import compare_calibrators
    from hf_calibration.calibrators.selection.auto import UNCALIBRATED, _method_specs

    methods = parse_methods(args.methods)
    check_paired_options(args)
    out = output_folder(args.out, "--out") if args.out is not None else None  # never a model's folder
    data = load_inputs(args, default_split="val")
    task = data.task
    try:
        names = [UNCALIBRATED] + list(_method_specs(methods, task))
    except (TypeError, ValueError) as err:
        raise CLIError(f"--methods: {err}") from None
    paths = {}
    if out is not None:  # checked before the long part: never a file without --overwrite
        paths = {
            name: new_file(out / f"reliability_{name}.png", "--out", args.overwrite, inputs=[args.logits])
            for name in names
        }
    table = compare_calibrators(
        data.logits,
        data.labels,
        methods,
        cv=args.cv,
        seed=args.seed,
        metric=args.metric,
        race=not args.no_race,
        fit_seeds=args.fit_seeds,
        n_bins=args.n_bins,
        from_logits=from_logits_of(args, data.logits, task),
        keep_predictions=True,
        progress_bar=not args.json,
        task=task,
    )
    drawable = {}
    for name, path in paths.items():
        logits = table.predictions[name]
        keep = ~(logits != logits).reshape(logits.shape[0], -1).any(
            axis=1
        )  # folds where the method failed or stopped: NaN
        if keep.any():
            drawable[name] = (path, logits[keep], table.labels[keep])
    best = table.best(args.metric)  # "uncalibrated" when no method qualifies (the table's text says why)
    paired = paired_section(args, table)
    if args.json:  # the table first: a diagram that cannot be written never loses the comparison
        print(
            dump_json(
                {
                    "source": data.source,
                    "cv": args.cv,
                    "seed": args.seed,
                    "metric": args.metric,
                    "best": best,
                    "table": table.to_dict(),
                    "paired": None if paired is None else paired.to_dict(),
                    "diagrams": {name: str(path) for name, (path, _, _) in drawable.items()},
                }
            ),
            flush=True,
        )
    else:
        size = (
            f"K = {data.logits.shape[1]}" if task == "multiclass" else f"{task} head, L = {table.num_classes} label(s)"
        )
        print(f"{data.source} (N = {data.logits.shape[0]}, {size})")
        print(table)  # the table's text ends with the rule and the pick, as print(table) shows them
        if paired is not None:
            print()
            print(paired)
        sys.stdout.flush()
    for name, (path, logits, labels) in drawable.items():
        save_diagram(
            logits,
            labels,
            path,
            args.n_bins,
            diagram_title(data.source, name, table),
            from_logits=True,
            what="--out",
            task=task,
        )  # calibrated logits / log-probabilities, whatever the file held
    if paths and not args.json:
        print(
            f"reliability diagrams: {Path(args.out)}/reliability_<method>.png ({len(drawable)} written; each pools the "
            "held-out predictions of all folds, so its ECE is the pooled one, not the table's mean over folds)"
        )
    return 0
