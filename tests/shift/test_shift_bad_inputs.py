"""Bad and tricky input to the corruptions: images of more than 8 bits, seeds out of range (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _bad_inputs import (
    Case,
    case_params,
    check,
)


def image_cases(tmp: Path) -> list[Case]:
    """Item 3 and item 12's seed: images of more than 8 bits, seeds beyond RandomState's range."""
    try:
        from PIL import Image

        from hf_calibration.shift import corrupt, corruption_transform
    except ImportError:  # the shift extra is not installed
        return []
    cases: list[Case] = []
    add = cases.append
    ramp = np.tile(np.linspace(0, 1, 64), (64, 1))
    images = {
        "I;16 (uint16 ramp)": Image.fromarray((ramp * 65535).astype(np.uint16)),
        "I (int32 ramp)": Image.fromarray((ramp * 65535).astype(np.int32)),
        "F (float ramp in [0, 1])": Image.fromarray(ramp.astype(np.float32)),
    }
    for label, image in images.items():
        for name in ("contrast", "gaussian_noise", "fog"):
            add(
                Case(
                    "dtype",
                    "shift",
                    f"corrupt({label}, {name})",
                    lambda image=image, name=name: corrupt(image, name, 2),
                    ("image", image.mode),
                )
            )
        add(
            Case(
                "dtype",
                "shift",
                f"corruption_transform(contrast) on {label}",
                lambda image=image: corruption_transform("contrast", 2)({"image": [image]}),
                ("image", image.mode),
            )
        )
    eight = Image.fromarray((ramp * 255).astype(np.uint8))
    add(
        Case(
            "dtype",
            "shift",
            "corrupt(8-bit L ramp, brightness 1): mode and size kept",
            lambda: (corrupt(eight, "brightness", 1).mode, corrupt(eight, "brightness", 1).size),
            reference=lambda: ("L", (64, 64)),
        )
    )
    for seed in (2**32, 2**40):
        add(
            Case(
                "hyper-parameters",
                "shift",
                f"corrupt(seed={seed})",
                lambda seed=seed: corrupt(eight, "gaussian_noise", 1, seed=seed),
                ("seed",),
            )
        )
        add(
            Case(
                "hyper-parameters",
                "shift",
                f"corruption_transform(seed={seed})",
                lambda seed=seed: corruption_transform("fog", 1, seed=seed),
                ("seed",),
            )
        )
    add(
        Case(
            "hyper-parameters",
            "shift",
            "corrupt(seed=2**32 - 1): runs",
            lambda: corrupt(eight, "gaussian_noise", 1, seed=2**32 - 1).size,
            reference=lambda: (64, 64),
        )
    )
    return cases


@pytest.mark.parametrize("case", case_params(image_cases))
def test_bad_input(case: Case) -> None:
    check(case)
