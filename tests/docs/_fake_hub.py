"""A local stand-in for the Hugging Face Hub, for running the documentation's examples offline.

Uploads (``HfApi.create_commit`` / ``upload_folder`` / ``upload_file``, which ``push_to_hub`` of transformers,
of the calibrators and of the conformal predictors call) are written into huggingface_hub's cache exactly where
a download of that repo would put them (``models--owner--name/snapshots/<commit>/`` and ``refs/main``). With
``HF_HUB_OFFLINE=1`` every loader (``from_pretrained``, ``snapshot_download``, ``pipeline``) then reads them
through its ordinary offline path, so a page that pushes a repo and loads it back runs as written.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

COMMIT = "d0c5d0c5d0c5d0c5d0c5d0c5d0c5d0c5d0c5d0c5"  # one revision per repo: pushes accumulate in it
_REPO_FOLDER_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}


class FakeHub:
    """``install(monkeypatch)`` routes ``HfApi``'s upload methods here; ``reset()`` removes every repo it wrote."""

    def __init__(self) -> None:
        self.repos: set[Path] = set()
        self.commits: list[tuple[str, list[str]]] = []  # (repo_id, paths written), in order

    # ------------------------------------------------------------------ the cache layout a download would produce
    @staticmethod
    def cache_dir() -> Path:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)

    def snapshot(self, repo_id: str, repo_type: str | None = None) -> Path:
        repo_type = repo_type or "model"
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"The stand-in Hub takes repo ids 'owner/name', but got {repo_id!r}.")
        repo = self.cache_dir() / f"{_REPO_FOLDER_PREFIX[repo_type]}--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        self.repos.add(repo)
        return snapshot

    def reset(self) -> None:
        for repo in self.repos:
            shutil.rmtree(repo, ignore_errors=True)
        self.repos.clear()
        self.commits.clear()

    # ------------------------------------------------------------------ HfApi's methods
    def install(self, monkeypatch) -> None:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

        hub = self

        def create_repo(api, repo_id, *args, repo_type=None, **kwargs):
            hub.snapshot(repo_id, repo_type)
            return SimpleNamespace(repo_id=repo_id, url=f"https://huggingface.co/{repo_id}")

        def _write(repo_id, repo_type, operations):
            root = hub.snapshot(repo_id, repo_type)
            written = []
            for op in operations:
                target = root / op.path_in_repo.strip("/")
                if isinstance(op, CommitOperationDelete):
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
                    continue
                if not isinstance(op, CommitOperationAdd):
                    raise NotImplementedError(f"The stand-in Hub does not implement {type(op).__name__}.")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = op.path_or_fileobj
                if isinstance(source, (str, os.PathLike)):
                    shutil.copyfile(source, target)
                else:
                    target.write_bytes(source if isinstance(source, bytes) else source.read())
                written.append(op.path_in_repo)
            hub.commits.append((repo_id, written))
            return _CommitInfo(f"https://huggingface.co/{repo_id}/commit/{COMMIT}")

        def create_commit(api, repo_id, operations, *args, repo_type=None, **kwargs):
            return _write(repo_id, repo_type, list(operations))

        def upload_folder(api, *, repo_id, folder_path, path_in_repo=None, repo_type=None, **kwargs):
            folder = Path(folder_path)
            prefix = (path_in_repo or "").strip("/")
            ops = [
                CommitOperationAdd(
                    path_or_fileobj=str(p), path_in_repo=f"{prefix}/{p.relative_to(folder).as_posix()}".lstrip("/")
                )
                for p in sorted(folder.rglob("*"))
                if p.is_file()
            ]
            return _write(repo_id, repo_type, ops)

        def upload_file(api, *, path_or_fileobj, path_in_repo, repo_id, repo_type=None, **kwargs):
            source = path_or_fileobj if not isinstance(path_or_fileobj, io.IOBase) else path_or_fileobj.read()
            return _write(repo_id, repo_type, [CommitOperationAdd(path_or_fileobj=source, path_in_repo=path_in_repo)])

        for name, fn in {
            "create_repo": create_repo,
            "create_commit": create_commit,
            "upload_folder": upload_folder,
            "upload_file": upload_file,
        }.items():
            monkeypatch.setattr(HfApi, name, fn)

    def files(self, repo_id: str, repo_type: str | None = None) -> list[str]:
        """Every file of the repo, as paths inside it (sorted)."""
        root = self.snapshot(repo_id, repo_type)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class _CommitInfo(str):
    """What ``create_commit`` returns: the commit URL, as huggingface_hub's ``CommitInfo`` (a ``str``) is."""

    @property
    def commit_url(self) -> str:
        return str(self)

    oid = COMMIT
    pr_url = None
