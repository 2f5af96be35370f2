"""MaC-Cal (Ni et al. 2025): a second training stage that retrains a masked bottleneck head on the frozen backbone.

* :mod:`.config` — :class:`MaCCalConfig`, every constant of the stage;
* :mod:`.head` — :class:`MaskedBottleneckHead` and the mask-aware SGD that trains it (Eqs. 8–11);
* :mod:`.retention` — the adaptive retention rule (Eqs. 12–13);
* :mod:`.stage` — :func:`maccal_stage`: cache the backbone's features, train the head, install it;
* :mod:`.persistence` — how a model carries the head: its config, ``from_pretrained`` / ``pipeline``,
  :func:`load_maccal_model`.
"""

from hf_calibration.maccal.config import MaCCalConfig
from hf_calibration.maccal.head import MaskedBottleneckHead
from hf_calibration.maccal.persistence import load_maccal_model
from hf_calibration.maccal.stage import MaCCalResult, maccal_stage

__all__ = [
    "MaCCalConfig",
    "MaCCalResult",
    "MaskedBottleneckHead",
    "load_maccal_model",
    "maccal_stage",
]
