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
    method_kind,
    temperature_summary,
    to_tensor,
    writable_dir,
)
from ._inputs import add_input_options, card_kwargs, load_inputs


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fit", parents=[common], help="fit a calibrator (SMART or temperature scaling) on saved logits, or on a model's, and save it",
                       description="Fit a post-hoc calibrator on held-out logits (a file, or a model run over a dataset), "
                                   "save it with save_pretrained (safetensors + config.json + model card), optionally "
                                   "push it to the Hub (beside the model, under calibrator/, on the model route).")
    add_input_options(p, "which `logits_<split>` to fit on (default: plain `logits`, else `val`)")
    p.add_argument("--method", required=True, help="smart, or ts / temperature_scaling")
    p.add_argument("--objective", choices=OBJECTIVES, default=None,
                   help="fit objective (default: the method's own: NLL for ts, charbonnier_soft_ece for smart)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to save the calibrator in")
    p.add_argument("--seed", type=int, default=None, help="seed of the fit (SMART's initialisation)")
    add_option(p, "push_to_hub", metavar="REPO", default=None,
               help="also push the calibrator to this Hub repo id (with --model: to REPO/calibrator, beside the model)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    p.add_argument("--json", action="store_true", help="print the fit-set reports as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..calibrators import create_calibrator
    from ..metrics import calibration_report, format_reports

    kind = method_kind(args.method)
    out = writable_dir(args.out, "--out")
    data = load_inputs(args, default_split="val")
    if args.seed is not None and kind != "smart":
        raise CLIError("--seed applies to --method smart only (temperature scaling is deterministic).")
    calibrator = create_calibrator(kind, **({} if args.seed is None else {"seed": args.seed}))
    fit_kwargs = {} if args.objective is None else {"objective": args.objective}
    calibrator.fit(to_tensor(data.logits), to_tensor(data.labels), progress_bar=not args.json, **fit_kwargs)
    calibrator.save_pretrained(str(out), model_card_kwargs=card_kwargs(data, saved_to=str(out)))
    after = calibrated_logits(calibrator, data.logits)
    reports = {
        "uncalibrated": calibration_report(data.logits, data.labels, args.n_bins),
        kind: calibration_report(after, data.labels, args.n_bins),
    }
    if args.json:
        print(json.dumps({"source": data.source, "method": kind, "out": str(out),
                          "reports": {k: json_ready(v) for k, v in reports.items()}}, indent=2))
    else:
        objective = (calibrator.fit_info_ or {}).get("objective", args.objective)
        print(f"fitted {type(calibrator).__name__} ({objective}) on {data.source} (N = {data.logits.shape[0]}): "
              f"{temperature_summary(calibrator, data.logits)}")
        print(f"fit set (in-sample, {args.n_bins} bins):")
        print(format_reports(reports))
        print(f"saved to {out}")
    if args.push_to_hub:
        beside_model = {} if data.model is None else {
            "path_in_repo": "calibrator", "model_card_kwargs": card_kwargs(data, push_to=args.push_to_hub)}
        calibrator.push_to_hub(args.push_to_hub, private=args.private, **beside_model)
        if not args.json:
            print(f"pushed to https://huggingface.co/{args.push_to_hub}" + (" under calibrator/" if beside_model else ""))
    return 0
