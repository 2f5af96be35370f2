"""The vectorised ``exp`` / ``log`` kernels live in :mod:`hf_calibration._vmath` (the metrics' passes use them too)."""

from .._vmath import *  # noqa: F401,F403
from .._vmath import exp_into, exp_into_f32, log_into, max_of, sum_of  # noqa: F401
