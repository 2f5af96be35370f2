"""``hf-calibration apply``: apply a saved calibrator to logits and report before / after."""

from __future__ import annotations

import argparse
import json

from ._common import (
    add_option,
    calibrated_logits,
    json_ready,
    load_calibrator,
    load_data,
    logits_options,
    save_diagram,
    temperature_summary,
    writable_file,
)


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("apply", parents=[common], help="apply a saved calibrator to logits and report before / after",
                       description="Load a calibrator saved by `fit` (or save_pretrained), apply it to logits and "
                                   "print the metrics before and after.")
    p.add_argument("--calibrator", required=True, metavar="DIR", help="folder written by `fit` / save_pretrained")
    logits_options(p, "which `logits_<split>` to read (default: plain `logits`, else `test`)")
    p.add_argument("--diagram", metavar="PNG", help="write the reliability diagrams before and after calibration to this file")
    add_option(p, "margin_groups", type=int, default=None, metavar="G", help="with --diagram: one diagram per margin group")
    add_option(p, "save_logits", metavar="NPZ", default=None, help="write the calibrated logits to this .npz")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..logits_io import save_logits
    from ..metrics import calibration_report, format_reports

    diagram = writable_file(args.diagram, "--diagram") if args.diagram else None
    save_to = writable_file(args.save_logits, "--save-logits") if args.save_logits else None
    calibrator = load_calibrator(args.calibrator)
    data = load_data(args, default_split="test")
    after = calibrated_logits(calibrator, data.logits)
    name = getattr(calibrator, "kind", type(calibrator).__name__)
    reports = {
        "uncalibrated": calibration_report(data.logits, data.labels, args.n_bins),
        name: calibration_report(after, data.labels, args.n_bins),
    }
    if diagram is not None:
        save_diagram(data.logits, data.labels, diagram, args.n_bins, f"{data.source} + {name}", args.margin_groups,
                     calibrated=after, names=("uncalibrated", name))
    if save_to is not None:
        save_logits(save_to, after, data.labels)
    if args.json:
        print(json.dumps({"source": data.source, "calibrator": str(args.calibrator),
                          "reports": {k: json_ready(v) for k, v in reports.items()}}, indent=2))
    else:
        print(f"{data.source} (N = {data.logits.shape[0]}), calibrator {args.calibrator}: "
              f"{temperature_summary(calibrator, data.logits)}")
        print(format_reports(reports))
        if diagram is not None:
            print(f"reliability diagram: {diagram}")
        if save_to is not None:
            print(f"calibrated logits: {save_to}")
    return 0
