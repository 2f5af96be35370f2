"""``hf-calibration conformal``: fit conformal prediction sets on held-out logits, report coverage and set size, save."""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_calibration.cli._common import (
    CLIError,
    add_input_kind_option,
    add_option,
    dry_run_files,
    dump_json,
    from_logits_of,
    method_kind,
    to_tensor,
)
from hf_calibration.cli._inputs import add_input_options, load_inputs

HELP = "fit conformal prediction sets (THR, APS, RAPS) with a coverage guarantee"
DESCRIPTION = """Calibrate split-conformal prediction sets on held-out logits (a file, or a model run over a dataset), print their
coverage and mean set size on that split and, with --test-split, on held-out data; optionally save them (--out) and
push them beside a model.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_options(p, "which `logits_<split>` to calibrate on (default: plain `logits`, else `val`)")
    add_input_kind_option(p)
    p.add_argument(
        "--method", choices=("thr", "aps", "raps"), default="raps", help="the conformity score (default raps)"
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.1,
        help="miscoverage: sets hold the true class with probability >= 1 - alpha (default 0.1)",
    )
    add_option(
        p,
        "test_split",
        metavar="SPLIT",
        default=None,
        help="also report coverage and set size on this split (e.g. test)",
    )
    p.add_argument(
        "--calibrator",
        metavar="DIR|METHOD",
        default=None,
        help="apply a calibrator first: a folder saved by `fit` (used as it is), or a method name (ts, ...) "
        "fitted on the tuning share of the calibration split",
    )
    add_option(
        p,
        "allow_empty",
        action="store_true",
        help="keep empty sets (exact coverage) instead of giving them the top class",
    )
    add_option(p, "not_randomized", action="store_true", help="the non-randomised APS / RAPS score")
    add_option(p, "k_reg", type=int, default=None, help="RAPS's k_reg (default: chosen on a tuning split)")
    p.add_argument("--penalty", type=float, default=None, help="RAPS's lambda (default: chosen on a tuning split)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random draws (default 0)")
    p.add_argument("--out", metavar="DIR", default=None, help="save the predictor in this new folder")
    p.add_argument("--overwrite", action="store_true", help="replace the predictor already saved in --out")
    add_option(p, "push_to_hub", metavar="REPO", default=None, help="also push the predictor to this Hub repo id")
    add_option(
        p,
        "path_in_repo",
        metavar="DIR",
        default="conformal",
        help="with --push-to-hub: the repo subfolder (default conformal)",
    )
    add_option(
        p,
        "dry_run",
        action="store_true",
        help="with --push-to-hub: build the exact files that would be uploaded, list them, upload nothing",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _calibrator(spec: str | None):
    if spec is None:
        return None
    from hf_calibration.cli._common import load_calibrator

    if Path(spec).is_dir():
        return load_calibrator(spec)
    from hf_calibration.calibrators import create_calibrator

    try:
        kind = method_kind(spec)
    except CLIError:
        raise CLIError(
            f"--calibrator {spec!r} is neither a folder nor a calibrator method (ts, smart, vector_scaling, ...)."
        ) from None
    return create_calibrator(kind)


def run(args) -> int:
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.conformal.predictor import check_save_folder

    if args.method != "raps" and (args.k_reg is not None or args.penalty is not None):
        raise CLIError("--k-reg and --penalty apply to --method raps only.")
    if not args.push_to_hub and args.dry_run:
        raise CLIError("--dry-run applies to --push-to-hub only.")
    if args.method == "thr" and args.not_randomized:
        raise CLIError("--not-randomized applies to --method aps / raps: thr has no randomised form.")
    predictor = ConformalPredictor(
        args.method,
        randomized=False if args.not_randomized else None,
        allow_empty=args.allow_empty,
        k_reg=args.k_reg,
        penalty=args.penalty,
        seed=args.seed,
    )  # bad values: one line naming the argument
    if args.out is not None:  # checked now, written only once the fit has succeeded
        check_save_folder(args.out, overwrite=args.overwrite, what="--out", overwrite_flag="--overwrite")
    calibrator = _calibrator(args.calibrator)
    data = load_inputs(args, default_split="val")
    test = None
    if args.test_split is not None:
        test = load_inputs(argparse.Namespace(**{**vars(args), "split": args.test_split}), default_split="test")
    if data.task == "multilabel":
        return _run_multilabel(args, data, test, calibrator)
    from_logits = from_logits_of(args, data.logits)
    predictor.fit(
        to_tensor(data.logits), to_tensor(data.labels), alpha=args.alpha, calibrator=calibrator, from_logits=from_logits
    )
    info = predictor.fit_info_
    result = {
        "source": data.source,
        "method": args.method,
        "alpha": args.alpha,
        "q_hat": info["q_hat"],
        "num_samples": info["num_samples"],
        "num_tune": info["num_tune"],
        "k_reg": info["k_reg"],
        "penalty": info["penalty"],
        "calibration": {"coverage": info["coverage"], "mean_set_size": info["mean_set_size"]},
    }
    if test is not None:
        result["test"] = {
            "source": test.source,
            **predictor.evaluate(test.logits, test.labels, from_logits=from_logits_of(args, test.logits)),
        }
    if args.out is not None:
        predictor.save_pretrained(args.out, overwrite=args.overwrite)
        result["out"] = str(args.out)
    if args.push_to_hub:
        from hf_calibration._core.checkpoints import HubUnreachableError

        try:
            pushed = predictor.push_to_hub(args.push_to_hub, path_in_repo=args.path_in_repo, dry_run=args.dry_run)
        except HubUnreachableError as err:
            raise CLIError(
                f"the Hugging Face Hub is unreachable ({err.reason}): nothing was pushed to {args.push_to_hub}"
                + (f"; the predictor is saved in {args.out}." if args.out else ".")
            ) from None
        repo_url = f"https://huggingface.co/{args.push_to_hub}" + (
            f"/tree/main/{args.path_in_repo.strip('/')}" if args.path_in_repo else ""
        )
        if args.dry_run:  # listed, then the temporary folder is removed: nothing printed names a folder that is gone
            result.update(repo_url=repo_url, dry_run_files=dry_run_files(pushed, args.path_in_repo))
        else:
            result["commit_url"] = str(pushed)
    if args.json:
        print(dump_json(result))
        return 0
    extra = f", k_reg = {info['k_reg']}, lambda = {info['penalty']}" if args.method == "raps" else ""
    print(
        f"{args.method} prediction sets at alpha = {args.alpha} (target coverage {1 - args.alpha:.2%}) on {data.source}: "
        f"threshold {info['q_hat']:.6g} from {info['num_samples']} samples"
        + (f" ({info['num_tune']} held out to tune)" if info["num_tune"] else "")
        + extra
    )
    rows = [("calibration split (in-sample)", info["coverage"], info["mean_set_size"])]
    if test is not None:
        rows.append((f"{test.source}", result["test"]["coverage"], result["test"]["mean_set_size"]))
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  coverage  mean set size")
    for name, cov, size in rows:
        print(f"{name:{width}}  {cov:8.2%}  {size:13.3f}")
    if args.out is not None:
        print(f"saved to {args.out}")
    if args.push_to_hub:
        print(
            f"dry run: nothing uploaded; {result['repo_url']} would receive {', '.join(result['dry_run_files'])}"
            if args.dry_run
            else f"pushed: {result['commit_url']}"
        )
    return 0


def _run_multilabel(args, data, test, calibrator) -> int:
    """A multi-label head's sets: conformal risk control of the false-negative rate (``MultiLabelConformalPredictor``);
    THR / APS / RAPS are sets of one class among K and do not apply."""
    from hf_calibration.conformal import MultiLabelConformalPredictor

    if (
        args.method != "raps"
        or args.k_reg is not None
        or args.penalty is not None
        or args.not_randomized
        or args.allow_empty
    ):
        raise CLIError(
            "a multi-label head's sets are conformal risk control (every label whose probability passes one "
            "threshold): --method, --k-reg, --penalty, --not-randomized and --allow-empty do not apply."
        )
    if calibrator is not None and not calibrator.is_fitted:
        raise CLIError(
            "--calibrator for a multi-label head must be a fitted sigmoid calibrator's folder (fit it with "
            "`hf-calibration fit --method platt` on other data)."
        )
    from_logits = from_logits_of(args, data.logits, data.task)
    try:
        predictor = MultiLabelConformalPredictor().fit(to_tensor(data.logits), to_tensor(data.labels), alpha=args.alpha,
                                                       calibrator=calibrator, from_logits=from_logits)  # fmt: skip
    except (TypeError, ValueError) as err:
        raise CLIError(str(err)) from None
    info = predictor.fit_info_
    result = {"source": data.source, "method": "crc", "alpha": args.alpha, "threshold": info["threshold"],
              "num_samples": info["num_samples"],
              "calibration": {"false_negative_rate": info["false_negative_rate"], "mean_set_size": info["mean_set_size"]}}  # fmt: skip
    if test is not None:
        result["test"] = {"source": test.source, **predictor.evaluate(test.logits, test.labels,
                                                                     from_logits=from_logits_of(args, test.logits, test.task))}  # fmt: skip
    if args.out is not None:
        predictor.save_pretrained(args.out, overwrite=args.overwrite)
        result["out"] = str(args.out)
    if args.push_to_hub:
        raise CLIError("--push-to-hub: push a multi-label predictor with predictor.push_to_hub(); --out saves it here.")
    if args.json:
        print(dump_json(result))
        return 0
    print(f"multi-label sets by conformal risk control at alpha = {args.alpha} (false-negative rate <= {args.alpha:g}) on "
          f"{data.source}: threshold {info['threshold']:.6g} from {info['num_samples']} samples")  # fmt: skip
    rows = [("calibration split (in-sample)", result["calibration"])] + (
        [(test.source, result["test"])] if test else []
    )
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  false-negative rate  mean set size")
    for name, values in rows:
        print(f"{name:{width}}  {values['false_negative_rate']:19.2%}  {values['mean_set_size']:13.3f}")
    if args.out is not None:
        print(f"saved to {args.out}")
    return 0
