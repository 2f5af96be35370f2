"""``hf-calibration push-metrics``: the dry run writes the Space folders the push uploads (HfApi intercepted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_calibration.cli import main
from hf_calibration.hub import list_metric_scripts

SPEC = "hf-calibration==0.1.0"


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_writes_every_space_folder(capsys, tmp_path):
    code, out, err = _run(
        capsys,
        "push-metrics",
        "--namespace",
        "someorg",
        "--dry-run",
        "--out",
        tmp_path / "spaces",
        "--requirement",
        SPEC,
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "spaces").iterdir() if p.is_dir()) == list_metric_scripts()
    for name in list_metric_scripts():
        assert f"someorg/{name}: {tmp_path / 'spaces' / name}" in out
        assert (tmp_path / "spaces" / name / "requirements.txt").read_text() == SPEC + "\n"
    assert "nothing uploaded" in out
    # a second dry run refuses the folder unless told to replace what the first wrote
    code, _, err = _run(
        capsys,
        "push-metrics",
        "--namespace",
        "someorg",
        "--dry-run",
        "--out",
        tmp_path / "spaces",
        "--requirement",
        SPEC,
    )
    assert code == 1 and err.count("\n") == 1 and "--overwrite" in err
    code, _, err = _run(
        capsys,
        "push-metrics",
        "--namespace",
        "someorg",
        "--dry-run",
        "--out",
        tmp_path / "spaces",
        "--requirement",
        SPEC,
        "--overwrite",
        "--metrics",
        "ece,smce",
    )
    assert code == 0, err


def test_overwrite_never_replaces_a_card_edited_after_the_dry_run(capsys, tmp_path):
    """Item 15: --overwrite replaced a README.md edited after a dry run (calibrator saves keep edited cards)."""
    out = tmp_path / "spaces"
    argv = [
        "push-metrics",
        "--namespace",
        "someorg",
        "--dry-run",
        "--out",
        out,
        "--requirement",
        SPEC,
        "--metrics",
        "ece",
    ]
    assert _run(capsys, *argv)[0] == 0
    card = out / "ece" / "README.md"
    card.write_text(card.read_text() + "\nMy notes on this metric.\n")
    edited = card.read_bytes()
    code, _, err = _run(capsys, *argv, "--overwrite")
    assert code == 1 and err.count("\n") == 1 and "ece/README.md' was changed since it was written" in err
    assert card.read_bytes() == edited
    card.unlink()  # moved away: the folder is the dry run's again, and is replaced
    assert _run(capsys, *argv, "--overwrite")[0] == 0 and card.is_file() and card.read_bytes() != edited


def test_push_prints_how_to_load_each_metric(capsys, monkeypatch):
    import huggingface_hub

    pushed = []

    class Api:
        def __init__(self, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            return huggingface_hub.RepoUrl(f"https://huggingface.co/spaces/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            pushed.append((repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    code, out, err = _run(capsys, "push-metrics", "--namespace", "someorg", "--metrics", "ece", "--requirement", SPEC)
    assert code == 0, err
    assert pushed == [("someorg/ece", ["README.md", "app.py", "ece.py", "requirements.txt"])]
    assert "ece: https://huggingface.co/spaces/someorg/ece  ->  evaluate.load('someorg/ece')" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--namespace", "some/org", "--dry-run"], "`namespace`"),
        (["--namespace", "someorg", "--metrics", "ece,nope", "--dry-run"], "nope"),
        (["--namespace", "someorg", "--out", "x"], "--out and --overwrite only apply with --dry-run"),
        (["--namespace", "someorg", "--requirement", SPEC], "unreachable"),  # HF_HUB_OFFLINE=1 in the tests
    ],
)
def test_bad_input_is_one_line(capsys, tmp_path, monkeypatch, argv, message):
    import tempfile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where an unreachable Hub leaves the folders to upload
    code, _, err = _run(capsys, "push-metrics", *argv)
    assert code == 1 and message in err and err.count("\n") == 1, err
