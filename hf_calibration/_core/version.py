"""The package version (the one place it is written: pyproject reads it from here) and the pip requirement that
installs the same code elsewhere (a Space, an Inference Endpoint)."""

from __future__ import annotations

import json
import logging

__version__ = "0.1.0"

DISTRIBUTION = "hf-calibration"

logger = logging.getLogger(__name__)


def package_requirement() -> str:
    """The pip requirement of this package as installed here, for a Space or an Endpoint to install the same code.

    An install from PyPI: ``hf-calibration==<version>``; from a VCS URL (``pip install git+https://...``): that URL
    at the installed commit; from an archive URL: that URL. An install from a local folder (a clone, editable or
    not) has no address another machine can reach: ``ValueError`` asking for an explicit requirement.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        logger.warning(
            "hf-calibration runs from a source tree, not an install: the requirement names PyPI's "
            "hf-calibration==%s (pass `requirement` to say otherwise).",
            __version__,
        )
        return f"{DISTRIBUTION}=={__version__}"
    direct = dist.read_text("direct_url.json")
    if not direct:
        return f"{DISTRIBUTION}=={dist.version}"
    origin = json.loads(direct)
    url = str(origin.get("url", ""))
    vcs = origin.get("vcs_info")
    if isinstance(vcs, dict) and url:
        return f"{DISTRIBUTION} @ {vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id') or vcs.get('requested_revision')}"
    if url and not url.startswith("file:"):
        return f"{DISTRIBUTION} @ {url}"
    raise ValueError(
        f"Expected an hf-calibration installed from PyPI or a URL, so that another machine can install the same code, "
        f"but it was installed from the local folder {url or '(unknown)'}: pass the requirement explicitly, e.g. "
        f"'hf-calibration @ git+https://github.com/<you>/hf-calibration@<tag>' (or 'hf-calibration=={dist.version}' "
        "once that version is on PyPI)."
    )
