"""``hf-calibration fit``: fit a post-hoc calibrator on held-out logits, save it, optionally push it."""

from __future__ import annotations

import argparse
import json

from ._common import (
    OBJECTIVES,
    CLIError,
    add_option,
    calibrated_logits,
    json_ready,
    load_data,
    logits_options,
    method_kind,
    temperature_summary,
    to_tensor,
    writable_dir,
)
from .compare import add_selection_options, fit_auto


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fit", parents=[common], help="fit a calibrator (any registered one, or auto) on saved logits and save it",
                       description="Fit a post-hoc calibrator on held-out logits, save it with save_pretrained "
                                   "(safetensors + config.json + model card), optionally push it to the Hub.")
    logits_options(p, "which `logits_<split>` to fit on (default: plain `logits`, else `val`)")
    p.add_argument("--method", required=True,
                   help="a registered calibrator (smart, ts / temperature_scaling, spline, histogram_binning, isotonic, ...), "
                        "or auto: the best by cross-validation on this split (see `compare`)")
    p.add_argument("--objective", choices=OBJECTIVES, default=None,
                   help="fit objective (default: the method's own: NLL for ts, charbonnier_soft_ece for smart)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to save the calibrator in")
    p.add_argument("--seed", type=int, default=None, help="seed of the fit (SMART's initialisation; with auto: of the folds)")
    add_selection_options(p, prefix="with --method auto: ")
    add_option(p, "push_to_hub", metavar="REPO", default=None, help="also push the calibrator to this Hub repo id")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    p.add_argument("--json", action="store_true", help="print the fit-set reports as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..calibrators import create_calibrator
    from ..calibrators.selection import is_stochastic
    from ..metrics import calibration_report, format_reports

    auto = args.method.lower() == "auto"
    kind = "auto" if auto else method_kind(args.method)
    out = writable_dir(args.out, "--out")
    data = load_data(args, default_split="val")
    if args.seed is not None and not auto and not is_stochastic(kind):
        raise CLIError(f"--seed applies to seeded methods only (smart, ...): {kind} is deterministic.")
    if auto:  # cross-validate every calibrator, refit the best
        calibrator = fit_auto(args, data, progress_bar=not args.json)
        kind = calibrator.method_
    else:
        calibrator = create_calibrator(kind, **({} if args.seed is None else {"seed": args.seed}))
        fit_kwargs = {} if args.objective is None else {"objective": args.objective}
        calibrator.fit(to_tensor(data.logits), to_tensor(data.labels), progress_bar=not args.json, **fit_kwargs)
    calibrator.save_pretrained(str(out))
    after = calibrated_logits(calibrator, data.logits)
    reports = {
        "uncalibrated": calibration_report(data.logits, data.labels, args.n_bins),
        kind: calibration_report(after, data.labels, args.n_bins),
    }
    if args.json:
        print(json.dumps({"source": data.source, "method": kind, "out": str(out),
                          "reports": {k: json_ready(v) for k, v in reports.items()},
                          **({"selection": calibrator.selection()} if auto else {})}, indent=2))
    else:
        if auto:
            print(calibrator.comparison_)
            print(f"best by {args.metric}: {kind}")
        objective = (calibrator.fit_info_ or {}).get("objective", args.objective)
        fitted = calibrator.calibrator_ if auto else calibrator
        print(f"fitted {type(fitted).__name__} ({objective}) on {data.source} (N = {data.logits.shape[0]}): "
              f"{temperature_summary(calibrator, data.logits)}")
        print(f"fit set (in-sample, {args.n_bins} bins):")
        print(format_reports(reports))
        print(f"saved to {out}")
    if args.push_to_hub:
        calibrator.push_to_hub(args.push_to_hub, private=args.private)
        if not args.json:
            print(f"pushed to https://huggingface.co/{args.push_to_hub}")
    return 0
