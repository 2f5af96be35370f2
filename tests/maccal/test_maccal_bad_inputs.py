"""maccal_stage checks its features before the first epoch (one case a test; see ``tests/_bad_inputs.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _bad_inputs import (
    Case,
    K,
    case_params,
    check,
    tiny_vit,
)


def maccal_feature_cases(tmp: Path) -> list[Case]:
    """Item 9: ``maccal_stage(model, features=(X, Y))`` checks its input before the first epoch."""
    from hf_calibration.maccal import MaCCalConfig, maccal_stage

    model = tiny_vit()
    d = model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, d, generator=g), torch.randint(0, K, (64,), generator=g)
    config = MaCCalConfig(epochs=1, batch_size=32, progress=False)

    def stage(features):
        return lambda: maccal_stage(tiny_vit(), features=features, config=config)

    nan_x = x.clone()
    nan_x[63, 0] = float("nan")
    inf_x = x.clone()
    inf_x[5, 3] = float("inf")
    bad = [
        ("a NaN feature in the last row", (nan_x, y), "features[0]"),
        ("an inf feature", (inf_x, y), "features[0]"),
        (f"a label = K = {K}", (x, torch.where(torch.arange(64) == 7, K, y)), "features[1]"),
        ("a label of -1", (x, torch.where(torch.arange(64) == 7, -1, y)), "features[1]"),
        ("64 features, 63 labels", (x, y[:63]), "features"),
        ("float labels", (x, y.double() + 0.4), "features[1]"),
        (f"features of width {d + 1}, not the head's {d}", (torch.randn(64, d + 1, generator=g), y), "features[0]"),
        ("2-D labels", (x, y[:, None]), "features[1]"),
        ("not a pair", (x,), "features"),
    ]
    return [
        Case(
            "labels" if "label" in name else "NaN / inf" if "NaN" in name or "inf" in name else "rank / shape",
            "maccal",
            f"maccal_stage(features=...): {name}",
            stage(features),
            (expect,),
        )
        for name, features, expect in bad
    ]


@pytest.mark.parametrize("case", case_params(maccal_feature_cases))
def test_bad_input(case: Case) -> None:
    check(case)
