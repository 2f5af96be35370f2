"""`MaCCalConfig` validates every constant with a message naming it."""

from __future__ import annotations

import pytest

from hf_calibration.maccal import MaCCalConfig


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"rho0": 0.0}, ValueError, "rho0"),
        ({"rho0": 1.5}, ValueError, "rho0"),
        ({"rho0": -0.2}, ValueError, "rho0"),
        ({"hidden": 0}, ValueError, "hidden"),
        ({"hidden": -3}, ValueError, "hidden"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"epochs": 2.5}, TypeError, "epochs"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": -0.1}, ValueError, "lr"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"kappa": 0.0}, ValueError, "kappa"),
        ({"step": -1.0}, ValueError, "step"),
        ({"clip_bound": 0.0}, ValueError, "clip_bound"),
        ({"clip_decay": -1.0}, ValueError, "clip_decay"),
        ({"rho_min": 0.6, "rho_max": 0.5, "rho0": 0.55}, ValueError, "rho_min"),
        ({"rho_min": 0.5, "rho0": 0.3}, ValueError, "rho0"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"adaptive": "yes"}, TypeError, "adaptive"),
        ({"init": "stage1"}, ValueError, "init"),
        ({"feedback": "unmasked"}, ValueError, "feedback"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_bad_config_is_rejected(kwargs, error, name):
    with pytest.raises(error, match=f"`{name}`"):
        MaCCalConfig(**kwargs)


def test_rho0_of_one_is_allowed():
    assert MaCCalConfig(rho0=1.0).rho0 == 1.0
