"""Import of the optional ``shift`` extra, with the install command in the error."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, package: str) -> ModuleType:
    """``import module``, or an ``ImportError`` that says to ``pip install "hf-calibration[shift]"``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f'hf_calibration.shift needs `{package}` (module `{module}`): pip install "hf-calibration[shift]" ({err})'
        ) from err
