"""Loss names → classes (`LOSS_MAPPING`) and the string factory `get_loss`."""

from __future__ import annotations

from hf_calibration.losses._base import CalibrationLoss
from hf_calibration.losses.cross_entropy import CrossEntropyLoss
from hf_calibration.losses.fedlas import FeDLaSLSLoss, FeDLaSMbLSLoss
from hf_calibration.losses.focal import FLSD53Loss, FocalLoss
from hf_calibration.losses.label_smoothing import LabelSmoothingLoss
from hf_calibration.losses.margin import MbLSLoss
from hf_calibration.losses.multilabel import (
    AsymmetricLoss,
    BinaryCrossEntropyLoss,
    BinaryLabelSmoothingLoss,
    SigmoidFocalLoss,
)

LOSS_MAPPING = {
    "ce": CrossEntropyLoss,
    "ls": LabelSmoothingLoss,
    "mbls": MbLSLoss,
    "focal": FocalLoss,
    "flsd53": FLSD53Loss,
    "fedlas_ls": FeDLaSLSLoss,
    "fedlas_mbls": FeDLaSMbLSLoss,
    # sigmoid heads (binary, multi-label): losses.multilabel
    "bce": BinaryCrossEntropyLoss,
    "binary_ls": BinaryLabelSmoothingLoss,
    "sigmoid_focal": SigmoidFocalLoss,
    "asl": AsymmetricLoss,
}


def list_losses() -> list[str]:
    return sorted(LOSS_MAPPING)


def get_loss(name: str, **kwargs) -> CalibrationLoss:
    """Build a loss by name, e.g. ``get_loss("fedlas_mbls", num_classes=10, beta=1.0)``.

    Names: ``ce``, ``ls``, ``mbls``, ``focal``, ``flsd53``, ``fedlas_ls``, ``fedlas_mbls`` (softmax heads); ``bce``,
    ``binary_ls``, ``sigmoid_focal``, ``asl`` (sigmoid heads: binary, multi-label).
    """
    if not isinstance(name, str):
        raise TypeError(f"Expected argument `name` to be a loss name (str), but got {name!r}.")
    key = name.lower().replace("-", "_")
    if key not in LOSS_MAPPING:
        raise ValueError(f"Expected argument `name` to be one of {list_losses()}, but got {name!r}.")
    return LOSS_MAPPING[key](**kwargs)
