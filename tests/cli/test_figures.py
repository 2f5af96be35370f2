"""Every CLI command that writes a figure, once, on real shared logits, with its figure option; and the table of a
command is printed before its figures are written, so a figure that cannot be written never loses the numbers."""

from pathlib import Path

import numpy as np
import pytest

from hf_calibration.cli import main

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits"
RESNET50_CE = SHARED / "cifar10_resnet50_cross_entropy_calibench.npz"
WRN100 = SHARED / "netcal_wideresnet-16-4-cifar-100.npz"
PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.skipif(not RESNET50_CE.is_file(), reason="the shared logits folder (../shared) is absent")


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", [RESNET50_CE, WRN100], ids=["resnet50-cifar10", "wrn-cifar100"])
def test_report_diagram_on_real_logits(capsys, tmp_path, path):
    for extra in ([], ["--margin-groups", "3"], ["--ci", "0.9", "--n-boot", "100"]):
        diagram = tmp_path / f"report{len(extra)}.png"
        code, out, err = _run(capsys, "report", "--logits", path, "--diagram", diagram, *extra)
        assert code == 0, err
        assert diagram.read_bytes()[:8] == PNG and "ECE" in out and f"reliability diagram: {diagram}" in out


def test_fit_then_apply_diagram_on_real_logits(capsys, tmp_path):
    code, _, err = _run(capsys, "fit", "--logits", RESNET50_CE, "--method", "smart", "--out", tmp_path / "cal")
    assert code == 0, err
    for extra in ([], ["--margin-groups", "2"]):
        diagram = tmp_path / f"apply{len(extra)}.png"
        code, out, err = _run(
            capsys, "apply", "--calibrator", tmp_path / "cal", "--logits", RESNET50_CE, "--diagram", diagram, *extra
        )
        assert code == 0, err
        assert diagram.read_bytes()[:8] == PNG and "smart" in out


def test_compare_out_on_real_logits(capsys, tmp_path):
    code, out, err = _run(
        capsys,
        "compare",
        "--logits",
        RESNET50_CE,
        "--methods",
        "ts,histogram_binning",
        "--cv",
        "3",
        "--out",
        tmp_path / "figs",
    )
    assert code == 0, err
    written = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert written == [
        "reliability_histogram_binning.png",
        "reliability_temperature_scaling.png",
        "reliability_uncalibrated.png",
    ]
    assert all((tmp_path / "figs" / name).read_bytes()[:8] == PNG for name in written)


@pytest.fixture()
def failing_savefig(monkeypatch):
    from matplotlib.figure import Figure

    def fail(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", fail)


@pytest.mark.parametrize("command", ["report", "apply", "compare"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_figure_that_cannot_be_written_never_loses_the_table(capsys, tmp_path, command, as_json, failing_savefig):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(400, 5)) * 3
    labels = rng.integers(0, 5, 400)
    np.savez(tmp_path / "z.npz", logits=logits, labels=labels)
    flag = ["--json"] if as_json else []
    if command == "report":
        argv = ["report", "--logits", tmp_path / "z.npz", "--diagram", tmp_path / "d.png"]
    elif command == "apply":
        assert _run(capsys, "fit", "--logits", tmp_path / "z.npz", "--method", "ts", "--out", tmp_path / "cal")[0] == 0
        argv = [
            "apply",
            "--calibrator",
            tmp_path / "cal",
            "--logits",
            tmp_path / "z.npz",
            "--diagram",
            tmp_path / "d.png",
        ]
    else:
        argv = ["compare", "--logits", tmp_path / "z.npz", "--methods", "ts", "--cv", "2", "--out", tmp_path / "figs"]
    code, out, err = _run(capsys, *argv, *flag)
    assert code == 1 and "could not be written (No space left on device)" in err
    assert ('"ece"' in out or '"table"' in out) if as_json else "ECE" in out  # the numbers were printed first
