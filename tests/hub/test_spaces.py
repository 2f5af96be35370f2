"""The metric scripts as evaluate Spaces: the folders ``build_metric_spaces`` writes load through evaluate's own Hub
loader (``evaluate.load("<org>/ece")``, its download URL pointed at those folders), ``push_metric_spaces`` creates and
uploads one Space per bundled script (HfApi intercepted), and a user's files are never replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hf_calibration import metric_path
from hf_calibration.hub import list_metric_scripts
from hf_calibration.hub import metric_scripts as metric_scripts_module
from hf_calibration.hub.spaces import build_metric_spaces, package_requirement, push_metric_spaces

SPEC = "hf-calibration @ git+https://github.com/someone/hf-calibration@v0.1.0"


@pytest.fixture
def hub_loader(monkeypatch):
    """evaluate's Hub loader with its download URL pointed at ``root/<org>/<name>/<file>`` (no network)."""
    import evaluate.config

    def point_at(root: Path) -> None:
        monkeypatch.setattr(evaluate.config, "HUB_EVALUATE_URL", str(root) + "/{path}/{name}")
        monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)  # no download counter request

    return point_at


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_space_folders_load_as_org_metrics_through_evaluate(tmp_path, hub_loader, monkeypatch):
    import evaluate
    from evaluate import loading
    from torchmetrics.classification import MulticlassCalibrationError

    folders = build_metric_spaces(tmp_path / "someorg", requirement=SPEC)
    assert sorted(folders) == list_metric_scripts() and {"ece", "adaece", "smce", "calibration"} <= set(folders)
    for name, folder in folders.items():
        shipped = _files(Path(metric_path(name)))
        published = _files(folder)
        assert set(published) == set(shipped) and {f"{name}.py", "README.md", "app.py", "requirements.txt"} <= set(
            published
        )
        assert published["requirements.txt"].decode() == SPEC + "\n"
        assert all(published[f] == shipped[f] for f in shipped if f != "requirements.txt")

    hub_loader(tmp_path)
    monkeypatch.chdir(tmp_path / "someorg")  # no ./someorg/ece/ece.py here: evaluate goes to its Hub loader
    used = []
    factory = loading.HubEvaluationModuleFactory
    monkeypatch.setattr(
        loading, "HubEvaluationModuleFactory", lambda name, **kw: used.append(name) or factory(name, **kw)
    )
    metric = evaluate.load("someorg/ece")
    assert used == ["someorg/ece"]
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(200, 4, generator=g, dtype=torch.float64), dim=1)
    labels = torch.randint(0, 4, (200,), generator=g)
    got = metric.compute(predictions=probs.numpy(), references=labels.numpy())["ece"]
    want = MulticlassCalibrationError(num_classes=4, n_bins=15, norm="l1")(probs, labels).item()
    assert got == pytest.approx(want, abs=1e-6)
    for name in list_metric_scripts():  # every Space's script loads the same way
        assert isinstance(evaluate.load(f"someorg/{name}"), evaluate.EvaluationModule) and used[-1] == f"someorg/{name}"


def test_every_bundled_script_is_published_new_ones_included(tmp_path, monkeypatch):
    """The Spaces follow the scripts the package ships (a metric added later is published without code changes)."""
    scripts = tmp_path / "scripts"
    shutil.copytree(Path(metric_path("ece")).parent, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(scripts / "ece", scripts / "later_metric")  # a metric the package does not ship (yet)
    (scripts / "later_metric" / "ece.py").rename(scripts / "later_metric" / "later_metric.py")
    monkeypatch.setattr(metric_scripts_module, "_HERE", scripts)
    folders = build_metric_spaces(tmp_path / "out", requirement=SPEC)
    assert "later_metric" in folders and (folders["later_metric"] / "later_metric.py").is_file()
    assert sorted(folders) == sorted(p.name for p in scripts.iterdir() if (p / f"{p.name}.py").is_file())


class _RecordingApi:
    calls: list = []

    def __init__(self, token=None, **kwargs):
        self.token = token

    def create_repo(self, repo_id, **kwargs):
        import huggingface_hub

        self.calls.append(("create_repo", repo_id, kwargs))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/spaces/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        self.calls.append(("upload_folder", repo_id, {**kwargs, "files": _files(Path(folder_path))}))
        return f"https://huggingface.co/spaces/{repo_id}/commit/0"


def test_push_creates_one_gradio_space_per_metric_and_uploads_its_folder(monkeypatch, tmp_path):
    import huggingface_hub

    _RecordingApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingApi)
    urls = push_metric_spaces("someorg", requirement=SPEC, private=True)
    names = list_metric_scripts()
    assert urls == {n: f"https://huggingface.co/spaces/someorg/{n}" for n in names}
    creates = [c for c in _RecordingApi.calls if c[0] == "create_repo"]
    uploads = [c for c in _RecordingApi.calls if c[0] == "upload_folder"]
    assert [c[1] for c in creates] == [f"someorg/{n}" for n in names] == [c[1] for c in uploads]
    for _, _, kwargs in creates:
        assert (
            kwargs["repo_type"] == "space"
            and kwargs["space_sdk"] == "gradio"
            and kwargs["private"] is True
            and kwargs["exist_ok"]
        )
    dry = build_metric_spaces(tmp_path / "dry", requirement=SPEC)
    for (_, _repo_id, kwargs), name in zip(uploads, names):
        assert kwargs["repo_type"] == "space" and kwargs["files"] == _files(dry[name])  # the dry run is the upload


def test_push_without_the_hub_says_so_and_keeps_the_folders(monkeypatch):
    """HF_HUB_OFFLINE=1 (the tests' setting): one sentence naming the folder that holds what was to be uploaded."""
    from hf_calibration._core.checkpoints import HubUnreachableError

    with pytest.raises(HubUnreachableError, match="unreachable") as info:
        push_metric_spaces("someorg", ["ece"], requirement=SPEC)
    kept = Path(str(info.value).rsplit("'", 2)[-2])
    assert (kept / "ece" / "ece.py").is_file()
    shutil.rmtree(kept)


def test_out_folder_never_replaces_a_users_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="new or empty folder"):
        build_metric_spaces(out, requirement=SPEC)
    with pytest.raises(ValueError, match="notes.txt"):
        build_metric_spaces(out, requirement=SPEC, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    fresh = tmp_path / "fresh"
    build_metric_spaces(fresh, ["ece"], requirement="old-spec")
    build_metric_spaces(fresh, ["ece"], requirement=SPEC, overwrite=True)  # an earlier call's folder is replaced
    assert (fresh / "ece" / "requirements.txt").read_text() == SPEC + "\n"
    (fresh / "ece" / "mine.py").write_text("x = 1")
    with pytest.raises(ValueError, match="mine.py"):
        build_metric_spaces(fresh, ["ece"], requirement=SPEC, overwrite=True)
    assert (fresh / "ece" / "mine.py").read_text() == "x = 1"
    scripts = Path(metric_path("ece")).parent
    before = _files(scripts)
    with pytest.raises(ValueError, match="__init__.py"):  # the package's own folder is not an earlier dry run
        build_metric_spaces(scripts, requirement=SPEC, overwrite=True)
    assert _files(scripts) == before


class _Dist:
    def __init__(self, version, direct_url=None):
        self.version, self._direct = version, direct_url

    def read_text(self, name):
        return None if self._direct is None else json.dumps(self._direct)


@pytest.mark.parametrize(
    "direct, want",
    [
        (None, "hf-calibration==1.2.3"),
        (
            {"url": "https://github.com/me/hf-calibration", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
            "hf-calibration @ git+https://github.com/me/hf-calibration@abc123",
        ),
        (
            {"url": "https://example.org/hf_calibration-1.2.3-py3-none-any.whl", "archive_info": {}},
            "hf-calibration @ https://example.org/hf_calibration-1.2.3-py3-none-any.whl",
        ),
    ],
)
def test_the_requirement_installs_the_code_installed_here(monkeypatch, direct, want):
    from importlib import metadata

    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist("1.2.3", direct))
    assert package_requirement() == want


def test_a_local_install_needs_an_explicit_requirement(monkeypatch, tmp_path):
    from importlib import metadata

    local = {"url": "file:///home/me/hf-calibration", "dir_info": {"editable": True}}
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist("1.2.3", local))
    with pytest.raises(ValueError, match="local folder file:///home/me/hf-calibration"):
        build_metric_spaces(tmp_path / "out")
    with pytest.raises(ValueError, match="`requirement`"):
        build_metric_spaces(tmp_path / "out", requirement="a\nb")
    with pytest.raises(ValueError, match="`names`"):
        build_metric_spaces(tmp_path / "out", ["nope"], requirement=SPEC)
    with pytest.raises(ValueError, match="`namespace`"):
        push_metric_spaces("some/org", requirement=SPEC)
    assert not (tmp_path / "out").exists()
