"""``export_onnx``: one ONNX graph of a classifier with its calibrator (and conformal threshold) inside.

The graph is ``CalibratedClassifier`` (``graph.py``) exported by ``torch.onnx.export`` (the torch.export-based
exporter, which needs ``onnxscript``; ``pip install "hf-calibration[export]"``): input ``pixel_values`` (what the
model's image processor returns; dynamic batch size), and ``u`` for randomised APS / RAPS sets; outputs ``logits``
(calibrated), ``probabilities`` and, with a conformal predictor, ``prediction_set`` (boolean, (N, K); (N, L) for a
multi-label head's ``MultiLabelConformalPredictor``, (N, 2) for a one-logit binary head: the classes 0 and 1). The graph's
metadata (``onnx.ModelProto.metadata_props``) records ``id2label``, the calibrator and the predictor (method, alpha,
q_hat, or a multi-label predictor's threshold), so a server needs nothing else to label its answers.

Every registered calibrator exports: the linear families, temperature-based ones (TS, SMART, PTS, CTS), ETS, the
piecewise maps (histogram binning, isotonic regression, splines) as comparisons against their knots, and the sigmoid
calibrators of binary and multi-label heads (Platt, temperature, beta, isotonic and histogram binning per label; the
probabilities are then per-label sigmoids), each from ``graph_forward`` (``calibrators/_machinery/forward/graph.py``). A calibrator class
that cannot says so in ``export_refusal`` and is refused by name before
anything is traced. The exported graph is checked against the PyTorch module with onnxruntime when it is installed
(``verify=True``): the largest probability difference must stay below ``1e-5`` and the sets must be equal.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hf_calibration.serving.graph import CalibratedClassifier

__all__ = ["export_onnx", "exportable", "ExportResult"]

logger = logging.getLogger(__name__)

PROBABILITY_TOLERANCE = 1e-5  # the largest |ONNX - PyTorch| probability verify accepts
_FORBIDDEN = {}  # calibrator kind -> why it cannot be exported (none today: every registered calibrator exports)


def exportable(calibrator: Any) -> str | None:
    """Why ``calibrator`` (an instance or a registered kind) cannot be exported to ONNX, or None when it can."""
    from hf_calibration.calibrators import get_calibrator_class

    cls = get_calibrator_class(calibrator) if isinstance(calibrator, str) else type(calibrator)
    reason = getattr(cls, "export_refusal", None) or _FORBIDDEN.get(getattr(cls, "kind", ""))
    return reason


class ExportResult(dict):
    """What ``export_onnx`` wrote and checked: ``path``, ``inputs``, ``outputs``, ``opset``, and with ``verify``,
    ``max_abs_diff`` (probabilities) and ``sets_equal``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _example_shape(model: nn.Module, image_processor: Any) -> tuple[int, int, int]:
    """(C, H, W) of the model's input, from its config (ViT / Swin: ``image_size``; timm: ``pretrained_cfg``) or its
    image processor; ``ValueError`` asking for ``example_inputs`` when neither says."""
    config = getattr(model, "config", None)
    channels = getattr(config, "num_channels", None)
    size = getattr(config, "image_size", None)
    pretrained = getattr(config, "pretrained_cfg", None) or getattr(
        getattr(model, "timm_model", model), "pretrained_cfg", None
    )
    if isinstance(pretrained, dict) and pretrained.get("input_size"):
        c, h, w = pretrained["input_size"]
        return int(c), int(h), int(w)
    if size is None and image_processor is not None:
        crop = (
            getattr(image_processor, "crop_size", None) if getattr(image_processor, "do_center_crop", False) else None
        )
        target = crop or getattr(image_processor, "size", None) or {}
        if "height" in target and "width" in target:
            size = (target["height"], target["width"])
        elif "shortest_edge" in target:
            size = target["shortest_edge"]
    if size is None:
        raise ValueError(
            "Could not tell the model's input size from its config or image processor: pass "
            "`example_inputs` (a (N, C, H, W) float tensor of pixel values)."
        )
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(channels or 3), int(h), int(w)


def _resolve(model_or_folder: Any, calibrator: Any, conformal: Any) -> tuple[nn.Module, Any, Any, Any]:
    """``(model, calibrator, predictor, image_processor)``: a folder / Hub id is loaded calibrated
    (``load_calibrated_model``); a model object brings its attached calibrator and ``conformal_predictor``."""
    from hf_calibration.calibrators.attach import attached_calibrator

    processor = None
    if isinstance(model_or_folder, (str, os.PathLike)):
        from hf_calibration.io.model_loading import load_image_processor
        from hf_calibration.serving.calibrated_model import load_calibrated_model

        model = load_calibrated_model(model_or_folder)
        try:
            processor = load_image_processor(model_or_folder)
        except ValueError:
            processor = None
    elif isinstance(model_or_folder, nn.Module):
        model = model_or_folder
    else:
        raise TypeError(
            f"Expected argument `model_or_folder` to be a model, a folder or a Hub id, but got {type(model_or_folder).__name__}."
        )
    if calibrator == "attached":
        calibrator = attached_calibrator(model)
    if conformal == "attached":
        conformal = model.__dict__.get("conformal_predictor")
    elif conformal is False:
        conformal = None
    return model, calibrator, conformal, processor


def export_onnx(
    model_or_folder: Any,
    path: str | os.PathLike,
    *,
    calibrator: Any = "attached",
    conformal: Any = "attached",
    example_inputs: torch.Tensor | None = None,
    opset_version: int | None = None,
    verify: bool = True,
    overwrite: bool = False,
) -> ExportResult:
    """Write ``model_or_folder`` with its calibrator (and conformal predictor) as one ONNX graph at ``path``.

    Args:
        model_or_folder: a calibrated model's folder or Hub id (loaded by ``load_calibrated_model``: ``calibrator/``
            and ``conformal/`` come with it), or a model object.
        path: the ``.onnx`` file to write; an existing file is refused unless ``overwrite``.
        calibrator: ``"attached"`` (default: the calibrator attached to the model, if any), a fitted calibrator, or
            None (the model's own scores).
        conformal: ``"attached"`` (default: the folder's ``conformal/`` predictor, ``model.conformal_predictor``), a
            fitted ``ConformalPredictor`` (``MultiLabelConformalPredictor`` for a multi-label head), or None / False
            (no set output).
        example_inputs: (N, C, H, W) pixel values to trace with (and verify on); default: random values of the
            shape the model's config (or image processor) gives, batch 2. Use real, preprocessed images to verify on
            real inputs.
        opset_version: the ONNX opset (default: the exporter's).
        verify: run the graph with onnxruntime (when installed) on ``example_inputs`` and compare with PyTorch; a
            probability difference above 1e-5 or a different set is a ``RuntimeError``.
        overwrite: replace an existing file at ``path``.

    Returns an :class:`ExportResult` (a dict): ``path``, ``inputs``, ``outputs``, ``opset``, ``max_abs_diff`` and
    ``sets_equal`` (with ``verify``; None when onnxruntime is missing).

    Example::

        from hf_calibration.serving import export_onnx
        export_onnx("vit-digits", "vit-digits.onnx")       # calibrator/ and conformal/ inside the graph
    """
    path = Path(path)
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
    if path.exists() and (not overwrite or path.is_dir()):
        raise ValueError(
            f"Expected argument `path` to be a new file, but {str(path)!r} exists; pass overwrite=True to replace it."
        )
    model, calibrator, predictor, processor = _resolve(model_or_folder, calibrator, conformal)
    for role, cal in (
        ("calibrator", calibrator),
        ("the conformal predictor's calibrator", getattr(predictor, "calibrator", None)),
    ):
        reason = None if cal is None else exportable(cal)
        if reason is not None:
            raise ValueError(f"Cannot export {role} {cal.kind!r} to ONNX: {reason}")
    graph = CalibratedClassifier(model, calibrator, predictor).eval()
    if example_inputs is None:
        generator = torch.Generator().manual_seed(0)
        example_inputs = torch.randn(2, *_example_shape(model, processor), generator=generator)
    elif (
        not isinstance(example_inputs, torch.Tensor)
        or example_inputs.ndim != 4
        or not example_inputs.is_floating_point()
    ):
        raise ValueError("Expected argument `example_inputs` to be a (N, C, H, W) floating tensor of pixel values.")
    if example_inputs.shape[0] < 2:  # a batch of 1 would be specialised to 1 by the tracer
        example_inputs = example_inputs.expand(2, *example_inputs.shape[1:]).contiguous()
    args = (example_inputs,)
    if "u" in graph.input_names:
        args += (torch.rand(example_inputs.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64),)
    _export(graph, args, path, opset_version)
    _write_metadata(path, model, calibrator, predictor, graph)
    result = ExportResult(
        path=str(path),
        inputs=graph.input_names,
        outputs=graph.output_names,
        opset=_opset(path),
        max_abs_diff=None,
        sets_equal=None,
    )
    if verify:
        result.update(_verify(graph, args, path))
    logger.info("Wrote %s (outputs %s)", path, ", ".join(graph.output_names))
    return result


def _export(graph: CalibratedClassifier, args: tuple, path: Path, opset_version: int | None) -> None:
    batch = torch.export.Dim("batch", min=1)
    dynamic_shapes = [{0: batch}] + [{0: batch}] * (len(args) - 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import onnxscript  # noqa: F401 - the exporter's dependency: a clear message rather than its ImportError
    except ImportError:
        raise ImportError("export_onnx needs onnx and onnxscript: pip install 'hf-calibration[export]'.") from None
    with torch.no_grad():
        program = torch.onnx.export(
            graph,
            args,
            dynamo=True,
            input_names=graph.input_names,
            output_names=graph.output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            verbose=False,
        )
    program.save(str(path))


def _opset(path: Path) -> int | None:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _write_metadata(path: Path, model: nn.Module, calibrator, predictor, graph: CalibratedClassifier) -> None:
    import onnx

    from hf_calibration._core.version import __version__

    proto = onnx.load(str(path))
    config = getattr(model, "config", None)
    id2label = getattr(config, "id2label", None) or {}
    meta = {
        "hf_calibration_version": __version__,
        "head": graph.task,
        "id2label": json.dumps({str(k): v for k, v in id2label.items()}),
        "calibrator": "" if calibrator is None else calibrator.kind,
    }
    if predictor is not None:
        info = predictor.fit_info_
        meta.update(
            {
                "conformal_method": predictor.method,
                "conformal_alpha": repr(info["alpha"]),
                "conformal_randomized": str(predictor.randomized).lower(),
                "conformal_calibrator": "" if predictor.calibrator is None else predictor.calibrator.kind,
            }
        )
        if graph.set_kind == "multilabel":  # a label is in the set when its probability exceeds the threshold
            meta["conformal_threshold"] = repr(info["threshold"])
        else:
            meta["conformal_q_hat"] = repr(info["q_hat"])
        if graph.set_kind == "one_logit":
            meta["conformal_set_columns"] = "the classes 0 and 1 of the one-logit binary head (1: the model's label)"
    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


def _verify(graph: CalibratedClassifier, args: tuple, path: Path) -> dict[str, Any]:
    try:
        import onnxruntime
    except ImportError:
        logger.warning("onnxruntime is not installed: %s was not checked against the PyTorch model.", path)
        return {}
    import numpy as np

    with torch.no_grad():
        expected = [t.numpy() for t in graph(*args)]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: a.numpy() for name, a in zip(graph.input_names, args)})
    diff = float(np.abs(got[1].astype(np.float64) - expected[1].astype(np.float64)).max())
    sets_equal = bool(np.array_equal(got[2], expected[2])) if len(got) > 2 else None
    if not diff <= PROBABILITY_TOLERANCE or sets_equal is False:
        raise RuntimeError(
            f"The ONNX graph {str(path)!r} disagrees with the PyTorch model on the example inputs: largest "
            f"probability difference {diff:.3g} (tolerance {PROBABILITY_TOLERANCE:g}), sets equal: {sets_equal}."
        )
    return {"max_abs_diff": diff, "sets_equal": sets_equal}
