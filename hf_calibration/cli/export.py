"""``hf-calibration export``: a calibrated model's folder as one ONNX graph (calibrator and conformal set inside), and
optionally its Inference Endpoints handler."""

from __future__ import annotations

import argparse
import json

from hf_calibration.cli._common import CLIError

HELP = "export a calibrated model to ONNX (calibrator and prediction sets inside)"
DESCRIPTION = """Write a calibrated model (a folder or Hub id holding calibrator/ and optionally conformal/) as one ONNX graph:
pixel_values in; calibrated logits, probabilities and the prediction-set mask out. The graph is checked against
PyTorch with onnxruntime. --endpoint-handler also writes handler.py and requirements.txt into the model's folder for
a Hugging Face Inference Endpoint.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="M", help="the calibrated model's folder or Hub id")
    p.add_argument("--out", metavar="FILE.onnx", help="the ONNX file to write")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out file (and handler files this package wrote)"
    )
    p.add_argument("--no-conformal", action="store_true", help="leave the prediction set out of the graph")
    p.add_argument("--no-calibrator", action="store_true", help="export the model's own scores (no calibrator)")
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset version (default: the exporter's)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check against PyTorch")
    p.add_argument(
        "--endpoint-handler",
        action="store_true",
        help="write handler.py and requirements.txt into --model (a local folder) for Inference Endpoints",
    )
    p.add_argument(
        "--requirement",
        metavar="SPEC",
        default=None,
        help="with --endpoint-handler: the requirements.txt line installing hf-calibration (default: this version)",
    )
    p.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args) -> int:
    from pathlib import Path

    if args.out is None and not args.endpoint_handler:
        raise CLIError("nothing to do: pass --out FILE.onnx and/or --endpoint-handler")
    if args.out is not None and Path(args.out).exists() and not args.overwrite:
        raise CLIError(f"--out {args.out!r} exists; pass --overwrite to replace it")
    if args.endpoint_handler and not Path(args.model).is_dir():
        raise CLIError(f"--endpoint-handler writes into a local model folder, but --model {args.model!r} is not one")
    if args.requirement is not None and not args.endpoint_handler:
        raise CLIError("--requirement goes with --endpoint-handler")
    written: dict = {}
    if args.out is not None:
        from hf_calibration.serving import export_onnx

        result = export_onnx(
            args.model,
            args.out,
            calibrator=None if args.no_calibrator else "attached",
            conformal=None if args.no_conformal else "attached",
            opset_version=args.opset,
            verify=not args.no_verify,
            overwrite=args.overwrite,
        )
        written["onnx"] = dict(result)
    if args.endpoint_handler:
        from hf_calibration.serving import write_endpoint_handler

        written["endpoint_handler"] = write_endpoint_handler(
            args.model, requirement=args.requirement, overwrite=args.overwrite
        )
    if args.json:
        print(json.dumps(written, indent=2))
        return 0
    if "onnx" in written:
        onnx = written["onnx"]
        check = (
            "not checked (onnxruntime missing or --no-verify)"
            if onnx["max_abs_diff"] is None
            else (
                f"max |probability difference| vs PyTorch {onnx['max_abs_diff']:.2e}"
                + ("" if onnx["sets_equal"] is None else f", sets equal: {onnx['sets_equal']}")
            )
        )
        print(
            f"{onnx['path']}: inputs {', '.join(onnx['inputs'])}; outputs {', '.join(onnx['outputs'])}; opset {onnx['opset']}; {check}"
        )
    for path in written.get("endpoint_handler", []):
        print(f"wrote {path}")
    return 0
