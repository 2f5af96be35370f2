"""Calibration of object detectors: matching, detection ECE / D-ECE / LaECE, and score calibrators."""

from hf_calibration.detection.calibrators import (
    BoxLogisticCalibration,
    DetectionCalibrator,
    DetectionIsotonic,
    DetectionPlatt,
    DetectionTemperatureScaling,
    load_detection_calibrator,
)
from hf_calibration.detection.matching import Detections, match_detections
from hf_calibration.detection.metrics import (
    BOX_FEATURES,
    d_ece,
    detection_calibration_report,
    detection_ece,
    detection_reliability,
    laece,
    ranking_ap,
)

__all__ = [
    "BOX_FEATURES",
    "BoxLogisticCalibration",
    "DetectionCalibrator",
    "DetectionIsotonic",
    "DetectionPlatt",
    "DetectionTemperatureScaling",
    "Detections",
    "d_ece",
    "detection_calibration_report",
    "detection_ece",
    "detection_reliability",
    "laece",
    "load_detection_calibrator",
    "match_detections",
    "ranking_ap",
]
