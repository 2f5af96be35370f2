"""Progress bars: huggingface_hub's tqdm under the group name ``hf_calibration``, shown only for work that lasts.

A bar appears only after ``DELAY_S`` seconds (a 0.2 s fit prints nothing, on a terminal or in a log file) and
ends on its final count. Off switches, in the order an HF user reaches for them:

* ``HF_CALIBRATION_DISABLE_PROGRESS_BARS=1``: this package's bars only;
* ``huggingface_hub.utils.disable_progress_bars("hf_calibration")`` (and ``enable_progress_bars``): the same,
  from Python;
* ``HF_HUB_DISABLE_PROGRESS_BARS=1`` or ``huggingface_hub.utils.disable_progress_bars()``: every HF bar;
* ``progress_bar=False`` on the call itself.
"""

from __future__ import annotations

import os

GROUP = "hf_calibration"
ENV_DISABLE = "HF_CALIBRATION_DISABLE_PROGRESS_BARS"
DELAY_S = 1.0  # no bar for work shorter than this


def bars_disabled() -> bool:
    """Whether this package's bars are switched off (environment variable or huggingface_hub's group switch)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    return os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes", "on") or are_progress_bars_disabled(
        GROUP
    )


def progress_bar(*, total: int, desc: str, enabled: bool = True, leave: bool = True):
    """A tqdm bar (a context manager) that shows after ``DELAY_S`` seconds and stays on its last count (``leave=False``:
    it is erased when done, for the inner steps of a longer piece of work)."""
    from huggingface_hub.utils import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled or bars_disabled(), delay=DELAY_S, leave=leave, name=GROUP)


def progress_iter(iterable, *, desc: str, enabled: bool = True, **kwargs):
    """``iterable`` wrapped in the package's bar (same group, delay and off switches as ``progress_bar``)."""
    from huggingface_hub.utils import tqdm

    return tqdm(iterable, desc=desc, disable=not enabled or bars_disabled(), delay=DELAY_S, name=GROUP, **kwargs)


def finish(bar, done: int) -> None:
    """Make ``done`` the bar's total, so that it closes at 100 % when early stopping ends a fit before its step
    budget (tqdm's ``close`` draws the final state, and only for a bar that was shown)."""
    bar.total = bar.n = done
