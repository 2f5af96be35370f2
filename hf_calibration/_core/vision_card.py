"""The model card of a saved detection or segmentation calibrator: the fit and its metrics before / after.

One template for both tasks (the rows differ): the numbers come from the fit record (``fit_info_``), measured on the
fit data and, where the fit was given one, on a held-out set; the Hub task tag (``object-detection`` /
``image-segmentation``) is added by the persistence (``Saved.generate_model_card``) from ``pipeline_task``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISION_CARD_TEMPLATE", "metric_rows"]

VISION_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A post-hoc calibrator for {{ model_kind }}, saved with the `hf_calibration` library (`pip install hf-calibration`).
{{ method_description }}

{% if citation %}Method: {{ citation }}.
{% endif %}
## Fit

| | |
|---|---|
| calibrator | `{{ kind }}` |
{{ fit_rows }}| checkpoint format | {{ format_version }} |

## Calibration before / after

| metric | data | before | after |
|---|---|---|---|
{{ metric_rows }}

{{ metric_note }}

## Usage

Saved in a model folder's `calibrator/` subfolder, one call loads both:

```python
import hf_calibration

{{ usage }}
```
"""


def _pct(x: Any) -> str:
    return "n/a" if x is None else ("NaN" if x != x else f"{100 * x:.2f}%")


def metric_rows(fit: dict[str, Any] | None, names: dict[str, str]) -> str:
    """The before / after table rows of ``fit`` (``fit_info_``): for each of ``names`` (key -> label) and each data set
    recorded (``"fit_set"``, then ``"held_out"``), ``fit[data][key + "_before"]`` and ``..._after``."""
    lines = []
    for data, label in (("fit_set", "fit set"), ("held_out", "held-out set")):
        record = (fit or {}).get(data)
        if not isinstance(record, dict):
            continue
        for key, name in names.items():
            if f"{key}_before" in record:
                lines.append(
                    f"| {name} | {label} | {_pct(record[f'{key}_before'])} | {_pct(record.get(f'{key}_after'))} |"
                )
    return "\n".join(lines) if lines else "| n/a | | | |"
