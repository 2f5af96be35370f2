"""What every subcommand shares: the one-line error, option spellings, path checks, loading logits and calibrators."""

from __future__ import annotations

import argparse
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


def writable_file(path: str | os.PathLike, what: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise CLIError(f"{what} {path} is a folder; give a file name (e.g. {path / 'reliability.png'}).")
    writable_dir(path.parent if str(path.parent) else ".", f"the folder of {what}")
    return path


def load_data(args, default_split: str):
    from ..logits_io import load_logits

    return load_logits(args.logits, args.split, labels_path=args.labels, default_split=default_split)


def save_diagram(
    logits, labels, path: Path, n_bins: int, title: str, margin_groups: int | None = None, *,
    from_logits: bool | None = None, calibrated=None, names: tuple[str, str] = ("uncalibrated", "calibrated"),
) -> None:
    """The reliability diagram (with counts; a before / after pair when ``calibrated`` is given) as a PNG.

    ``from_logits`` is the one the table used, so the diagram and the table show the same numbers.
    """
    from ..metrics import reliability_diagram

    fig = reliability_diagram(logits, labels, n_bins, calibrated=calibrated, names=names, margin_groups=margin_groups,
                              title=title, from_logits=from_logits)
    fig.savefig(path, dpi=120)


def json_ready(report) -> dict:
    return {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in report.to_dict().items()}


def method_kind(method: str) -> str:
    from ..calibrators import list_calibrators

    kinds = list_calibrators()
    kind = _METHOD_ALIASES.get(method.lower(), method.lower())
    if kind not in kinds:
        raise CLIError(f"unknown --method {method!r}; choose one of: ts, {', '.join(k for k in kinds)}.")
    return kind


def load_calibrator(folder: str | os.PathLike):
    """Load a calibrator saved with ``save_pretrained`` (any registered kind), strictly."""
    from .. import calibrators

    folder = Path(folder)
    if not folder.is_dir():
        raise CLIError(f"--calibrator {folder}: no such folder (give the folder written by `hf-calibration fit` or save_pretrained).")
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


def temperature_summary(calibrator, logits) -> str:
    import torch

    if not hasattr(calibrator, "temperature"):  # not a temperature calibrator: nothing one number can say
        return f"{'keeps' if calibrator.preserves_argmax else 'may change'} the predicted classes"
    with torch.no_grad():
        t = calibrator.temperature(to_tensor(logits)).detach().double().reshape(-1)
    if t.numel() == 1 or bool((t == t[0]).all()):
        return f"T = {t[0].item():.4f}"
    return f"T per sample: median {t.median().item():.4f}, range [{t.min().item():.4f}, {t.max().item():.4f}]"


def calibrated_logits(calibrator, logits):
    import torch

    with torch.no_grad():
        return calibrator(to_tensor(logits)).detach().cpu().numpy()


def logits_options(p: argparse.ArgumentParser, split_help: str, required: bool = True) -> None:
    p.add_argument("--logits", required=required, metavar="FILE",
                   help="logits file: .npz / .pt / .safetensors with `logits`,`labels` (or `logits_<split>`, "
                        "`labels_<split>`), or a .npy of logits with --labels")
    p.add_argument("--labels", metavar="FILE", help="labels file (.npy) when --logits is a bare .npy array")
    p.add_argument("--split", help=split_help)
    add_option(p, "n_bins", type=int, default=15, help="number of equal-width bins (default 15)")
