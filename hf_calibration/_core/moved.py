"""Module paths of earlier releases, kept importing: ``hf_calibration.trainer`` is ``hf_calibration.training.trainer``.

The package was regrouped by layer (core, methods, integrations, faces). Code that imports a module by its old path
still gets the module, the same object as under its new name, with a ``FutureWarning`` naming the new path. No file
is left at the old place: a finder on ``sys.meta_path`` answers for the old names only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED_MODULES", "install"]

MOVED_MODULES = {  # old module -> new module (both absolute)
    "hf_calibration.calibrated_model": "hf_calibration.serving.calibrated_model",
    "hf_calibration.data": "hf_calibration.io.data",
    "hf_calibration.disk_logits": "hf_calibration.io.disk_logits",
    "hf_calibration.eval_calibration": "hf_calibration.training.eval_calibration",
    "hf_calibration.features": "hf_calibration._core.features",
    "hf_calibration.inference": "hf_calibration.io.inference",
    "hf_calibration.logits_cache": "hf_calibration.io.logits_cache",
    "hf_calibration.logits_io": "hf_calibration.io.logits_files",
    "hf_calibration.metric_scripts": "hf_calibration.hub.metric_scripts",
    "hf_calibration.metric_spaces": "hf_calibration.hub.spaces",
    "hf_calibration.model_loading": "hf_calibration.io.model_loading",
    "hf_calibration.tasks": "hf_calibration._core.tasks",
    "hf_calibration.trainer": "hf_calibration.training.trainer",
    "hf_calibration.calibrators.beta": "hf_calibration.calibrators.sigmoid.beta",
    "hf_calibration.calibrators.platt": "hf_calibration.calibrators.sigmoid.platt",
    "hf_calibration.calibrators.sigmoid_histogram": "hf_calibration.calibrators.sigmoid.histogram",
    "hf_calibration.calibrators.sigmoid_isotonic": "hf_calibration.calibrators.sigmoid.isotonic",
    "hf_calibration.calibrators.sigmoid_selection": "hf_calibration.calibrators.sigmoid.selection",
    "hf_calibration.calibrators.sigmoid_temperature": "hf_calibration.calibrators.sigmoid.temperature",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"`{old}` moved to `{new}`; the old path will be removed in a future release.", FutureWarning, stacklevel=4
    )


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module of its new name (``sys.modules`` then holds one object under both)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module):  # the new module ran when it was imported
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        _warn(fullname, new)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
