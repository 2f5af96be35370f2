"""Calibration metrics: functions over logits (or probabilities) and integer labels."""

from .accumulator import CalibrationAccumulator
from .adaptive import adaece
from .ece import ECESplit, classwise_ece, ece, ece_split, mce
from .reliability import ReliabilityTable, reliability_diagram, reliability_table
from .report import CalibrationReport, calibration_report, format_reports
from .scores import brier, nll
from .smooth import smce, smece

__all__ = [
    "CalibrationAccumulator",
    "CalibrationReport",
    "ECESplit",
    "ReliabilityTable",
    "adaece",
    "brier",
    "calibration_report",
    "classwise_ece",
    "ece",
    "ece_split",
    "format_reports",
    "mce",
    "nll",
    "reliability_diagram",
    "reliability_table",
    "smce",
    "smece",
]
