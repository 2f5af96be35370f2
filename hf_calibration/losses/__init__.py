"""Training-time calibration losses: LS, MbLS, focal / FLSD-53 and FeDLaS for softmax heads; BCE, focal, label smoothing and
the asymmetric loss for sigmoid (binary, multi-label) heads. Usable as Trainer's `compute_loss_func`."""

from ._base import CalibrationLoss
from ._registry import LOSS_MAPPING, get_loss, list_losses
from .cross_entropy import CrossEntropyLoss
from .fedlas import BidirectionalCalibrationGate, FeDLaSLoss, FeDLaSLSLoss, FeDLaSMbLSLoss, straight_through_sign
from .focal import FLSD53Loss, FocalLoss
from .label_smoothing import LabelSmoothingLoss
from .margin import MbLSLoss
from .multilabel import AsymmetricLoss, BinaryCrossEntropyLoss, BinaryLabelSmoothingLoss, SigmoidFocalLoss, SigmoidLoss

__all__ = [
    "AsymmetricLoss",
    "BidirectionalCalibrationGate",
    "BinaryCrossEntropyLoss",
    "BinaryLabelSmoothingLoss",
    "CalibrationLoss",
    "CrossEntropyLoss",
    "FLSD53Loss",
    "FeDLaSLoss",
    "FeDLaSLSLoss",
    "FeDLaSMbLSLoss",
    "FocalLoss",
    "LOSS_MAPPING",
    "LabelSmoothingLoss",
    "MbLSLoss",
    "SigmoidFocalLoss",
    "SigmoidLoss",
    "get_loss",
    "list_losses",
    "straight_through_sign",
]
