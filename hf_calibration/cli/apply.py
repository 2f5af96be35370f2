"""``hf-calibration apply``: apply a saved calibrator to logits and report before / after."""

from __future__ import annotations

import argparse

from hf_calibration.cli._common import (
    CLIError,
    add_input_kind_option,
    add_option,
    calibrated_logits,
    diagram_file,
    dump_json,
    from_logits_of,
    json_ready,
    load_calibrator,
    new_file,
    positive_int,
    save_diagram,
    temperature_summary,
    writing,
)
from hf_calibration.cli._inputs import add_input_options, load_inputs

HELP = "apply a saved calibrator to logits (or a model's over a dataset) and report before / after"
DESCRIPTION = """Load a calibrator saved by `fit` (or save_pretrained), apply it to logits (or probabilities) and print the metrics
before and after. Output files must be new unless --overwrite is given, and are never the input files.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrator", required=True, metavar="DIR", help="folder written by `fit` / save_pretrained")
    add_input_options(p, "which `logits_<split>` to read (default: plain `logits`, else `test`)")
    add_input_kind_option(p)
    p.add_argument(
        "--diagram", metavar="PNG", help="write the reliability diagrams before and after calibration to this file"
    )
    add_option(
        p,
        "margin_groups",
        type=positive_int,
        default=None,
        metavar="G",
        help="with --diagram: one diagram per margin group",
    )
    add_option(
        p,
        "save_logits",
        metavar="NPZ",
        default=None,
        help="write the calibrated logits to this .npz (.npz is appended if missing)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing --diagram / --save-logits files")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the reports as JSON (strict: a non-finite value is null, named under non_finite)",
    )


def run(args) -> int:
    from hf_calibration.io.logits_files import npz_path, save_logits
    from hf_calibration.metrics import calibration_report, format_reports

    inputs = (args.logits, args.labels)
    diagram = diagram_file(args.diagram, "--diagram", args.overwrite, inputs) if args.diagram else None
    save_to = (
        new_file(npz_path(args.save_logits), "--save-logits", args.overwrite, inputs) if args.save_logits else None
    )
    if diagram is not None and diagram == save_to:
        raise CLIError(f"--diagram and --save-logits name the same file {diagram}.")
    calibrator = load_calibrator(args.calibrator)
    data = load_inputs(args, default_split="test")  # a logits file, or --model run over --dataset
    task = data.task
    fitted_for = (calibrator.fit_info_ or {}).get("task", "multiclass")
    if (task == "multiclass") != (fitted_for == "multiclass"):
        raise CLIError(
            f"--calibrator {args.calibrator} was fitted for a {fitted_for} head, but the logits are a {task} head's "
            "(see --task, or the model's config.problem_type)."
        )
    task_kw = {} if task == "multiclass" else {"task": task}
    from_logits = from_logits_of(args, data.logits, task)
    after = calibrated_logits(calibrator, data.logits, from_logits)
    name = getattr(calibrator, "kind", type(calibrator).__name__)
    reports = {
        "uncalibrated": calibration_report(data.logits, data.labels, args.n_bins, from_logits=from_logits, **task_kw),
        name: calibration_report(after, data.labels, args.n_bins, from_logits=True, **task_kw),
    }
    if args.json:  # the numbers first: a file that cannot be written never loses them
        print(
            dump_json(
                {
                    "source": data.source,
                    "calibrator": str(args.calibrator),
                    "inputs": "logits" if from_logits else "probabilities",
                    **({"calibrated_logits": str(save_to)} if save_to is not None else {}),
                    "reports": {k: json_ready(v) for k, v in reports.items()},
                }
            ),
            flush=True,
        )
    else:
        print(
            f"{data.source} (N = {data.logits.shape[0]}{'' if from_logits else ', probabilities'}), calibrator {args.calibrator}: "
            f"{temperature_summary(calibrator, data.logits, from_logits)}"
        )
        print(format_reports(reports), flush=True)
    if diagram is not None:
        save_diagram(
            data.logits,
            data.labels,
            diagram,
            args.n_bins,
            f"{data.source} + {name}",
            args.margin_groups,
            from_logits=from_logits,
            calibrated=after,
            names=("uncalibrated", name),
            task=task,
        )
        if not args.json:
            print(f"reliability diagram: {diagram}")
    if save_to is not None:
        with writing("--save-logits", save_to):
            saved = save_logits(save_to, after, data.labels, overwrite=args.overwrite)
        if not args.json:
            print(f"calibrated logits: {saved}")
    return 0
