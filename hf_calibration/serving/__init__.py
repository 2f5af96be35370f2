"""Calibrated scores where models are served: ONNX Runtime (``export_onnx``), ``torch.export`` / ``torch.compile``
(``CalibratedClassifier``; an attached calibrator traces with the model) and Inference Endpoints
(``write_endpoint_handler``)."""

from .endpoint import push_endpoint_handler, write_endpoint_handler
from .graph import HEADS, CalibratedClassifier
from .onnx_export import ExportResult, export_onnx, exportable

__all__ = [
    "HEADS",
    "CalibratedClassifier",
    "ExportResult",
    "export_onnx",
    "exportable",
    "push_endpoint_handler",
    "write_endpoint_handler",
]
