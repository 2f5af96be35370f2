"""Calibration metrics: functions over logits (or probabilities) and integer labels."""

from .accumulator import CalibrationAccumulator
from .adaptive import adaece
from .bootstrap import MetricInterval
from .debiased import debiased_ece
from .ece import ECESplit, classwise_ece, ece, ece_split, mce, rmsce
from .multilabel import SigmoidCalibrationReport
from .ood import ood_metrics, ood_metrics_from_scores, ood_scores
from .reliability import ReliabilityTable, reliability_diagram, reliability_table
from .report import CalibrationReport, calibration_report, format_reports
from .scores import brier, nll
from .selective import RiskCoverage, aurc, eaurc, risk_coverage_curve, risk_coverage_plot
from .smooth import smce, smece

__all__ = [
    "CalibrationAccumulator",
    "CalibrationReport",
    "ECESplit",
    "MetricInterval",
    "ReliabilityTable",
    "RiskCoverage",
    "SigmoidCalibrationReport",
    "adaece",
    "aurc",
    "brier",
    "calibration_report",
    "classwise_ece",
    "debiased_ece",
    "ece",
    "eaurc",
    "ece_split",
    "format_reports",
    "mce",
    "nll",
    "ood_metrics",
    "ood_metrics_from_scores",
    "ood_scores",
    "reliability_diagram",
    "reliability_table",
    "risk_coverage_curve",
    "risk_coverage_plot",
    "rmsce",
    "smce",
    "smece",
]
