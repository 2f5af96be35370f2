"""``hf-calibration report``: the calibration metrics of saved logits (and their reliability diagram)."""

from __future__ import annotations

import argparse

from hf_calibration.cli._common import (
    CLIError,
    add_input_kind_option,
    add_option,
    diagram_file,
    dump_json,
    json_intervals,
    json_ready,
    save_diagram,
)
from hf_calibration.cli._inputs import add_input_options, load_inputs

HELP = "print the calibration metrics of saved logits, or of a model on a dataset"
DESCRIPTION = """Accuracy, ECE, AdaECE, MCE, classwise ECE, O-/U-ECE, smCE, smECE, Brier and NLL of saved logits, or of a model run
over a dataset (percent, two decimals, as the papers print them).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_options(p, "which `logits_<split>` to read (default: plain `logits`, else `test`)")
    p.add_argument("--calibrator", metavar="DIR", help="apply this calibrator (folder written by `fit`) first")
    add_input_kind_option(p)
    p.add_argument("--diagram", metavar="PNG", help="write a reliability diagram to this file")
    add_option(
        p,
        "margin_groups",
        type=int,
        default=None,
        metavar="G",
        help="with --diagram: one diagram per logit-margin group (G equal-count groups)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --diagram file")
    p.add_argument("--json", action="store_true", help="print the report as JSON (fractions, not percent)")
    p.add_argument(
        "--ci",
        type=float,
        default=None,
        metavar="LEVEL",
        help="add a bootstrap interval to every metric, e.g. --ci 0.95 (and to the diagram's ECE): basic "
        "(bias-corrected) for the calibration errors, percentile for accuracy / Brier / NLL, none for MCE",
    )
    add_option(
        p,
        "n_boot",
        type=int,
        default=None,
        metavar="B",
        help="resamples of that bootstrap (default 1000; 200 for smCE, smECE and classwise ECE)",
    )


def run(args) -> int:
    from hf_calibration.metrics import calibration_report
    from hf_calibration.metrics.bootstrap import check_bootstrap

    try:  # before any work
        check_bootstrap(args.ci, args.n_boot, 0)
    except (TypeError, ValueError) as err:
        raise CLIError(f"--ci / --n-boot: {err}") from None
    inputs = [path for path in (getattr(args, "logits", None), getattr(args, "labels", None)) if path]
    diagram = diagram_file(args.diagram, "--diagram", args.overwrite, inputs) if args.diagram else None
    data = load_inputs(args, default_split="test", apply_calibrator=True)
    sigmoid = data.task in ("binary", "multilabel")
    report = calibration_report(
        data.logits,
        data.labels,
        args.n_bins,
        from_logits=args.from_logits,
        ci=args.ci,
        n_boot=args.n_boot,
        **({"task": data.task} if sigmoid else {}),
    )
    kind = "logits" if report.from_logits else "probabilities"
    if args.json:  # the numbers first: a figure that cannot be written never loses them
        values = json_ready(report)
        non_finite = values.pop("non_finite", {})
        intervals = {} if sigmoid else json_intervals(report.intervals(), non_finite)
        print(
            dump_json(
                {
                    "source": data.source,
                    "n_bins": args.n_bins,
                    "inputs": kind,
                    **values,
                    **({"intervals": intervals} if intervals else {}),
                    **({"non_finite": non_finite} if non_finite else {}),
                }
            ),
            flush=True,
        )
    else:
        size = f"L = {report.num_labels} label(s), {data.task} head" if sigmoid else f"K = {data.logits.shape[1]}"
        print(f"{data.source}: N = {report.n}, {size}, {kind}")
        print(report, flush=True)
        if sigmoid and report.task == "multilabel":
            print(report.per_label_table(), flush=True)
    if diagram is not None:  # the same input rule as the table (an explicit flag, else the table's detection)
        save_diagram(
            data.logits,
            data.labels,
            diagram,
            args.n_bins,
            data.source,
            args.margin_groups,
            from_logits=report.from_logits,
            ci=args.ci,
            n_boot=args.n_boot,
            task=data.task,
        )
        if not args.json:
            print(f"reliability diagram: {diagram}")
    return 0
