"""``hf-calibration fit``: fit a post-hoc calibrator on held-out logits, save it, optionally push it."""

from __future__ import annotations

import argparse

from hf_calibration.cli._common import (
    OBJECTIVES,
    CLIError,
    add_input_kind_option,
    add_option,
    calibrated_logits,
    dry_run_files,
    dump_json,
    from_logits_of,
    json_ready,
    method_kind,
    new_folder,
    temperature_summary,
    to_tensor,
    writing,
)
from hf_calibration.cli._inputs import add_input_options, card_kwargs, load_inputs
from hf_calibration.cli.compare import add_selection_options, fit_auto

HELP = "fit a calibrator (any registered one, or auto) on saved logits, or on a model's, and save it"
DESCRIPTION = """Fit a post-hoc calibrator on held-out logits (or probabilities; a file, or a model run over a dataset), save it with
save_pretrained (safetensors + config.json + model card), optionally push it to the Hub. --out must be a new or
empty folder (--overwrite replaces a calibrator saved there; a model's folder is always refused: use its calibrator/
subfolder).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_options(p, "which `logits_<split>` to fit on (default: plain `logits`, else `val`)")
    add_input_kind_option(p)
    p.add_argument(
        "--method",
        required=True,
        help="a registered calibrator (smart, ts / temperature_scaling, spline, histogram_binning, isotonic, ...), "
        "or auto: the best by cross-validation on this split (see `compare`)",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="fit objective (default: the method's own: NLL for ts, charbonnier_soft_ece for smart)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="new folder to save the calibrator in")
    p.add_argument("--overwrite", action="store_true", help="replace the calibrator already saved in --out")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the fit (SMART's initialisation; with auto: of the folds; with --for-shift: of the noise)",
    )
    add_selection_options(p, prefix="with --method auto: ")
    g = p.add_argument_group(
        "fitted to survive shift (with --model and --dataset): the held-out images perturbed from clean to near chance, "
        "the calibrator fitted on all of them (Tomani et al., CVPR 2021; hf_calibration.shift.fit_for_shift)"
    )
    add_option(g, "for_shift", action="store_true", help="perturb the --split images and fit on the union")
    add_option(
        g, "levels", type=int, default=10, metavar="L", help="perturbation strengths, clean included (default 10)"
    )
    g.add_argument(
        "--perturbation",
        choices=("gaussian_noise", "corruptions"),
        default="gaussian_noise",
        help="Gaussian pixel noise (the paper's generic perturbation, default) or the benchmark corruptions by severity",
    )
    add_option(p, "push_to_hub", metavar="REPO", default=None, help="also push the calibrator to this Hub repo id")
    add_option(
        p,
        "path_in_repo",
        metavar="DIR",
        default=None,
        help="with --push-to-hub: a subfolder of the repo (e.g. calibrator, beside the model; "
        "the default with --model)",
    )
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    add_option(
        p,
        "dry_run",
        action="store_true",
        help="with --push-to-hub: build the exact folder and card that would be uploaded, list its files, upload nothing",
    )
    p.add_argument("--json", action="store_true", help="print the fit-set reports as JSON")


def run(args) -> int:
    from hf_calibration.calibrators import create_calibrator
    from hf_calibration.calibrators.selection.auto import is_stochastic
    from hf_calibration.metrics import calibration_report, format_reports

    auto = args.method.lower() == "auto"
    kind = "auto" if auto else method_kind(args.method)
    if args.seed is not None and not auto and not is_stochastic(kind) and not args.for_shift:
        raise CLIError(f"--seed applies to seeded methods only (smart, ...): {kind} is deterministic.")
    if not args.push_to_hub and (args.dry_run or args.path_in_repo or args.private):
        raise CLIError("--dry-run, --path-in-repo and --private apply to --push-to-hub only.")
    if args.push_to_hub:  # every argument is checked before anything is written
        from hf_calibration._core.checkpoints import check_path_in_repo, check_repo_id

        try:
            check_repo_id(args.push_to_hub, "--push-to-hub")
            check_path_in_repo(args.path_in_repo, "--path-in-repo")
        except (TypeError, ValueError) as err:
            raise CLIError(str(err)) from None
    out = new_folder(args.out, "--out", args.overwrite)  # checked now, written only once the fit has succeeded
    data = load_inputs(args, default_split="val")
    if data.model is not None and args.push_to_hub and args.path_in_repo is None:
        args.path_in_repo = "calibrator"  # the model route pushes beside the model
    from_logits = from_logits_of(args, data.logits, data.task)
    sigmoid = data.task in ("binary", "multilabel")
    task_kw = {"task": data.task} if sigmoid else {}
    if args.for_shift:
        calibrator = _fit_for_shift(args, kind, data, sigmoid, auto)
    elif auto:  # cross-validate every calibrator, refit the best
        calibrator = fit_auto(args, data, from_logits, progress_bar=not args.json)
        kind = calibrator.method_ if calibrator.method_ != "uncalibrated" else "identity"  # no candidate qualified
    else:
        calibrator = create_calibrator(kind, **({} if args.seed is None else {"seed": args.seed}))
        fit_kwargs = {} if args.objective is None else {"objective": args.objective}
        if sigmoid != bool(getattr(calibrator, "_sigmoid_head", False)):
            from hf_calibration.calibrators import list_calibrators

            raise CLIError(
                f"--method {kind} calibrates a {'sigmoid' if not sigmoid else 'softmax'} head, but the data are a "
                f"{data.task} head's (see --task, or the model's config.problem_type): choose one of "
                f"{', '.join(list_calibrators(data.task))}."
            )
        calibrator.fit(
            to_tensor(data.logits),
            to_tensor(data.labels),
            from_logits=from_logits,
            progress_bar=not args.json,
            **fit_kwargs,
            **task_kw,
        )
    if args.for_shift:
        from_logits = True  # the model's own logits
    with writing("--out", out):
        calibrator.save_pretrained(
            out, overwrite=args.overwrite, model_card_kwargs=card_kwargs(data, saved_to=str(out))
        )
    after = calibrated_logits(calibrator, data.logits, from_logits)
    reports = {
        "uncalibrated": calibration_report(data.logits, data.labels, args.n_bins, from_logits=from_logits, **task_kw),
        kind: calibration_report(after, data.labels, args.n_bins, from_logits=True, **task_kw),
    }
    pushed = (
        _push(calibrator, args, out, card_kwargs(data, push_to=args.push_to_hub, path_in_repo=args.path_in_repo))
        if args.push_to_hub
        else None
    )
    if args.json:
        print(
            dump_json(
                {
                    "source": data.source,
                    "method": kind,
                    "inputs": calibrator.fit_info_["input"],
                    "out": str(out),
                    **(pushed or {}),
                    "reports": {k: json_ready(v) for k, v in reports.items()},
                    **({"selection": calibrator.selection()} if auto else {}),
                }
            )
        )
        return 0
    if auto:
        print(calibrator.comparison_)  # ends with the rule and the pick
    objective = calibrator.fit_info_["objective"]
    what = "probabilities, as log(p)" if not from_logits else "logits"
    print(
        f"fitted {type(calibrator.calibrator_ if auto else calibrator).__name__} ({objective}) on {data.source} ({what}, N = {data.logits.shape[0]}): "
        f"{temperature_summary(calibrator, data.logits, from_logits)}"
    )
    print(f"fit set (in-sample, {args.n_bins} bins):")
    print(format_reports(reports))
    print(f"saved to {out}")
    if pushed:
        print(
            f"dry run: nothing uploaded; {pushed['repo_url']} would receive {', '.join(pushed['dry_run_files'])}"
            if args.dry_run
            else f"pushed to {pushed['repo_url']}"
        )
    return 0


def _fit_for_shift(args, kind: str, data, sigmoid: bool, auto: bool):
    """``--for-shift``: :func:`hf_calibration.shift.fit_for_shift` on the model and the --split images."""
    from hf_calibration.shift import fit_for_shift

    if data.model is None:
        raise CLIError("--for-shift perturbs the images: it needs --model and --dataset, not --logits.")
    if auto or sigmoid:
        raise CLIError("--for-shift fits one softmax calibrator (ts, ets, smart, ...): not auto, not a sigmoid head.")
    try:
        return fit_for_shift(args.model, args.dataset, kind, split=data.split, levels=args.levels,
                             perturbation=args.perturbation, seed=args.seed or 0, progress_bar=not args.json,
                             batch_size=args.batch_size, image_column=(args.input_column or [None])[0], label_column=args.label_column,
                             max_samples=args.max_samples, device=args.device, num_workers=args.num_workers,
                             revision=args.revision, config_name=args.config,
                             cache_dir=None if args.no_cache else args.cache_dir)  # fmt: skip
    except (TypeError, ValueError) as err:
        raise CLIError(str(err)) from None


def _push(calibrator, args, out, card: dict | None) -> dict:
    from hf_calibration._core.checkpoints import HubUnreachableError

    repo_url = f"https://huggingface.co/{args.push_to_hub}" + (
        f"/tree/main/{args.path_in_repo.strip('/')}" if args.path_in_repo else ""
    )
    try:
        result = calibrator.push_to_hub(
            args.push_to_hub,
            path_in_repo=args.path_in_repo,
            private=args.private or None,
            dry_run=args.dry_run,
            model_card_kwargs=card,
        )
    except HubUnreachableError as err:
        raise CLIError(
            f"the Hugging Face Hub is unreachable ({err.reason}): nothing was pushed to {args.push_to_hub}; "
            f"the calibrator is saved in {out}."
        ) from None
    if not args.dry_run:
        return {"repo_url": repo_url, "commit_url": str(result)}
    return {"repo_url": repo_url, "dry_run_files": dry_run_files(result, args.path_in_repo)}
