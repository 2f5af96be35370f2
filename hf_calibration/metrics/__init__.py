"""Calibration metrics: functions over logits (or probabilities) and integer labels."""

from hf_calibration.metrics.accumulator import CalibrationAccumulator
from hf_calibration.metrics.adaptive import adaece
from hf_calibration.metrics.bootstrap import MetricInterval
from hf_calibration.metrics.debiased import debiased_ece
from hf_calibration.metrics.ece import ECESplit, classwise_ece, ece, ece_split, mce, rmsce
from hf_calibration.metrics.multilabel import SigmoidCalibrationReport
from hf_calibration.metrics.ood import ood_metrics, ood_metrics_from_scores, ood_scores
from hf_calibration.metrics.reliability import ReliabilityTable, reliability_diagram, reliability_table
from hf_calibration.metrics.report import CalibrationReport, calibration_report, format_reports
from hf_calibration.metrics.scores import brier, nll
from hf_calibration.metrics.selective import RiskCoverage, aurc, eaurc, risk_coverage_curve, risk_coverage_plot
from hf_calibration.metrics.smooth import smce, smece

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
