"""``hf-calibration push-metrics``: publish the bundled ``evaluate`` metric scripts as Hub Spaces (``<org>/ece``, ...)."""

from __future__ import annotations

import argparse

from hf_calibration.cli._common import CLIError

HELP = "publish the metric scripts as evaluate Spaces (<org>/ece, ...)"
DESCRIPTION = """Create one Space per bundled metric script (ece, adaece, smce, calibration, ...) under --namespace and upload its
folder (script, metric card, app.py, and a requirements.txt that installs this version of hf-calibration), so that
evaluate.load('<org>/ece') works online. --dry-run writes the exact folders into --out and uploads nothing.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namespace", required=True, metavar="ORG", help="Hub user or organisation that will own the Spaces"
    )
    p.add_argument("--metrics", metavar="A,B", help="comma-separated metric names (default: every bundled script)")
    p.add_argument(
        "--requirement",
        metavar="SPEC",
        help="the pip requirement written to requirements.txt (default: this install's, e.g. hf-calibration==0.1.0; "
        "needed when the package was installed from a local folder)",
    )
    p.add_argument(
        "--private", action="store_true", default=None, help="create the Spaces as private (new Spaces only)"
    )
    p.add_argument(
        "--dry-run",
        "--dry_run",
        dest="dry_run",
        action="store_true",
        help="write the folders into --out, upload nothing",
    )
    p.add_argument("--out", metavar="DIR", help="with --dry-run: where to write (default ./metric_spaces)")
    p.add_argument(
        "--overwrite", action="store_true", help="with --dry-run: replace the folders an earlier dry run wrote in --out"
    )


def run(args) -> int:
    from hf_calibration.hub.spaces import build_metric_spaces, check_namespace, push_metric_spaces

    names = [n.strip() for n in args.metrics.split(",") if n.strip()] if args.metrics else None
    if args.metrics is not None and not names:
        raise CLIError("--metrics names no metric.")
    namespace = check_namespace(args.namespace)
    if not args.dry_run:
        if args.overwrite or args.out is not None:
            raise CLIError("--out and --overwrite only apply with --dry-run.")
        urls = push_metric_spaces(namespace, names, requirement=args.requirement, private=args.private)
        for name, url in urls.items():
            print(f"{name}: {url}  ->  evaluate.load({f'{namespace}/{name}'!r})")
        return 0
    folders = build_metric_spaces(
        "metric_spaces" if args.out is None else args.out, names, requirement=args.requirement, overwrite=args.overwrite
    )
    for name, folder in folders.items():
        files = ", ".join(sorted(p.name for p in folder.iterdir()))
        print(f"{namespace}/{name}: {folder} ({files})")
    print(
        f"Dry run: nothing uploaded. Without --dry-run each folder becomes the Space <namespace>/<name>, "
        f"loaded with evaluate.load({f'{namespace}/{next(iter(folders))}'!r})."
    )
    return 0
