"""The examples in the metric docstrings run and print what they say."""

import doctest
import importlib

import pytest

MODULES = ["adaptive", "binning", "bootstrap", "debiased", "ece", "reliability", "report", "scores", "smooth"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    # import_module: the package attribute `ece` is the function, the module is in sys.modules
    module = importlib.import_module(f"hf_calibration.metrics.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
