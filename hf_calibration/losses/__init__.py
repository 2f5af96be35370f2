"""Training-time calibration losses: LS, MbLS, focal / FLSD-53 and FeDLaS for softmax heads; BCE, focal, label smoothing and
the asymmetric loss for sigmoid (binary, multi-label) heads. Usable as Trainer's `compute_loss_func`."""

from hf_calibration.losses._base import CalibrationLoss
from hf_calibration.losses._registry import LOSS_MAPPING, get_loss, list_losses
from hf_calibration.losses.cross_entropy import CrossEntropyLoss
from hf_calibration.losses.fedlas import FeDLaSLoss, FeDLaSLSLoss, FeDLaSMbLSLoss
from hf_calibration.losses.focal import FLSD53Loss, FocalLoss
from hf_calibration.losses.label_smoothing import LabelSmoothingLoss
from hf_calibration.losses.margin import MbLSLoss
from hf_calibration.losses.multilabel import (
    AsymmetricLoss,
    BinaryCrossEntropyLoss,
    BinaryLabelSmoothingLoss,
    SigmoidFocalLoss,
    SigmoidLoss,
)

__all__ = [
    "AsymmetricLoss",
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
]
