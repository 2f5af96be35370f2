"""What every subcommand shares: the one-line error, option spellings, path checks, loading logits and calibrators.

Outputs never replace what a user owns (DESIGN "Files a user owns"): ``new_folder`` / ``new_file`` refuse an
existing calibrator folder or file unless ``--overwrite``, a model's folder always, and an output that is one of
the command's inputs always; nothing is created before the command's work has succeeded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

PROG = "hf-calibration"

# method names accepted by `fit --method` → registered calibrator kind (filled lazily)
_METHOD_ALIASES = {"ts": "temperature_scaling", "temperature": "temperature_scaling"}
OBJECTIVES = ("nll", "brier", "soft_ece", "charbonnier_soft_ece")


class CLIError(Exception):
    """A user error: printed as one line, exit status 1."""


class Parser(argparse.ArgumentParser):
    """argparse, but a malformed command line prints one line (``prog: error: ...``), not the usage block."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_option(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Add ``--some-option`` and its ``--some_option`` spelling (HfArgumentParser style) as one option."""
    flags = [f"--{name.replace('_', '-')}"]
    if "_" in name:
        flags.append(f"--{name}")
    parser.add_argument(*flags, dest=name, **kwargs)


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create ``path`` if needed and prove that we can write in it, before any long work starts."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CLIError(f"{what} {folder} exists and is not a folder.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_test_"):
            pass
    except OSError as err:
        raise CLIError(f"{what} {folder} is not writable ({err.strerror or err}).") from None
    return folder


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a bad value is a malformed command line, exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, what: str, shown: Path | None = None) -> None:
    """Files can be written in the folder ``path`` (which may not exist yet): its nearest existing ancestor is a
    writable folder. ``shown``: the output named in the message (default ``path``)."""
    shown = path if shown is None else shown
    ancestor = _nearest_existing(path)
    if not ancestor.is_dir():
        raise CLIError(f"{what} {shown} is not writable ({ancestor} is a file, not a folder).")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise CLIError(f"{what} {shown} is not writable (no write permission in {ancestor}).")
    try:  # permission bits do not tell everything (root, read-only or virtual file systems): try, leave nothing
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".write_test_"))
    except OSError as err:
        raise CLIError(f"{what} {shown} is not writable ({err.strerror or err} in {ancestor}).") from None


@contextlib.contextmanager
def writing(what: str, path: str | os.PathLike):
    """An output that still cannot be written when the command gets to it: one line naming the option."""
    try:
        yield
    except OSError as err:
        raise CLIError(f"{what} {path} could not be written ({err.strerror or err}).") from None


def _same_file(a: Path, b: str | os.PathLike | None) -> bool:
    return b is not None and Path(b).exists() and a.exists() and os.path.samefile(a, b)


def new_folder(path: str | os.PathLike, what: str, overwrite: bool) -> Path:
    """An output folder for a calibrator: new, empty, or (``--overwrite``) holding a calibrator; never a model's."""
    from hf_calibration._core.checkpoints import check_save_folder

    folder = Path(path)
    try:
        check_save_folder(folder, overwrite=overwrite, what=what, overwrite_flag="--overwrite")
    except ValueError as err:
        raise CLIError(str(err)) from None
    _check_creatable(folder, what)
    return folder


def output_folder(path: str | os.PathLike, what: str) -> Path:
    """A folder for a command's outputs (diagrams, reports): not a file, never a model's folder, creatable; it is
    created only when the first output is written."""
    from hf_calibration._core.checkpoints import model_files

    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CLIError(f"{what} {folder} exists and is not a folder.")
    found = model_files(folder)
    if found:
        raise CLIError(
            f"{what} {folder} is a model's folder ({', '.join(found[:3])}): write the outputs in another "
            f"folder (a subfolder such as {folder / 'calibration'} is fine)."
        )
    _check_creatable(folder, what)
    return folder


def new_file(path: str | os.PathLike, what: str, overwrite: bool, inputs=()) -> Path:
    """An output file: absent, or replaced with ``--overwrite``; never one of the command's ``inputs``."""
    path = Path(path)
    if path.is_dir():
        raise CLIError(f"{what} {path} is a folder; give a file name.")
    if any(_same_file(path, source) for source in inputs):
        raise CLIError(f"{what} {path} is one of this command's input files; write to another file.")
    if path.exists() and not overwrite:
        raise CLIError(f"{what} {path} exists; pass --overwrite to replace it, or choose another name.")
    _check_creatable(path.parent, what, shown=path)
    return path


def diagram_file(path: str | os.PathLike, what: str, overwrite: bool, inputs=()) -> Path:
    """A figure file as ``new_file`` checks it, named as matplotlib will write it: without an extension it gets
    ``.png`` (matplotlib appends it), so the file checked, written and printed is the same; an extension matplotlib
    cannot write is refused."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if any(_same_file(path, source) for source in inputs):
        raise CLIError(f"{what} {path} is one of this command's input files; write to another file.")
    fmt = path.suffix[1:].lower()
    if not fmt:
        path = path.with_name(path.name + ".png")
    elif fmt not in FigureCanvasBase.get_supported_filetypes():
        kinds = ", ".join(f".{k}" for k in sorted(FigureCanvasBase.get_supported_filetypes()))
        raise CLIError(f"{what} {path}: matplotlib cannot write .{fmt} files; give one of {kinds}.")
    return new_file(path, what, overwrite, inputs)


def load_data(args, default_split: str):
    from hf_calibration.io.logits_files import load_logits

    return load_logits(
        args.logits, args.split, labels_path=args.labels, default_split=default_split, task=getattr(args, "task", None)
    )


def save_diagram(
    logits,
    labels,
    path: Path,
    n_bins: int,
    title: str,
    margin_groups: int | None = None,
    *,
    from_logits: bool | None = None,
    calibrated=None,
    names: tuple[str, str] = ("uncalibrated", "calibrated"),
    ci: float | None = 0.95,
    n_boot: int | None = None,
    what: str = "--diagram",
    task: str | None = None,
) -> None:
    """The reliability diagram (with counts; a before / after pair when ``calibrated`` is given) as a PNG.

    ``from_logits`` is the one the table used, so the diagram and the table show the same numbers; ``ci`` the
    level of its per-bin and ECE intervals (default 0.95).
    """
    from hf_calibration.metrics import reliability_diagram

    fig = reliability_diagram(
        logits,
        labels,
        n_bins,
        calibrated=calibrated,
        names=names,
        margin_groups=margin_groups,
        title=title,
        from_logits=from_logits,
        ci=0.95 if ci is None else ci,
        n_boot=n_boot,
        task=None if task == "multiclass" else task,
    )
    with writing(what, path):
        path.parent.mkdir(parents=True, exist_ok=True)  # new_file checked that it can be created
        fig.savefig(path, dpi=120)


def json_ready(report) -> dict:
    """A report as strict JSON values: a NaN or infinite metric becomes null, and ``non_finite`` names it with its
    value as a string (``{"nll": "inf"}``; present only when some metric is not finite)."""
    from hf_calibration.metrics.multilabel import SigmoidCalibrationReport

    if isinstance(report, SigmoidCalibrationReport):  # nested: macro / micro / per_label; a non-finite number is null

        def clean(value):
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return None if isinstance(value, float) and not math.isfinite(value) else value

        return clean(report.to_dict())
    values, non_finite = {}, {}
    for key, value in report.to_dict().items():
        if isinstance(value, float) and not math.isfinite(value):
            values[key], non_finite[key] = None, str(float(value))  # the value alone (an interval prints its ends too)
        else:
            values[key] = value
    return {**values, "non_finite": non_finite} if non_finite else values


def dump_json(obj) -> str:
    """Strict JSON (no NaN / Infinity tokens, which JSON does not have)."""
    return json.dumps(obj, indent=2, allow_nan=False)


def json_intervals(intervals: dict, non_finite: dict) -> dict:
    """A report's intervals (``{metric: MetricInterval}``) as strict JSON: each one's ends (null without an interval, as
    MCE's), level, resamples, method and note; an infinite or NaN end becomes null and is named in ``non_finite``
    (``{"nll.high": "inf"}``), as ``json_ready`` does for the values."""
    out = {}
    for key, v in intervals.items():
        entry = {k: x for k, x in v.to_dict().items() if k != "value"}
        for end in ("low", "high"):
            if entry[end] is not None and not math.isfinite(entry[end]):
                non_finite[f"{key}.{end}"] = str(entry[end])
                entry[end] = None
        out[key] = entry
    return out


def dry_run_files(folder: str | os.PathLike, path_in_repo: str | None) -> list[str]:
    """The files of a dry run's temporary upload folder (``push_to_hub(dry_run=True)`` returns it; ``path_in_repo``
    nests it), as ``"name (size bytes)"`` with sub-folders' files by relative path; then the temporary folder is
    removed, so that nothing is left behind and nothing printed names a folder that is gone."""
    import shutil

    folder = Path(folder)
    files = [
        f"{p.relative_to(folder).as_posix()} ({p.stat().st_size:,} bytes)"
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    root = folder
    for _ in Path(path_in_repo.strip("/")).parts if path_in_repo else ():
        root = root.parent
    shutil.rmtree(root, ignore_errors=True)
    return files


def add_input_kind_option(p: argparse.ArgumentParser) -> None:
    """``--probs`` / ``--from-logits``: what the file holds (``args.from_logits`` False / True); default None: detect."""
    kind = p.add_mutually_exclusive_group()
    kind.add_argument(
        "--probs",
        dest="from_logits",
        action="store_false",
        default=None,
        help="the file holds probabilities (default: detected: rows in [0, 1] summing to 1 within 1e-2)",
    )
    kind.add_argument(
        "--from-logits",
        "--from_logits",
        dest="from_logits",
        action="store_true",
        default=None,
        help="the file holds logits, even if its rows look like probabilities",
    )


def from_logits_of(args, logits, task: str = "multiclass") -> bool:
    """The input kind the command works with: ``--probs`` / ``--from-logits``, else detected on ``logits`` by the one
    rule every entry point applies (:func:`hf_calibration._core.inputs.scores_kind`)."""
    from hf_calibration._core.inputs import scores_kind

    return scores_kind(logits, args.from_logits, task=task, name="logits")


def method_kind(method: str, flag: str = "--method") -> str:
    from hf_calibration.calibrators import list_calibrators

    kinds = list_calibrators()
    kind = _METHOD_ALIASES.get(method.lower(), method.lower())
    if kind not in kinds:
        raise CLIError(f"unknown {flag} {method!r}; choose one of: ts, {', '.join(k for k in kinds)}.")
    return kind


def load_calibrator(folder: str | os.PathLike):
    """Load a calibrator saved with ``save_pretrained`` (any registered kind), strictly."""
    from hf_calibration import calibrators

    folder = Path(folder)
    if not folder.is_dir():
        raise CLIError(
            f"--calibrator {folder}: no such folder (give the folder written by `hf-calibration fit` or save_pretrained)."
        )
    if not (folder / "config.json").is_file():
        raise CLIError(f"--calibrator {folder}: no config.json inside; not a saved calibrator.")
    if hasattr(calibrators, "load_calibrator"):
        loader = calibrators.load_calibrator
    else:  # pragma: no cover - older calibrators module: dispatch on the config's `calibrator` kind

        def loader(path):
            kind = json.loads((Path(path) / "config.json").read_text()).get("calibrator")
            return calibrators.get_calibrator_class(kind).from_pretrained(str(path))

    try:
        return loader(str(folder))
    except (ValueError, TypeError, OSError, KeyError) as err:
        raise CLIError(f"--calibrator {folder}: {str(err).strip().splitlines()[0]}") from None


def to_tensor(logits):
    import numpy as np
    import torch

    return torch.from_numpy(np.ascontiguousarray(logits))


def temperature_summary(calibrator, logits, from_logits: bool = True) -> str:
    import torch

    if getattr(calibrator, "_sigmoid_head", False):  # a sigmoid head: one map per label
        info = calibrator.fit_info_ or {}
        what = f"{info.get('num_labels')} label(s) of a {info.get('task')} head"
        if hasattr(calibrator, "fitted_temperature"):
            t = calibrator.fitted_temperature
            return f"{what}, T = " + (f"{t:.4f}" if isinstance(t, float) else ", ".join(f"{x:.4f}" for x in t))
        return f"{what}, one map per label"
    if not hasattr(calibrator, "temperature"):  # not a temperature calibrator: nothing one number can say
        return f"{'keeps' if calibrator.preserves_argmax else 'may change'} the predicted classes"
    with torch.no_grad():
        t = calibrator.temperature(to_tensor(logits), from_logits=from_logits).detach().double().reshape(-1)
    if t.numel() == 1 or bool((t == t[0]).all()):
        return f"T = {t[0].item():.4f}"
    return f"T per sample: median {t.median().item():.4f}, range [{t.min().item():.4f}, {t.max().item():.4f}]"


def calibrated_logits(calibrator, logits, from_logits: bool = True):
    import torch

    with torch.no_grad():
        return calibrator(to_tensor(logits), from_logits=from_logits).detach().cpu().numpy()


def logits_options(p: argparse.ArgumentParser, split_help: str, required: bool = True) -> None:
    p.add_argument(
        "--logits",
        required=required,
        metavar="FILE",
        help="logits file: .npz / .pt / .safetensors with `logits`,`labels` (or `logits_<split>`, "
        "`labels_<split>`), or a .npy of logits with --labels",
    )
    p.add_argument("--labels", metavar="FILE", help="labels file (.npy) when --logits is a bare .npy array")
    p.add_argument("--split", help=split_help)
    add_option(p, "n_bins", type=positive_int, default=15, help="number of equal-width bins (default 15)")
    p.add_argument(
        "--task",
        choices=("multiclass", "binary", "multilabel"),
        default=None,
        help="the head's kind (default: the model's config.problem_type, else the arrays' shapes: (N, L) 0/1 "
        "labels are multi-label, one logit column binary); binary / multi-label heads get per-label, "
        "macro and pooled metrics and sigmoid calibrators",
    )
