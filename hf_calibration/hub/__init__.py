"""The ``evaluate`` side of the Hub: the bundled metric scripts (``metric_path``) and their publication as Spaces
(``push_metric_spaces``), so that ``evaluate.load("<org>/ece")`` works online."""

from hf_calibration.hub.metric_scripts import list_metric_scripts, metric_path
from hf_calibration.hub.spaces import build_metric_spaces, push_metric_spaces

__all__ = ["build_metric_spaces", "list_metric_scripts", "metric_path", "push_metric_spaces"]
