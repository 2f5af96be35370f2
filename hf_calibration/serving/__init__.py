"""Calibrated scores where models are served: ONNX Runtime (``export_onnx``), ``torch.export`` / ``torch.compile``
(``CalibratedClassifier``; an attached calibrator traces with the model) and Inference Endpoints
(``write_endpoint_handler``); a model folder loaded with its calibrator (``load_calibrated_model``, ``pipeline``)."""

from hf_calibration.serving.calibrated_model import load_calibrated_model, pipeline
from hf_calibration.serving.endpoint import push_endpoint_handler, write_endpoint_handler
from hf_calibration.serving.graph import HEADS, CalibratedClassifier
from hf_calibration.serving.onnx_export import ExportResult, export_onnx, exportable

__all__ = [
    "HEADS",
    "CalibratedClassifier",
    "ExportResult",
    "export_onnx",
    "exportable",
    "load_calibrated_model",
    "pipeline",
    "push_endpoint_handler",
    "write_endpoint_handler",
]
