"""The top-level package: every advertised name resolves, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hf_calibration


@pytest.mark.parametrize("name", sorted(hf_calibration.__all__))
def test_every_public_name_resolves(name):
    assert getattr(hf_calibration, name) is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        hf_calibration.no_such_thing  # noqa: B018


def test_import_does_not_load_the_trainer_or_transformers():
    code = "import sys, hf_calibration; print('transformers' in sys.modules, 'hf_calibration.training.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_names_the_readme_uses_are_exported():
    """Issue 29 item 14: the README names ``attached_calibrator`` (and the new warning), which the top level lacked."""
    from hf_calibration.calibrators import HeldOutWorseWarning, attached_calibrator

    assert hf_calibration.attached_calibrator is attached_calibrator and "attached_calibrator" in hf_calibration.__all__
    assert hf_calibration.HeldOutWorseWarning is HeldOutWorseWarning
