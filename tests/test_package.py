"""The top-level package: every advertised name resolves, and importing it stays light."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

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


def test_the_top_level_is_the_first_hours_names():
    """Issue 52 item 6: the top level keeps what a user types first; the rest is reached through its subpackage."""
    assert sorted(hf_calibration.__all__) == sorted(
        [
            "__version__",
            "metrics",
            *("adaece", "brier", "calibration_report", "classwise_ece", "ece", "mce", "nll"),
            *("reliability_diagram", "smce", "smece", "metric_path", "FeDLaSLoss"),
            *("AutoCalibrator", "create_calibrator", "list_calibrators", "load_calibrator"),
            *("CalibrationCallback", "CalibrationTrainer", "ConformalPredictor", "load_calibrated_model", "pipeline"),
        ]
    )
    from hf_calibration.calibrators import TemperatureScaling

    assert hf_calibration.create_calibrator("temperature_scaling").__class__ is TemperatureScaling
    with pytest.raises(AttributeError):
        hf_calibration.TemperatureScaling  # noqa: B018


def test_module_paths_of_earlier_releases_are_gone():
    """The old paths (``hf_calibration.trainer``, ``hf_calibration.calibrators.platt``, ...) no longer import."""
    for old in ("hf_calibration.trainer", "hf_calibration.inference", "hf_calibration.calibrators.platt"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


PACKAGE = Path(hf_calibration.__file__).resolve().parent


def test_the_root_holds_a_dozen_entries_each_named_for_its_concern():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 16, entries  # 14, and the two dense-prediction tasks (issue 56): detection, segmentation
    assert {
        "_core",
        "metrics",
        "calibrators",
        "conformal",
        "losses",
        "maccal",
        "io",
        "training",
        "serving",
        "hub",
        "shift",
        "cli",
        "demo.py",
        "__init__.py",
        "detection",
        "segmentation",
    } == set(entries)


def test_no_module_imports_the_package_face():
    """The faces sit on top: a module below them importing ``hf_calibration`` itself (``from hf_calibration import
    __version__``, ``import hf_calibration; hf_calibration.pipeline``) is an upward import and, through the lazy exports,
    a cycle. ``lint-imports`` checks the layers between packages; this checks the face, which no layer contains."""
    offenders = []
    submodules = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            face_names = isinstance(node, ast.ImportFrom) and node.module == "hf_calibration" and node.level == 0
            if face_names and any(alias.name not in submodules for alias in node.names):  # a submodule is no face
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if isinstance(node, ast.Import) and any(alias.name == "hf_calibration" for alias in node.names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], offenders


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def test_ci_lowest_versions_are_pyprojects_lower_bounds():
    """CI's second virtualenv installs .ci/lowest.txt: each pin must be the lower bound pyproject declares (issue 50)."""
    import re

    import tomllib

    root = PACKAGE.parent
    bounds = {}
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    for dep in [*project["dependencies"], *project["optional-dependencies"]["video"]]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,<.*)?", dep)
        if m:
            bounds[m.group(1).lower()] = max(bounds.get(m.group(1).lower(), "0"), m.group(2), key=_release)
    pins = {}
    for line in (root / ".ci" / "lowest.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower()] = version
    assert {"torch", "transformers", "datasets", "accelerate", "timm", "huggingface-hub"} <= set(pins)
    for name, version in pins.items():
        # "5.0" declared is "5.0.0" pinned: compare release tuples padded with zeros
        declared = [int(x) for x in bounds[name].split(".")]
        pinned = [int(x) for x in version.split(".")]
        width = max(len(declared), len(pinned))
        assert declared + [0] * (width - len(declared)) == pinned + [0] * (width - len(pinned)), (name, version)
