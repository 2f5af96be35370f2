"""Run a function once a module has been imported, without importing it (a post-import hook).

``import hf_calibration`` stays light (no torch, no transformers); what the package registers with transformers
(the MaC-Cal config type, see ``maccal.persistence``) is registered when transformers loads the module holding the
registry, whichever of the two packages is imported first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)

__all__ = ["call_after_import"]


def call_after_import(module: str, target: str) -> None:
    """Call ``target`` (``"package.module:function"``) once ``module`` has been imported: now, if it already is."""
    if module in sys.modules:
        _call(target)
        return
    if not any(isinstance(f, _AfterImportFinder) and (f.module, f.target) == (module, target) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder(module, target))


def _call(target: str) -> None:
    name, _, attr = target.partition(":")
    try:
        getattr(importlib.import_module(name), attr)()
    except Exception:  # never break the import that triggered the hook
        logger.warning("Could not run %s after its dependency was imported.", target, exc_info=True)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands back the real spec of ``module``, its loader wrapped to call ``target`` after it."""

    def __init__(self, module: str, target: str):
        self.module, self.target = module, target

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # used once; and the search below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.target)
        return spec


class _ThenCall(importlib.abc.Loader):
    """The module's own loader, then ``target``; every other attribute is the wrapped loader's."""

    def __init__(self, loader, target: str):
        self._loader, self._target = loader, target

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _call(self._target)

    def __getattr__(self, name):
        return getattr(self._loader, name)
