"""Test-session settings: no hub access (a model-card lookup would otherwise retry for ~20 s)."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_calibration_tests_"))
# The compiled kernels from the first call (no numpy twins, ``_core/numpy_twin.py``): the tests are of the kernels;
# each twin is tested against its kernel on its own (tests/_core/test_numpy_twin.py and beside each kernel's tests)
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")

# Property tests draw new cases on every run locally (that is how they find bugs); in CI they replay a fixed
# sequence, so a run that passed on a branch passes again on main (`HYPOTHESIS_PROFILE=dev` to explore there too).
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
