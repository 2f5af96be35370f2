"""Calibration under distribution shift: the Hendrycks & Dietterich (2019) corruptions and the shift report.

``corrupt(image, name, severity, seed=0)`` applies one corruption with the published CIFAR-10-C (32 px) or
ImageNet-C (224 px) parameters; ``corruption_transform`` does it on the fly for a ``datasets.Dataset``.
``fit_for_shift(model, dataset, method="ets")`` fits a calibrator to survive shift (the held-out images perturbed
from clean to near chance; Tomani et al., CVPR 2021); ``calibrator.adapt(unlabeled_logits)`` adapts a fitted one to
deployment data without labels (ATC, Garg et al., ICLR 2022). The corruption functions need the ``shift`` extra (``pip install "hf-calibration[shift]"``: OpenCV,
scikit-image and the ``imagecorruptions`` package's frost textures); they are imported on first use.
"""

from hf_calibration.shift.ladder import adapt_on_ladder, label_free_check
from hf_calibration.shift.perturbation import ShiftTradeoffWarning, fit_for_shift, fit_on_perturbed
from hf_calibration.shift.report import ShiftReport, shift_report
from hf_calibration.shift.transform import CORRUPTIONS, corrupt, corruption_transform

__all__ = [
    "CORRUPTIONS",
    "adapt_on_ladder",
    "label_free_check",
    "ShiftReport",
    "ShiftTradeoffWarning",
    "corrupt",
    "fit_for_shift",
    "fit_on_perturbed",
    "corruption_transform",
    "shift_report",
]
