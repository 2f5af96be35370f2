"""Bad input at the Hub and at attach: offline pushes, repo ids, models that are not models (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _bad_inputs import (
    Case,
    Y,
    Z,
    case_params,
    check,
    tiny_pipeline,
)

from hf_calibration.calibrators import TemperatureScaling, load_calibrator


def hub_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub offline",
            lambda: ts.push_to_hub("me/ts"),
            ("unreachable", "me/ts"),
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub(dry_run=True): the folder loads back",
            lambda: (
                load_calibrator(ts.push_to_hub("me/ts", path_in_repo="calibrator", dry_run=True)).fitted_temperature
            ),
            reference=lambda: ts.fitted_temperature,
            atol=0,
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub('a/b/c')",
            lambda: ts.push_to_hub("a/b/c", dry_run=True),
            ("repo_id",),
        )
    )
    pipe, x = tiny_pipeline()

    def attached_logits():
        with torch.no_grad():
            plain = pipe.model(pixel_values=x).logits
            ts.attach(pipe)
            try:
                return (pipe.model(pixel_values=x).logits - plain / ts.fitted_temperature).abs().max().item()
            finally:
                ts.detach()

    add(
        Case(
            "Hub and attach",
            "calibrators",
            "attach(pipeline): logits / T",
            attached_logits,
            ("model",),
            lambda: 0.0,
            atol=1e-5,
        )
    )
    add(
        Case(
            "Hub and attach", "calibrators", "attach('a model name')", lambda: ts.attach("google/vit-base"), ("model",)
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "attach(unfitted calibrator)",
            lambda: TemperatureScaling().attach(pipe.model),
            ("fit",),
        )
    )
    return cases


@pytest.mark.parametrize("case", case_params(hub_cases))
def test_bad_input(case: Case) -> None:
    check(case)
