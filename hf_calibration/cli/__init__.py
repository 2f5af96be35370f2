"""The ``hf-calibration`` command line; one module per subcommand (``report``, ``fit``, ``apply``, ``compare``, ``conformal``,
``shift``, ``export``, ``demo``).

    hf-calibration report --logits LOGITS.npz [--split test] [--probs | --from-logits] [--diagram out.png] [--json]
    hf-calibration fit    --logits VAL.npz --method smart|ts|...|auto [--objective ...] --out DIR [--overwrite] [--push-to-hub REPO [--dry-run]]
    hf-calibration apply  --calibrator DIR --logits TEST.npz [--diagram out.png] [--save-logits OUT.npz] [--overwrite] [--json]
    hf-calibration compare --logits VAL.npz [--methods ts,smart,...] [--cv 5] [--metric ece] [--out DIR] [--json]
    hf-calibration conformal --logits VAL.npz [--method raps] [--alpha 0.1] [--test-split test] [--calibrator DIR|ts] [--out DIR]
    hf-calibration shift  --model M --dataset D [--split test] [--calibrator C ...] [--corruptions all] [--severities 1-5] [--ood-dataset D2]
    hf-calibration export --model DIR --out MODEL.onnx [--no-conformal] [--endpoint-handler [--requirement SPEC]] [--overwrite]
    hf-calibration demo   [--output_dir DIR] [--seed 0] [--epochs N] ...
    hf-calibration push-metrics --namespace ORG [--metrics ece,smce] [--requirement SPEC] [--dry-run [--out DIR] [--overwrite]]

Bad input (a missing file, missing keys, mismatched shapes, an unwritable output folder, an unknown
method) prints one line on stderr and exits with status 1 (2 for a malformed command line); pass
``--traceback`` to see the full Python traceback instead.

A subcommand is a module here with ``HELP`` (its line in ``hf-calibration --help``), ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args)``; list it in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from hf_calibration.cli._common import PROG, CLIError, Parser, load_calibrator

__all__ = ["COMMANDS", "PROG", "CLIError", "build_parser", "load_calibrator", "main"]

COMMANDS = (
    "report",
    "fit",
    "apply",
    "compare",
    "conformal",
    "shift",
    "export",
    "demo",
    "push_metrics",
)  # subcommand modules, in --help order
# a library error's advice and argument names are the API's; the command line's switches replace them
_API_ADVICE = {
    "Pass `from_logits=True` or `False` explicitly (False: every row must then be a probability vector).": "Pass --from-logits or --probs (then every row must be a probability vector)."
}
_API_FLAGS = {
    "model": "--model",
    "dataset": "--dataset",
    "ood_dataset": "--ood-dataset",
    "split": "--split",
    "image_column": "--image-column",
    "input_column": "--input-column",
    "label_column": "--label-column",
    "device": "--device",
    "max_samples": "--max-samples",
    "batch_size": "--batch-size",
    "num_workers": "--num-workers",
    "config_name": "--config",
    "revision": "--revision",
    "output_dir": "--output_dir",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Calibration metrics, post-hoc calibrators and the end-to-end demo.")
    parser.add_argument("--traceback", action="store_true", help="show the Python traceback on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress messages (INFO)")
    common = argparse.ArgumentParser(add_help=False)  # the same flags after the subcommand
    common.add_argument(
        "--traceback", action="store_true", default=argparse.SUPPRESS, help="show the Python traceback on errors"
    )
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress messages (INFO)"
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{" + ",".join(c.replace("_", "-") for c in COMMANDS) + "}", parser_class=Parser
    )
    sub.required = True
    for name in COMMANDS:
        command = importlib.import_module(f".{name}", __name__)
        p = sub.add_parser(name.replace("_", "-"), parents=[common], help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each message, so a later ``main()`` in the same process (tests,
    notebooks) does not log to a stream an earlier call captured and closed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property always follows sys.stderr
        pass


def _configure_logging(verbose: bool, command: str) -> None:
    """Library messages go to stderr: WARNING by default, INFO with -v; the demo narrates its own stages."""
    logger = logging.getLogger("hf_calibration")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    if command == "demo":
        logging.getLogger("hf_calibration.demo").setLevel(logging.INFO)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # no "newly initialised weights" or device chatter in CLI output
    except ImportError:  # pragma: no cover
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hf-calibration`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose, args.command)
    prefix = f"{PROG} {args.command}: error:"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hf-calibration report ... | head`: the reader left, nothing to say
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:  # pragma: no cover
            pass
        return 141
    except Exception as err:  # one line, never a traceback (unless asked for)
        if args.traceback:
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        for api, flags in _API_ADVICE.items():  # library advice in the command line's words
            message = message.replace(api, flags)
        for name, flag in _API_FLAGS.items():
            message = message.replace(f"argument `{name}`", flag).replace(f"`{name}`", flag)
        if not isinstance(err, (CLIError, ValueError, TypeError, OSError)):
            message = f"{type(err).__name__}: {message} (rerun with --traceback for details)"
        print(f"{prefix} {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
