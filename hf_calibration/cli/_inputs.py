"""Where a subcommand's logits come from: a logits file (``--logits``), or a model run over a dataset
(``--model M --dataset D``). One set of options and one loader for every subcommand that reads logits.

    add_input_options(parser, split_help)      # in add_parser
    data = load_inputs(args, default_split)    # in run: Inputs(logits, labels, source, model, dataset, split)
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np

from hf_calibration.cli._common import (
    CLIError,
    add_option,
    calibrated_logits,
    from_logits_of,
    load_calibrator,
    load_data,
    logits_options,
)

__all__ = ["Inputs", "add_input_options", "card_kwargs", "load_inputs"]


class Inputs(NamedTuple):
    logits: np.ndarray  # (N, K)
    labels: np.ndarray  # (N,) int64
    source: str  # for titles and messages: "file.npz[test]" or "model on dataset[test]"
    model: str | None = None  # --model, on the model route
    dataset: str | None = None  # --dataset, on the model route
    split: str | None = None  # the dataset split used, on the model route
    task: str = "multiclass"  # the head's kind (hf_calibration._core.tasks)
    pipeline_task: str | None = None  # the model's pipeline task, read from its config, on the model route


def add_input_options(p: argparse.ArgumentParser, split_help: str) -> None:
    """``--logits/--labels/--split/--n-bins`` and, as their alternative, the model + dataset options."""
    logits_options(p, split_help + "; with --dataset: the dataset split", required=False)
    g = p.add_argument_group("model + dataset (instead of --logits): run the model over the dataset, then proceed")
    g.add_argument("--model", metavar="M", help="model folder or Hub id (transformers, timm/..., a MaC-Cal checkpoint)")
    g.add_argument("--dataset", metavar="D", help="Hub dataset id, folder written by save_to_disk, or an image folder")
    g.add_argument("--config", metavar="C", help="the Hub dataset's configuration name")
    g.add_argument("--revision", metavar="REV", help="the model's Hub revision (branch, tag or commit)")
    add_option(g, "max_samples", type=int, default=None, metavar="N", help="use only the first N rows of the split")
    add_option(g, "batch_size", type=int, default=64, metavar="B", help="images per forward pass (default 64)")
    g.add_argument(
        "--input-column",
        "--input_column",
        "--image-column",
        "--image_column",
        dest="input_column",
        metavar="X",
        action="append",
        default=None,
        help="the input column: images (default: the one datasets.Image column), text (default: text, sentence, ...; "
        "twice for a pair, e.g. --input-column premise --input-column hypothesis; default: sentence1/sentence2, "
        "premise/hypothesis, ...), audio (default: the datasets.Audio column) or video (default: video)",
    )
    add_option(
        g,
        "label_column",
        metavar="Y",
        default=None,
        help="label column (default: the one ClassLabel column, else label / labels)",
    )
    add_option(g, "num_workers", type=int, default=None, metavar="W", help="DataLoader workers (default: up to 4)")
    g.add_argument("--device", default=None, help="cuda, cuda:1, mps, cpu (default: the best available)")
    add_option(
        g,
        "cache_dir",
        metavar="DIR",
        default=None,
        help="logits cache (default $HF_HOME/hf_calibration/logits); a changed model or dataset is recomputed",
    )
    add_option(g, "no_cache", action="store_true", help="neither read nor write the logits cache")
    p.set_defaults(input_parser=p)  # a missing or doubled input is a malformed command line: exit 2, as argparse does


def _usage_error(args, message: str):
    parser = getattr(args, "input_parser", None)
    if parser is not None:
        parser.error(message)  # SystemExit(2), one line
    raise CLIError(message)


def _positive(value, flag: str) -> None:
    if value is not None and value < 1:
        raise CLIError(f"{flag} must be at least 1, but got {value}.")


def load_inputs(args, default_split: str, apply_calibrator: bool = False) -> Inputs:
    """The logits and labels the command line names: ``--logits`` as before, or ``--model`` over ``--dataset``.

    ``default_split`` is the split read when ``--split`` is not given (``val`` also finds a dataset's
    ``validation``); a dataset with a single split uses it. With ``apply_calibrator`` and ``--calibrator DIR``
    the logits returned are the calibrated ones (the calibrator is loaded first, so a bad folder fails fast), and
    ``args.from_logits`` becomes True: the input kind (``--probs``) described what the calibrator was given.
    """
    calibrator = None
    if apply_calibrator and getattr(args, "calibrator", None) is not None:
        calibrator = load_calibrator(args.calibrator)
    data = _load(args, default_split)
    if calibrator is None:
        return data
    kind = getattr(calibrator, "kind", type(calibrator).__name__)
    calibrated = calibrated_logits(calibrator, data.logits, from_logits_of(args, data.logits, data.task))
    args.from_logits = True  # --probs / --from-logits described the input; what is returned now is logits
    return data._replace(logits=calibrated, source=f"{data.source} + {kind}")


def _load(args, default_split: str) -> Inputs:
    model_route = args.model is not None or args.dataset is not None
    if args.logits is not None:
        if model_route:
            _usage_error(args, "give either --logits, or --model with --dataset, not both")
        data = load_data(args, default_split)
        return Inputs(data.logits, data.labels, data.source, task=data.task)
    if args.model is None or args.dataset is None:
        missing = (
            "--dataset"
            if args.model is not None
            else "--model"
            if args.dataset is not None
            else "--logits FILE, or --model M and --dataset D"
        )
        _usage_error(args, f"missing {missing}")
    if args.labels is not None:
        _usage_error(args, "--labels goes with a .npy --logits file, not with --model/--dataset")
    _positive(args.max_samples, "--max-samples")
    _positive(args.batch_size, "--batch-size")
    if args.num_workers is not None and args.num_workers < 0:
        raise CLIError(f"--num-workers must be at least 0, but got {args.num_workers}.")

    from hf_calibration._core.checks import check_folder_or_hub_id
    from hf_calibration.io.data import find_label_column, load_image_dataset
    from hf_calibration.io.inference import check_device, predict_logits
    from hf_calibration.io.logits_cache import default_cache_dir

    check_folder_or_hub_id(args.model, "model")  # both named before anything is loaded
    if args.device is not None:
        check_device(args.device)
    dataset = load_image_dataset(args.dataset, args.split, config_name=args.config, default_split=default_split)
    from hf_calibration.io.inference import _task_of

    task = _task_of(args.model, args.revision, getattr(args, "task", None))
    label_column = find_label_column(
        dataset.features, args.label_column, multilabel=task == "multilabel", binary=task == "binary"
    )
    if task != "multilabel":
        _check_labelled(dataset, label_column, args)
    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    logits, labels = predict_logits(
        args.model,
        dataset,
        batch_size=args.batch_size,
        input_column=args.input_column,
        label_column=args.label_column,
        max_samples=args.max_samples,
        cache_dir=cache_dir,
        revision=args.revision,
        device=args.device,
        num_workers=args.num_workers,
        task=task,
    )
    split = None if dataset.split is None else str(dataset.split)
    source = f"{args.model} on {args.dataset}" + (f"[{split}]" if split else "")
    pipeline_task = _pipeline_task(args.model, args.revision)
    return Inputs(logits, labels, source, str(args.model), str(args.dataset), split, task, pipeline_task)


def _pipeline_task(model: str, revision: str | None) -> str | None:
    """The model's pipeline task by its config (:mod:`hf_calibration._core.tasks`), for the calibrator's card."""
    from transformers import AutoConfig

    from hf_calibration._core.tasks import pipeline_task_of_config

    try:
        config = AutoConfig.from_pretrained(model, revision=revision)
    except (OSError, ValueError, KeyError):
        return None
    return pipeline_task_of_config(config)[0]


def _check_labelled(dataset, column: str, args) -> None:
    """The rows the command reads have labels: an unlabelled split (a competition's test split: -1 throughout, or
    partly) is named as such before the model runs, not reported later as a bad class index."""
    rows = dataset if args.max_samples is None else dataset.select(range(min(args.max_samples, len(dataset))))
    labels = np.asarray(rows.with_format("numpy", columns=[column])[column])
    missing = int((labels < 0).sum())
    if missing:
        split = f"split {str(dataset.split)!r}" if dataset.split is not None else "the split"
        what = "has no labels" if missing == len(labels) else f"has {missing} of {len(labels)} rows without a label"
        raise CLIError(
            f"--dataset {args.dataset}: {split} {what} (its {column!r} column is {int(labels.min())} there, "
            "an unlabelled split); choose a labelled one with --split."
        )


def card_kwargs(
    data: Inputs, push_to: str | None = None, saved_to: str | None = None, path_in_repo: str | None = "calibrator"
) -> dict[str, str] | None:
    """The calibrator card's model-route slots: what it was fitted on and how to load the model with it attached.

    Pushed to ``push_to`` (under ``path_in_repo``, beside the model): both load from that repo. Saved
    locally: the model from ``--model``, the calibrator from ``saved_to``. None on the logits route.
    """
    if data.model is None:
        return None
    fitted_on = f"logits of `{data.model}` on `{data.dataset}`" + (f" (split `{data.split}`)" if data.split else "")
    if push_to is not None:
        where = f'"{push_to}"' + (f', subfolder="{path_in_repo.strip("/")}"' if path_in_repo else "")
        return {
            "fitted_on": fitted_on,
            "model_repo": push_to,
            "calibrator_args": where,
            "pipeline_task": data.pipeline_task,
        }
    return {
        "fitted_on": fitted_on,
        "model_repo": data.model,
        "calibrator_args": f'"{saved_to}"',
        "pipeline_task": data.pipeline_task,
    }
